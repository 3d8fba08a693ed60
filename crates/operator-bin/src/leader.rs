//! The `leader-election` cell: which of the operators running may write.
//!
//! - **Owns** the `coordination.k8s.io/v1` Lease `leader-election-namespace`/
//!   `leader-election-lease-name` (`kube-system/cellium-operator`), through the job
//!   `leader-election.lease`.
//! - **Provides** `Arc<Leadership>`: [`Leadership::is_leader`], a watch the other cells wait
//!   on before they write, and that turns false when leadership is lost.
//! - **Depends on** the `k8s-client` module.
//! - **Config keys**: see [`LeaderElectionConfig`].
//! - **Degraded** (`leader-election.lease`) while the Lease cannot be read or written; OK,
//!   saying who leads, otherwise.
//!
//! The protocol is client-go's `leaderelection` over a Lease, which Cilium's operator uses:
//! every `leader-election-retry-period` each operator reads the Lease. Its holder writes a
//! new `renewTime`. Another takes it (`holderIdentity` set to itself, `leaseTransitions` + 1,
//! a PUT carrying the resourceVersion read, so that of two candidates only one wins) when
//! nobody holds it, or when the record it read has not changed for the Lease's
//! `leaseDurationSeconds` of its own clock: a clock that differs between machines never
//! shortens a lease. A leader that could not renew for `leader-election-renew-deadline`
//! (shorter than the lease duration) stops acting as leader before any other may start. On
//! stop, a leader clears `holderIdentity`, so that another takes over at its next try rather
//! than a lease duration later.
//!
//! Why a module of the operator rather than a cell crate: only the operator elects a leader;
//! it becomes a crate of its own when a second binary needs one.

use std::sync::Arc;
use std::time::Duration;

use cellium_hive::{Config, JobContext, Jobs, Module};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::Client;
use crate::config::LeaderElectionConfig;
use crate::error::{Error, Result, chain};

/// The job's name, under the module: `leader-election.lease`.
const JOB: &str = "lease";

/// Whether this operator leads, as a watch.
#[derive(Debug)]
pub struct Leadership {
    id: String,
    lease: String,
    tx: watch::Sender<bool>,
}

impl Leadership {
    /// The cell's constructor: checks the timing and adds the job.
    pub fn new(
        cfg: Config<LeaderElectionConfig>,
        client: Arc<Client>,
        jobs: Jobs,
    ) -> Result<Arc<Leadership>> {
        validate(&cfg)?;
        let id = cfg.operator_id.clone().unwrap_or_else(default_id);
        let leadership = Arc::new(Leadership {
            lease: format!(
                "{}/{}",
                cfg.leader_election_namespace, cfg.leader_election_lease_name
            ),
            id,
            tx: watch::channel(false).0,
        });
        let elector = leadership.clone();
        let cfg = (*cfg).clone();
        jobs.one_shot(JOB, move |ctx| {
            let elector = Elector {
                leadership: elector.clone(),
                client: client.clone(),
                cfg: cfg.clone(),
                observed: None,
            };
            async move {
                elector.run(ctx).await;
                Ok(())
            }
        })
        .add();
        Ok(leadership)
    }

    /// This operator's name in the Lease.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this operator leads now, as a watch: true from a successful acquisition or
    /// renewal, false once a renewal deadline passed, the Lease went to another, or the
    /// operator stops.
    ///
    /// Trap: a value read is already old. A cell checks it before each write and stops
    /// writing when it turns false; the renew deadline, shorter than the lease duration, is
    /// what keeps an old and a new leader's writes from overlapping.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use cellium_operator::Leadership;
    /// use cellium_operator::leader::{wait_leader, wait_lost};
    ///
    /// async fn work_while_leading(leadership: Arc<Leadership>) {
    ///     let mut rx = leadership.is_leader();
    ///     while wait_leader(&mut rx).await {
    ///         let mut lost = leadership.is_leader();
    ///         tokio::select! {
    ///             _ = wait_lost(&mut lost) => {}          // stop writing at once
    ///             _ = std::future::pending::<()>() => {}  // the leader's work
    ///         }
    ///     }
    /// }
    /// ```
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Whether this operator leads at this moment.
    pub fn leading(&self) -> bool {
        *self.tx.borrow()
    }

    fn set(&self, leading: bool) {
        let changed = self
            .tx
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
        if changed && leading {
            tracing::info!(id = %self.id, lease = %self.lease, "leading");
        } else if changed {
            tracing::warn!(id = %self.id, lease = %self.lease, "no longer leading");
        }
    }
}

/// Resolves once `rx` says true; false when its sender is gone (the operator stops).
pub async fn wait_leader(rx: &mut watch::Receiver<bool>) -> bool {
    rx.wait_for(|l| *l).await.is_ok()
}

/// Resolves once `rx` says false (or its sender is gone).
pub async fn wait_lost(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|l| !*l).await;
}

/// The `leader-election` module.
pub fn cell() -> Module {
    Module::new(
        "leader-election",
        "Elects one leader among the operators on a coordination.k8s.io Lease; only the leader writes",
    )
    .config::<LeaderElectionConfig>()
    .provide(Leadership::new)
}

fn validate(cfg: &LeaderElectionConfig) -> Result<()> {
    let bad = |key, reason: &str| {
        Err(Error::Config {
            key,
            reason: reason.into(),
        })
    };
    if cfg.leader_election_lease_name.is_empty() {
        return bad("leader-election-lease-name", "must not be empty");
    }
    if cfg.leader_election_namespace.is_empty() {
        return bad("leader-election-namespace", "must not be empty");
    }
    if cfg.leader_election_lease_duration < Duration::from_secs(1) {
        return bad("leader-election-lease-duration", "must be at least 1s");
    }
    if cfg.leader_election_renew_deadline >= cfg.leader_election_lease_duration {
        return bad(
            "leader-election-renew-deadline",
            "must be shorter than leader-election-lease-duration, so that a leader stops before another may start",
        );
    }
    if cfg.leader_election_retry_period.is_zero()
        || cfg.leader_election_retry_period >= cfg.leader_election_renew_deadline
    {
        return bad(
            "leader-election-retry-period",
            "must be above zero and shorter than leader-election-renew-deadline",
        );
    }
    if cfg.operator_id.as_deref() == Some("") {
        return bad("operator-id", "must not be empty");
    }
    Ok(())
}

/// The host name and the process id: two replicas differ even on one machine.
fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cellium-operator".into());
    format!("{host}-{}", std::process::id())
}

/// What one try found.
enum Outcome {
    Leading,
    Following(String),
}

/// The job's state.
struct Elector {
    leadership: Arc<Leadership>,
    client: Arc<Client>,
    cfg: LeaderElectionConfig,
    /// The Lease's resourceVersion last read, and when it was first read: the clock a lease
    /// held by another is measured on.
    observed: Option<(String, Instant)>,
}

impl Elector {
    async fn run(mut self, ctx: JobContext) {
        let reporter = ctx.reporter().clone();
        let lease = self.leadership.lease.clone();
        let mut renewed: Option<Instant> = None;
        loop {
            // A leader loses at its deadline even while a request hangs.
            let deadline = renewed.map(|r| r + self.cfg.leader_election_renew_deadline);
            let lost = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            // A renewal counts from when it was sent, not from its answer: the write took
            // effect in between, and others count their wait from no earlier than that.
            let attempt = Instant::now();
            let outcome = tokio::select! {
                _ = ctx.cancelled() => break,
                _ = lost => {
                    tracing::error!(%lease, "not renewed within leader-election-renew-deadline");
                    reporter.degraded(format!("Lease {lease} not renewed in time: not leading"));
                    self.leadership.set(false);
                    renewed = None;
                    continue;
                }
                r = self.try_once() => r,
            };
            match outcome {
                Ok(Outcome::Leading) => {
                    renewed = Some(attempt);
                    self.leadership.set(true);
                    reporter.ok(format!(
                        "leading: Lease {lease} held by {}",
                        self.leadership.id
                    ));
                }
                Ok(Outcome::Following(holder)) => {
                    renewed = None;
                    self.leadership.set(false);
                    reporter.ok(if holder.is_empty() {
                        format!("Lease {lease} free; trying")
                    } else {
                        format!("following: Lease {lease} held by {holder}")
                    });
                }
                Err(e) => {
                    let msg = chain(&e);
                    tracing::warn!(%lease, "{msg}");
                    reporter.degraded(msg);
                }
            }
            tokio::select! {
                _ = ctx.cancelled() => break,
                _ = tokio::time::sleep(self.cfg.leader_election_retry_period) => {}
            }
        }
        if self.leadership.leading() {
            // The other cells stopped before this one (they depend on it); say so first,
            // then hand the Lease over.
            self.leadership.set(false);
            let release =
                tokio::time::timeout(self.cfg.leader_election_renew_deadline, self.release());
            match release.await {
                Ok(Ok(())) => tracing::info!(%lease, "Lease released"),
                Ok(Err(e)) => tracing::warn!(%lease, "cannot release: {}", chain(&e)),
                Err(_) => tracing::warn!(%lease, "cannot release: timed out"),
            }
        }
    }

    fn api(&self, client: kube::Client) -> Api<Lease> {
        Api::namespaced(client, &self.cfg.leader_election_namespace)
    }

    /// Reads the Lease once and acquires, renews or follows.
    async fn try_once(&mut self) -> Result<Outcome> {
        let api = self.api(self.client.get().await?);
        let name = &self.cfg.leader_election_lease_name;
        let what = |verb: &str| format!("{verb} Lease {}", self.leadership.lease);
        let me = self.leadership.id.clone();
        let now = MicroTime(Timestamp::now());
        let duration =
            i32::try_from(self.cfg.leader_election_lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = api
            .get_opt(name)
            .await
            .map_err(Error::api(what("reading")))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.cfg.leader_election_namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Outcome::Leading),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Following(String::new())),
                Err(e) => Err(Error::api(what("creating"))(e)),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let observed_at = match &self.observed {
            Some((seen, at)) if *seen == rv => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((rv, at));
                at
            }
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == me {
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(duration);
            return match api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(Outcome::Leading),
                Err(e) => Err(Error::api(what("renewing"))(e)),
            };
        }
        let held_for = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.cfg.leader_election_lease_duration, Duration::from_secs);
        if !holder.is_empty() && observed_at.elapsed() < held_for {
            return Ok(Outcome::Following(holder));
        }
        spec.holder_identity = Some(me);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration);
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => {
                tracing::info!(previous = %holder, "Lease taken over");
                Ok(Outcome::Leading)
            }
            // Another candidate won the same race.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Following(holder)),
            Err(e) => Err(Error::api(what("acquiring"))(e)),
        }
    }

    /// Clears `holderIdentity` if this operator still holds the Lease.
    async fn release(&self) -> Result<()> {
        let api = self.api(self.client.get().await?);
        let what = format!("releasing Lease {}", self.leadership.lease);
        let name = &self.cfg.leader_election_lease_name;
        let Some(mut lease) = api.get_opt(name).await.map_err(Error::api(what.clone()))? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.leadership.id.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        api.replace(name, &PostParams::default(), &lease)
            .await
            .map_err(Error::api(what))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_that_cannot_work_names_its_key() {
        assert!(validate(&LeaderElectionConfig::default()).is_ok());
        let cfg = LeaderElectionConfig {
            leader_election_renew_deadline: Duration::from_secs(20),
            ..Default::default()
        };
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(err.starts_with("leader-election-renew-deadline:"), "{err}");
        let cfg = LeaderElectionConfig {
            leader_election_retry_period: Duration::from_secs(10),
            ..Default::default()
        };
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(err.starts_with("leader-election-retry-period:"), "{err}");
    }
}

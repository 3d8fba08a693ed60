//! Regenerating endpoints when what their identity or policy derives from changes, and
//! retrying, with backoff, until every endpoint is regenerated.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cellium_hive::{Backoff, JobContext, Jobs, Trigger};
use cellium_identity::Identities;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::task::AbortHandle;
use tokio_stream::wrappers::{BroadcastStream, WatchStream};

use super::{Backends, EndpointManager};
use crate::endpoint::{Endpoint, State};
use crate::error::{Error, Result, chain};

/// How long a failed regeneration waits before the next attempt: from 100 ms, doubling, up
/// to 30 s, for as long as it fails.
const RETRY: Backoff = Backoff {
    min: Duration::from_millis(100),
    max: Duration::from_secs(30),
    factor: 2.0,
    max_retries: None,
};

/// The regeneration component: the trigger of the `regenerate` job, and what a
/// regeneration still owes an endpoint beyond its policy.
#[derive(Debug, Default)]
pub(crate) struct Regeneration {
    /// Pulled by every change an endpoint derives from, by the retry, and by the restore.
    pub(crate) trigger: Trigger,
    /// Restored endpoints still running the previous agent's programs: attaching failed.
    unattached: Mutex<BTreeSet<u16>>,
    /// Endpoints whose record is older than their identity: writing it failed.
    unsaved: Mutex<BTreeSet<u16>>,
}

impl Regeneration {
    /// Endpoint `id` needs its programs attached by this agent.
    pub(crate) fn needs_attach(&self, id: u16) {
        lock(&self.unattached).insert(id);
    }

    /// Endpoint `id` needs its record written.
    pub(crate) fn needs_save(&self, id: u16) {
        lock(&self.unsaved).insert(id);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one pass did.
#[derive(Debug, Default)]
pub(crate) struct Pass {
    /// Endpoints regenerated.
    pub(crate) done: usize,
    /// Endpoints that failed, described, with why.
    pub(crate) failed: Vec<(String, String)>,
}

impl Pass {
    /// The health message of a pass with failures: every endpoint that failed, and why.
    fn failure(&self, retry_in: Duration) -> String {
        let each: Vec<String> = self
            .failed
            .iter()
            .map(|(ep, why)| format!("{ep}: {why}"))
            .collect();
        format!(
            "{} of {} endpoints not regenerated, retrying in {retry_in:?}: {}",
            self.failed.len(),
            self.done + self.failed.len(),
            each.join(" | ")
        )
    }
}

/// Starts two jobs: `watch-changes` turns every policy revision, every change of the
/// NetworkPolicy ipBlock prefixes, every pod or namespace event and every identity number
/// retired (`Identities::retire`) into a trigger, and
/// `regenerate` (run only when triggered; triggers coalesce, so a burst of changes costs one
/// pass) recomputes every endpoint's labels, identity and policy and writes what differs.
///
/// A pass in which an endpoint fails turns the job Degraded, naming each endpoint and why,
/// and pulls the trigger again after a backoff: failures are retried until a pass succeeds,
/// not left for the next change.
///
/// An agent without a policy repository or resources watches what it has; with neither,
/// nothing an endpoint derives from changes, there is no `watch-changes` job, and
/// `regenerate` runs only for the restore and its retries.
pub(crate) fn start(
    jobs: &Jobs,
    manager: Arc<EndpointManager>,
    policy: Option<&PolicyRepository>,
    resources: Option<&Resources>,
    identities: Option<&Identities>,
) {
    let trigger = manager.regeneration.trigger.clone();
    let pull = trigger.clone();
    let signals = signals(policy, resources, identities);
    if !signals.is_empty() {
        jobs.observer(
            "watch-changes",
            futures::stream::select_all(signals),
            move |(), _ctx| {
                pull.trigger();
                async { Ok(()) }
            },
        )
        .add();
    }
    let retry = Arc::new(Retry::default());
    jobs.timer("regenerate", Duration::ZERO, move |ctx| {
        let manager = manager.clone();
        let retry = retry.clone();
        async move {
            let started = Instant::now();
            let pass = manager.regenerate_all().await;
            if pass.failed.is_empty() {
                retry.reset();
                let enforced = match manager.enforcement.revision() {
                    Some(revision) => format!("at revision {revision}"),
                    None => "enforcing no policy (no policy repository)".to_string(),
                };
                ctx.reporter().ok(format!(
                    "{} endpoints {enforced} ({:.1?})",
                    pass.done,
                    started.elapsed()
                ));
                return Ok(());
            }
            let delay = retry.schedule(&manager.regeneration.trigger, &ctx);
            Err(pass.failure(delay).into())
        }
    })
    .trigger(trigger)
    .add();
}

/// The pending retry of failed regenerations.
#[derive(Debug, Default)]
struct Retry {
    /// Failed passes in a row.
    attempts: AtomicU32,
    pending: Mutex<Option<AbortHandle>>,
}

impl Retry {
    /// Pulls `trigger` after the backoff of one more failed pass; returns the delay.
    fn schedule(&self, trigger: &Trigger, ctx: &JobContext) -> Duration {
        let attempts = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let delay = RETRY.delay(attempts);
        let (trigger, ctx) = (trigger.clone(), ctx.clone());
        let task = tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => trigger.trigger(),
                () = ctx.cancelled() => {}
            }
        });
        // A pass that ran meanwhile (another trigger) made the older retry moot.
        if let Some(older) = lock(&self.pending).replace(task.abort_handle()) {
            older.abort();
        }
        delay
    }

    /// A pass succeeded: the next failure starts from the shortest delay.
    fn reset(&self) {
        self.attempts.store(0, Ordering::SeqCst);
        if let Some(pending) = lock(&self.pending).take() {
            pending.abort();
        }
    }
}

/// Streams of one `()` per change of anything an endpoint derives from, of the sources the
/// agent has.
fn signals(
    policy: Option<&PolicyRepository>,
    resources: Option<&Resources>,
    identities: Option<&Identities>,
) -> Vec<BoxStream<'static, ()>> {
    let unit = |_| ();
    let mut streams = Vec::new();
    if let Some(identities) = identities {
        // A number retired (the cluster gave it to other labels): its holders move.
        streams.push(
            WatchStream::from_changes(identities.retirements())
                .map(unit)
                .boxed(),
        );
    }
    if let Some(policy) = policy {
        streams.push(
            WatchStream::from_changes(policy.changes())
                .map(unit)
                .boxed(),
        );
        streams.push(
            WatchStream::from_changes(policy.cidr_label_changes())
                .map(unit)
                .boxed(),
        );
    }
    if let Some(resources) = resources {
        streams.push(
            BroadcastStream::new(resources.pods.subscribe())
                .map(|_| ())
                .boxed(),
        );
        streams.push(
            BroadcastStream::new(resources.namespaces.subscribe())
                .map(|_| ())
                .boxed(),
        );
    }
    streams
}

impl EndpointManager {
    /// Regenerates every ready endpoint, each under its own lock (so a concurrent create or
    /// delete of it is never undone).
    pub(crate) async fn regenerate_all(&self) -> Pass {
        let mut pass = Pass::default();
        let Ok(b) = self.backends().cloned() else {
            return pass;
        };
        for listed in self.snapshot() {
            let _serial = self.endpoints.lock(listed.key()).await;
            let Some(ep) = self.endpoints.find(&listed.container_id, &listed.ifname) else {
                continue;
            };
            if ep.state != State::Ready {
                continue;
            }
            // A new label set may need its cluster-wide number first (crd mode); a failure
            // shows as the regeneration's error below, and is retried with it.
            if let Err(e) = self.identity.resolve(&ep).await {
                tracing::debug!(endpoint = %ep.describe(), error = %chain(&e), "identity not numbered yet");
            }
            match self.regenerate(&b, &ep) {
                Ok(()) => pass.done += 1,
                Err(e) => {
                    let why = chain(&e);
                    tracing::warn!(endpoint = %ep.describe(), error = %why, "regeneration failed");
                    pass.failed.push((ep.describe(), why));
                }
            }
        }
        pass
    }

    /// Brings one endpoint's labels, identity and enforcement up to date, then what an
    /// earlier attempt left owing (its programs, its record). Idempotent: a retry resumes
    /// where the failure stopped.
    pub(crate) fn regenerate(&self, b: &Backends, ep: &Arc<Endpoint>) -> Result<()> {
        let ep = self.relabel(ep)?;
        self.enforce_and_settle(b, &ep)
    }

    /// Derives the endpoint's labels again and, when they changed (or it has no identity
    /// yet, or its number was retired: the cluster gave it to other labels), gives it the
    /// identity of the labels; returns the endpoint as it is now.
    fn relabel(&self, ep: &Arc<Endpoint>) -> Result<Arc<Endpoint>> {
        if self.identity.is_current(ep, &self.identity.labels(ep)) {
            return Ok(ep.clone());
        }
        let mut ep = Endpoint::clone(ep);
        if self.identity.identify(&mut ep)? {
            // The table follows what is claimed before anything else can fail: a retry
            // must start from the identity now held, or it would give the old one back
            // twice.
            self.endpoints.insert(ep.clone());
            // What is derived from the endpoint list (its CiliumEndpoint) shows the identity.
            self.endpoints.changed();
            self.regeneration.needs_save(ep.id);
            tracing::info!(endpoint = %ep.describe(), identity = ep.identity, "identity changed");
        }
        Ok(Arc::new(ep))
    }

    /// Makes the datapath enforce the endpoint's policy at the current revision, then
    /// settles what an earlier attempt left owing: its programs attached, its record written.
    pub(crate) fn enforce_and_settle(&self, b: &Backends, ep: &Endpoint) -> Result<()> {
        self.enforcement.enforce(&*b.datapath, ep)?;
        self.settle(b, ep)
    }

    /// Settles what an earlier attempt left owing: the endpoint's programs attached, its
    /// record written.
    pub(crate) fn settle(&self, b: &Backends, ep: &Endpoint) -> Result<()> {
        if lock(&self.regeneration.unattached).contains(&ep.id) {
            // Replaces the previous agent's programs atomically: never a moment without.
            b.datapath
                .attach(ep.host_ifindex)
                .map_err(|source| Error::Datapath {
                    endpoint: ep.describe(),
                    source,
                })?;
            lock(&self.regeneration.unattached).remove(&ep.id);
        }
        if lock(&self.regeneration.unsaved).contains(&ep.id) {
            self.store.save(ep)?;
            lock(&self.regeneration.unsaved).remove(&ep.id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cellium_hive::{Hive, Level, Module};

    use super::*;
    use crate::testing::Harness;

    /// Runs the manager's jobs in a hive of their own; returns it (stop it at the end).
    async fn jobs_of(h: &Harness) -> Hive {
        let manager = h.manager.clone();
        let (policy, resources, identities) =
            (h.policy.clone(), h.resources.clone(), h.identities.clone());
        let mut hive = Hive::new([Module::new("endpoint-manager", "jobs under test")
            .invoke(move |jobs: Jobs| {
                start(
                    &jobs,
                    manager.clone(),
                    Some(&policy),
                    Some(&resources),
                    Some(&identities),
                )
            })
            .into()]);
        hive.start().await.unwrap();
        hive
    }

    #[tokio::test]
    async fn a_failed_regeneration_is_retried_until_it_succeeds_and_named_meanwhile() {
        let h = Harness::new();
        h.start().await.unwrap();
        let a = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        let mut hive = jobs_of(&h).await;
        let health = hive.health();
        h.faults.fail("write_endpoint", 3);
        // The pod is relabelled: a new identity, to be written into the datapath.
        h.pod_request("a", "a", "db");

        let mut seen = Vec::new();
        let began = Instant::now();
        let fixed = loop {
            let node = health.node("endpoint-manager.regenerate").unwrap();
            if seen.last() != Some(&node.status.message) {
                seen.push(node.status.message.clone());
            }
            let identity = h.manager.get(a.id).unwrap().identity;
            let entry = h.datapath.entries()[&a.addresses[0].ip];
            if node.status.level == Level::Ok
                && identity != a.identity
                && entry.identity == identity
            {
                break true;
            }
            if began.elapsed() > Duration::from_secs(10) {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(fixed, "never regenerated: {seen:#?}");
        let degraded = seen
            .iter()
            .find(|m| m.contains("not regenerated"))
            .unwrap_or_else(|| panic!("never Degraded: {seen:#?}"));
        assert!(degraded.contains("endpoint 1 (default/a): "), "{degraded}");
        assert!(degraded.contains("injected failure"), "{degraded}");
        assert!(degraded.contains("retrying in"), "{degraded}");
        let attempts = h.journal.only(&["write_endpoint 1"]).len();
        assert!(attempts >= 4, "three failures and a success: {attempts}");
        hive.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_new_identity_moves_the_change_counter() {
        let h = Harness::new();
        h.start().await.unwrap();
        let a = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        let mut changes = h.manager.changes();
        changes.borrow_and_update();
        h.manager.regenerate_all().await;
        assert!(
            !changes.has_changed().unwrap(),
            "a regeneration that changes nothing is no change"
        );
        // The pod is relabelled: a new identity, which readers of the list must see.
        h.pod_request("a", "a", "db");
        h.manager.regenerate_all().await;
        assert!(changes.has_changed().unwrap());
        assert_ne!(h.manager.get(a.id).unwrap().identity, a.identity);
    }

    #[tokio::test]
    async fn endpoints_whose_number_is_retired_move_to_a_new_one_when_told() {
        let h = Harness::new();
        h.start().await.unwrap();
        let a = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        let b = h
            .manager
            .create(h.pod_request("b", "b", "web"))
            .await
            .unwrap();
        assert_eq!(a.identity, b.identity);
        let mut hive = jobs_of(&h).await;
        let labels = h.identities.get(a.identity).unwrap().labels.clone();
        // The cluster gave the number to other labels.
        assert!(h.identities.retire(a.identity, &labels));
        let began = Instant::now();
        let moved = loop {
            let (ma, mb) = (h.manager.get(a.id).unwrap(), h.manager.get(b.id).unwrap());
            if ma.identity != a.identity
                && mb.identity == ma.identity
                && h.datapath.entries()[&a.addresses[0].ip].identity == ma.identity
                && h.datapath.entries()[&b.addresses[0].ip].identity == ma.identity
            {
                break Some(ma.identity);
            }
            if began.elapsed() > Duration::from_secs(10) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let moved = moved.expect("both endpoints move to one new number");
        assert_eq!(h.identities.lookup(&labels).unwrap().id, moved);
        assert!(
            h.identities.get(a.identity).is_none(),
            "the retired number went with its last holder"
        );
        hive.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_restored_endpoint_whose_programs_cannot_be_attached_is_kept_and_retried() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let a = h.manager.create(h.request("a")).await.unwrap();
        h.restart(&["10.244.0.0/24"]);
        h.faults.fail("attach", 1);
        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("1 endpoints restored, 0 removed"),
            "{summary}"
        );
        assert_eq!(
            h.interfaces.links(),
            vec![a.host_ifname.clone()],
            "its pod keeps its link"
        );
        assert!(
            h.datapath.attachments().contains(&a.host_ifindex),
            "and its programs"
        );
        h.journal.clear();
        let pass = h.manager.regenerate_all().await;
        assert!(pass.failed.is_empty(), "{:?}", pass.failed);
        assert_eq!(
            h.journal.only(&["attach "]),
            [format!("attach {}", a.host_ifindex)]
        );
        h.journal.clear();
        h.manager.regenerate_all().await;
        assert!(h.journal.only(&["attach "]).is_empty(), "attached once");
    }
}

//! The `cluster-pool` cell: pod CIDRs for every CiliumNode, as Cilium's operator hands them
//! out in `ipam: cluster-pool` mode.
//!
//! - **Owns** `spec.ipam.podCIDRs` and `status.ipam.operator-status.error` of every
//!   CiliumNode, through the job `cluster-pool.ciliumnodes`, which runs while this operator
//!   leads.
//! - **Provides** nothing; its invoke starts the job.
//! - **Depends on** `k8s-client` and `leader-election`.
//! - **Config keys**: see [`ClusterPoolConfig`]. With no pool configured the cell does
//!   nothing (and says so in its health).
//! - **Degraded** (`cluster-pool.ciliumnodes`) while the CiliumNodes cannot be watched or a
//!   write fails (retried after 1 s, doubling up to 30 s, from a fresh list).
//!
//! Each time this operator becomes leader it lists every CiliumNode and, before handing out
//! anything, occupies the CIDRs they already have, in the order the nodes were created: a
//! restarted operator, or a new leader, starts from what is written, never from memory. A
//! CIDR that a node claims while an older node holds it is a conflict, written to the later
//! node's `status.ipam.operator-status.error`; its spec is left alone (its agent may use the
//! CIDR already). Then each node without a CIDR of a family that has a pool gets the first
//! free one in `spec.ipam.podCIDRs`; when none is left, the node's status says so. After the
//! list, the watch's changes are handled one at a time, and a deleted node's CIDRs go back to
//! the pool.
//!
//! Every spec write carries the resourceVersion read, so a node changed meanwhile is not
//! overwritten: the change's own event brings it back here. A CIDR given to a node whose
//! write did not land stays the node's, and is written again at its next event.

mod pool;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cellium_hive::{Backoff, BoxError, Config, JobContext, Jobs, Module};
use futures::StreamExt;
use ipnet::IpNet;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};

use crate::client::{Client, Kind, field};
use crate::config::ClusterPoolConfig;
use crate::error::{Error, Result, chain};
use crate::leader::{Leadership, wait_leader, wait_lost};
use pool::{Assignment, ClusterPool};

/// The job's name, under the module: `cluster-pool.ciliumnodes`.
const JOB: &str = "ciliumnodes";

/// The delay before a failed job lists again: from 1 s, doubling, up to 30 s.
const BACKOFF: Backoff = Backoff {
    min: Duration::from_secs(1),
    max: Duration::from_secs(30),
    factor: 2.0,
    max_retries: None,
};

/// The `cluster-pool` module.
pub fn cell() -> Module {
    Module::new(
        "cluster-pool",
        "Hands out pod CIDRs from the cluster's pools to CiliumNodes, while this operator leads",
    )
    .config::<ClusterPoolConfig>()
    .invoke(start)
}

/// The invoke: checks the pools and adds the job.
fn start(
    cfg: Config<ClusterPoolConfig>,
    client: Arc<Client>,
    leadership: Arc<Leadership>,
    jobs: Jobs,
) -> Result<()> {
    let template = ClusterPool::new(&cfg)?;
    if template.is_empty() {
        tracing::info!(
            "no cluster-pool-ipv4-cidr or cluster-pool-ipv6-cidr: no pod CIDRs handed out"
        );
        return Ok(());
    }
    let ipam = Arc::new(Allocator {
        template,
        client,
        leadership,
    });
    jobs.one_shot(JOB, move |ctx| {
        let ipam = ipam.clone();
        async move { ipam.run(ctx).await }
    })
    .retry(BACKOFF)
    .add();
    Ok(())
}

struct Allocator {
    template: ClusterPool,
    client: Arc<Client>,
    leadership: Arc<Leadership>,
}

impl Allocator {
    /// Waits to lead, then allocates until leadership is lost; again and again.
    async fn run(&self, ctx: JobContext) -> Result<(), BoxError> {
        let reporter = ctx.reporter();
        let mut leader = self.leadership.is_leader();
        loop {
            if !self.leadership.leading() {
                reporter.ok("not leading: nothing handed out");
            }
            tokio::select! {
                _ = ctx.cancelled() => return Ok(()),
                led = wait_leader(&mut leader) => if !led { return Ok(()) },
            }
            let mut lost = self.leadership.is_leader();
            tokio::select! {
                _ = ctx.cancelled() => return Ok(()),
                _ = wait_lost(&mut lost) => {
                    tracing::info!("leadership lost: no more pod CIDRs handed out");
                }
                r = self.session(&ctx) => {
                    if let Err(e) = r {
                        let msg = chain(&e);
                        tracing::warn!("{msg}");
                        return Err(msg.into());
                    }
                    return Ok(());
                }
            }
        }
    }

    /// One leadership's work: list, occupy, then follow the watch.
    async fn session(&self, ctx: &JobContext) -> Result<()> {
        let reporter = ctx.reporter();
        let api = self.client.api(Kind::CiliumNode).await?;
        let mut pool = self.template.clone();
        let mut initial: Vec<DynamicObject> = Vec::new();
        let mut synced = false;
        // The nodes refused (a conflict, an exhausted pool), as last seen.
        let mut waiting: BTreeMap<String, DynamicObject> = BTreeMap::new();
        // The watcher relists by itself after an error (an expired watch, the API server
        // away), with kube-runtime's backoff; the tables of a relist start over at InitDone.
        let mut events = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    let msg = format!("watching CiliumNodes: {}", chain(&e));
                    tracing::warn!("{msg}");
                    reporter.degraded(msg);
                    continue;
                }
            };
            match event {
                Event::Init => initial.clear(),
                Event::InitApply(node) => initial.push(node),
                Event::InitDone => {
                    // A relist (after a watch expired) starts over from what is written.
                    pool = self.template.clone();
                    waiting.clear();
                    initial.sort_by(|a, b| {
                        let created = |o: &DynamicObject| o.metadata.creation_timestamp.clone();
                        created(a)
                            .cmp(&created(b))
                            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
                    });
                    // Everything already handed out is occupied before anything new is.
                    for node in &initial {
                        pool.occupy(&name(node), &pod_cidrs(node));
                    }
                    for node in std::mem::take(&mut initial) {
                        self.reconcile(&api, &mut pool, &node, &mut waiting).await?;
                    }
                    synced = true;
                }
                Event::Apply(node) if synced => {
                    self.reconcile(&api, &mut pool, &node, &mut waiting).await?
                }
                Event::Apply(_) => {}
                Event::Delete(node) => {
                    waiting.remove(&name(&node));
                    let released = pool.release(&name(&node));
                    if !released.is_empty() {
                        tracing::info!(node = %name(&node), cidrs = ?released, "node gone: pod CIDRs back in the pool");
                        // The nodes refused get their turn now rather than at their next
                        // change: a conflict may be gone, a CIDR free.
                        for (_, node) in std::mem::take(&mut waiting) {
                            self.reconcile(&api, &mut pool, &node, &mut waiting).await?;
                        }
                    }
                }
            }
            if synced {
                reporter.ok(format!("leading: {} pod CIDRs allocated", pool.held()));
            }
        }
        Ok(())
    }

    /// Gives one node its CIDRs and writes what changed: the spec, then the status.
    async fn reconcile(
        &self,
        api: &Api<DynamicObject>,
        pool: &mut ClusterPool,
        node: &DynamicObject,
        waiting: &mut BTreeMap<String, DynamicObject>,
    ) -> Result<()> {
        let name = name(node);
        // Leadership may have gone since the event: the session ends at its next await, but
        // nothing is written meanwhile.
        if !self.leadership.leading() {
            return Ok(());
        }
        let Assignment {
            pod_cidrs,
            changed,
            refusals,
        } = pool.assign(&name, &pod_cidrs(node));
        if refusals.is_empty() {
            waiting.remove(&name);
        } else {
            waiting.insert(name.clone(), node.clone());
        }
        if changed {
            let cidrs: Vec<String> = pod_cidrs.iter().map(ToString::to_string).collect();
            let patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"ipam": {"podCIDRs": cidrs}},
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(Error::api(format!(
                    "writing the pod CIDRs of CiliumNode {name}"
                ))) {
                Ok(_) => tracing::info!(node = %name, cidrs = ?cidrs, "pod CIDRs allocated"),
                // Changed meanwhile: its event comes next and brings it back here.
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        let error = (!refusals.is_empty()).then(|| {
            refusals
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        });
        let written = field(node, &["status", "ipam", "operator-status", "error"])
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        if written != error.as_deref() {
            if let Some(e) = &error {
                tracing::warn!(node = %name, "{e}");
            }
            let patch = json!({"status": {"ipam": {"operator-status": {"error": error}}}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(Error::api(format!(
                    "writing the status of CiliumNode {name}"
                )))?;
        }
        Ok(())
    }
}

fn name(node: &DynamicObject) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// The node's `spec.ipam.podCIDRs`; entries that are not CIDRs are skipped, with a warning.
fn pod_cidrs(node: &DynamicObject) -> Vec<IpNet> {
    let Some(list) = field(node, &["spec", "ipam", "podCIDRs"]).and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|v| {
            let s = v.as_str()?;
            s.parse()
                .inspect_err(
                    |_| tracing::warn!(node = %name(node), cidr = s, "not a CIDR; ignored"),
                )
                .ok()
        })
        .collect()
}

//! The cell's wiring: the kvstore's loops as a job, this node's ip entries and the learnt
//! identities kept in line by jobs, and the status note.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_api::StatusNote;
use cellium_endpoint_manager::EndpointManager;
use cellium_hive::{BoxError, Config, Jobs, Reporter, Trigger};
use cellium_identity::Identities;
use cellium_ipam::Ipam;
use cellium_labels::Labels;
use cellium_metrics::Metrics;
use cellium_node_discovery::desired::own_addresses;
use cellium_resources::{ObjectKey, Resources};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::config::KvstoreConfig;
use crate::error::{Error, Result};
use crate::ips;
use crate::keys;
use crate::nodes;
use crate::store::{Kvstore, Refusal, RefusalKind};

/// How often the jobs run when nothing triggers them.
const RESYNC: Duration = Duration::from_secs(30);

/// The provider: the kvstore, and its loops as the job `session` (until the hive stops),
/// Degraded while etcd refuses this node's TLS handshake or credentials; its counter of forged
/// `id/` keys put back registered with the metrics.
pub(crate) fn provide(
    cfg: Config<KvstoreConfig>,
    resources: Option<Arc<Resources>>,
    metrics: Option<Arc<Metrics>>,
    jobs: Jobs,
) -> Result<Arc<Kvstore>> {
    let node = resources.as_ref().and_then(|r| r.node_name());
    let kv = Kvstore::new((*cfg).clone(), node).map_err(Error::Config)?;
    if let Some(metrics) = metrics {
        metrics.register(
            "kvstore_identities_restored",
            "id/ keys of numbers this node holds that someone rewrote with other labels, put back",
            kv.restored.clone(),
        );
        metrics.register(
            "kvstore_identity_reallocated",
            "Label sets numbered again because another node took their number while this node's references were gone (a partition longer than the lease)",
            kv.reallocated.clone(),
        );
    }
    if kv.is_enabled() {
        let run = kv.clone();
        jobs.one_shot("session", move |ctx| {
            let run = run.clone();
            async move {
                tokio::select! {
                    _ = ctx.cancelled() => {}
                    _ = run.clone().run() => {}
                    _ = report_refusal(&run, ctx.reporter().clone()) => {}
                }
                Ok::<(), BoxError>(())
            }
        })
        .add();
    }
    Ok(kv)
}

/// Reports whether etcd refuses this node: Degraded with etcd's (or the TLS layer's) reason,
/// since waiting does not mend a certificate or a password that etcd does not accept, unlike
/// etcd away (which `cellium status`'s note tells, without Degraded).
async fn report_refusal(kv: &Kvstore, reporter: Reporter) {
    let mut refusal = kv.refusal();
    loop {
        match refusal.borrow_and_update().clone() {
            Some(Refusal {
                kind: RefusalKind::Tls,
                why,
            }) => reporter.degraded(format!(
                "TLS with etcd at {} refused, by etcd or by this node (check the \
                 certificates of kvstore-opt etcd.config): {why}",
                kv.endpoints()
            )),
            Some(Refusal {
                kind: RefusalKind::Credentials,
                why,
            }) => reporter.degraded(format!(
                "etcd at {} refuses this node's user (check username and password of \
                 kvstore-opt etcd.config, and the user's role on the prefix cilium/): {why}",
                kv.endpoints()
            )),
            None => reporter.ok(format!("etcd at {}", kv.endpoints())),
        }
        if refusal.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// The contribution: with a kvstore, the jobs `identities` (every `id/` key learnt by the
/// identity cell, so that policies select other nodes' pods) and `ip-entries` (this node's
/// endpoints as ip entries); and the status note (`cellium status`).
pub(crate) fn start(
    kv: Arc<Kvstore>,
    identities: Arc<Identities>,
    endpoints: Option<Arc<EndpointManager>>,
    resources: Option<Arc<Resources>>,
    ipam: Option<Arc<Ipam>>,
    jobs: Jobs,
) -> Arc<StatusNote> {
    let note = {
        let kv = kv.clone();
        Arc::new(StatusNote::new(move || kv.note()))
    };
    if !kv.is_enabled() {
        return note;
    }
    learn_identities(&kv, identities, &jobs);
    if let Some(resources) = &resources {
        write_node(&kv, resources.clone(), ipam, &jobs);
    }
    if let Some(endpoints) = endpoints {
        write_ips(&kv, endpoints, resources, &jobs);
    } else {
        tracing::info!("this agent has no endpoint manager: no ip entries are written");
    }
    note
}

fn learn_identities(kv: &Arc<Kvstore>, identities: Arc<Identities>, jobs: &Jobs) {
    let trigger = pulled_by(
        jobs,
        "watch-identities",
        vec![kv.identities.changes(), kv.taken_changes()],
    );
    let learnt: Arc<Mutex<BTreeMap<u32, Labels>>> = Arc::default();
    let kv = kv.clone();
    jobs.timer("identities", RESYNC, move |ctx| {
        let (kv, identities, learnt) = (kv.clone(), identities.clone(), learnt.clone());
        async move {
            retire_taken(&kv, &identities);
            let count = learn(
                &kv,
                &identities,
                &mut learnt.lock().unwrap_or_else(|p| p.into_inner()),
            );
            ctx.reporter()
                .ok(format!("{count} cluster identities learnt from etcd"));
            Ok::<(), BoxError>(())
        }
    })
    .trigger(trigger)
    .add();
}

/// Retires the numbers another node took from this one (`Identities::retire`): their
/// labels get new numbers, their endpoints move (the endpoint manager follows retirements).
fn retire_taken(kv: &Kvstore, identities: &Identities) {
    for (labels_key, id) in kv.take_retired() {
        match keys::parse_labels_key(&labels_key) {
            Some(labels) => {
                identities.retire(id, &labels);
            }
            None => tracing::warn!(labels = labels_key, id, "labels do not parse; not retired"),
        }
    }
}

/// Learns every `id/` key's labels, forgets those gone; returns how many are known.
pub(crate) fn learn(
    kv: &Kvstore,
    identities: &Identities,
    learnt: &mut BTreeMap<u32, Labels>,
) -> usize {
    let now: BTreeMap<u32, Labels> = kv
        .identities
        .lock()
        .iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix(keys::ID_PREFIX)?.parse::<u32>().ok()?;
            // A number this node holds means its labels, whatever the key says now (it is
            // put back).
            if kv.forged(k, v).is_some() {
                return None;
            }
            match keys::parse_labels_key(v) {
                Some(labels) => Some((id, labels)),
                None => {
                    tracing::warn!(
                        key = k,
                        value = v,
                        "an identity's labels do not parse; ignored"
                    );
                    None
                }
            }
        })
        .collect();
    for (id, labels) in &now {
        if learnt.get(id) != Some(labels) {
            identities.learn(*id, labels);
        }
    }
    for id in learnt.keys().filter(|id| !now.contains_key(id)) {
        identities.forget(*id);
    }
    *learnt = now;
    learnt.len()
}

/// A trigger pulled whenever one of `sources` moves, by the observer job `name`.
fn pulled_by(jobs: &Jobs, name: &str, sources: Vec<watch::Receiver<u64>>) -> Trigger {
    let trigger = Trigger::new();
    let pull = trigger.clone();
    let changes = futures::stream::select_all(sources.into_iter().map(WatchStream::from_changes));
    jobs.observer(name, changes, move |_, _| {
        pull.trigger();
        async { Ok(()) }
    })
    .add();
    trigger
}

/// The job `node-entry`: this node's `nodes/v1/` entry, its addresses (its Node's, else its
/// CiliumNode's) and pod CIDRs (IPAM's pools), kept in line at every change of those and every
/// [`RESYNC`] (every second while IPAM has no pool yet). A node without an address yet writes
/// nothing: no one could route to it.
fn write_node(kv: &Arc<Kvstore>, resources: Arc<Resources>, ipam: Option<Arc<Ipam>>, jobs: &Jobs) {
    let trigger = pulled_by(
        jobs,
        "watch-node",
        vec![
            resources.nodes.revision(),
            resources.cilium_nodes.revision(),
        ],
    );
    let kv = kv.clone();
    let again = trigger.clone();
    jobs.timer("node-entry", RESYNC, move |ctx| {
        let (kv, resources, ipam) = (kv.clone(), resources.clone(), ipam.clone());
        let again = again.clone();
        async move {
            let addresses = own_addresses(
                &resources.nodes.list(),
                &resources.cilium_nodes.list(),
                kv.node(),
            );
            kv.set_node_ip(&addresses);
            let cidrs: Vec<_> = ipam
                .map(|i| i.pools().into_iter().map(|p| p.cidr).collect())
                .unwrap_or_default();
            // IPAM takes its pools from the Node after the tables hear of it: until it has
            // them, look again soon rather than at the next resync.
            if cidrs.is_empty() {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    again.trigger();
                });
            }
            let entry =
                (!addresses.is_empty()).then(|| nodes::own_entry(kv.node(), &addresses, &cidrs));
            kv.keep_node(entry.as_ref());
            ctx.reporter().ok(match &entry {
                Some(e) => format!(
                    "node entry kept: {} addresses, pod CIDRs {:?} {:?}",
                    e.addresses.len(),
                    e.ipv4_alloc_cidr,
                    e.ipv6_alloc_cidr
                ),
                None => "no node entry: the node has no address yet".into(),
            });
            Ok::<(), BoxError>(())
        }
    })
    .trigger(trigger)
    .add();
}

fn write_ips(
    kv: &Arc<Kvstore>,
    endpoints: Arc<EndpointManager>,
    resources: Option<Arc<Resources>>,
    jobs: &Jobs,
) {
    let mut sources = vec![endpoints.changes()];
    if let Some(r) = &resources {
        sources.push(r.nodes.revision());
        sources.push(r.pods.revision());
    }
    let trigger = pulled_by(jobs, "watch-endpoints", sources);
    let kv = kv.clone();
    jobs.timer("ip-entries", RESYNC, move |ctx| {
        let (kv, endpoints, resources) = (kv.clone(), endpoints.clone(), resources.clone());
        async move {
            let host_ip = resources.as_ref().and_then(|r| {
                r.nodes
                    .get(&ObjectKey::cluster(kv.node()))?
                    .addresses
                    .first()
                    .copied()
            });
            let entries = ips::desired(&endpoints.list(), kv.node(), host_ip, |ns, name| {
                resources
                    .as_ref()?
                    .pods
                    .get(&ObjectKey::namespaced(ns, name))
            });
            kv.keep_ips(&entries);
            ctx.reporter()
                .ok(format!("{} ip entries kept", entries.len()));
            Ok::<(), BoxError>(())
        }
    })
    .trigger(trigger)
    .add();
}

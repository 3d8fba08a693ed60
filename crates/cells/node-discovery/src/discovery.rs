//! The cluster's other nodes and their pods, made known to this node: identities, ipcache
//! entries and routes, reconciled level-triggered from the resources tables.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_hive::{BoxError, Config, Jobs, Trigger};
use cellium_identity::{Identities, Reserved};
use cellium_ipcache::{Ipcache, Source};
use cellium_labels::{Label, Labels};
use cellium_resources::{CiliumIdentity, Resources};
use futures::StreamExt;
use ipnet::IpNet;
use tokio::sync::OnceCell;
use tokio_stream::wrappers::WatchStream;

use crate::config::{NodeDiscoveryConfig, RoutingMode};
use crate::desired;
use crate::error::{Error, Result};
use crate::remote::RemoteEndpoints;
use crate::routes;

/// How often a pass runs when nothing changed: a route or entry removed by someone else comes
/// back within this.
const RESYNC_INTERVAL: Duration = Duration::from_secs(30);

/// What this node learnt of the others, and the means to act on it.
#[derive(Debug)]
pub struct NodeDiscovery {
    /// Whether there is a cluster to learn from (Kubernetes mode).
    active: bool,
    resources: Arc<Resources>,
    ipcache: Arc<Ipcache>,
    identities: Arc<Identities>,
    /// Other nodes' pods from elsewhere than CiliumEndpoints (the kvstore), if any.
    remote: Option<Arc<dyn RemoteEndpoints>>,
    node: String,
    /// The ipcache entries claimed, as last written.
    claimed: Mutex<BTreeMap<IpNet, u32>>,
    /// The identities learnt, with their labels.
    learnt: Mutex<BTreeMap<u32, Labels>>,
    netlink: OnceCell<rtnetlink::Handle>,
    /// What the last pass found, or why it failed.
    last: Mutex<Option<String>>,
}

impl NodeDiscovery {
    /// The cell's constructor. Standalone (no API server) it does nothing; `routing-mode:
    /// tunnel` fails the start, naming the key.
    pub fn new(
        cfg: Config<NodeDiscoveryConfig>,
        jobs: Jobs,
        resources: Option<Arc<Resources>>,
        ipcache: Arc<Ipcache>,
        identities: Arc<Identities>,
        remote: Option<Arc<dyn RemoteEndpoints>>,
    ) -> Result<Arc<NodeDiscovery>> {
        if cfg.routing_mode == RoutingMode::Tunnel {
            return Err(Error::Mode(
                "tunnel is not available in this version; use native".into(),
            ));
        }
        let node = resources.as_ref().and_then(|r| r.node_name());
        let this = Arc::new(NodeDiscovery {
            active: node.is_some(),
            node: node.unwrap_or_default(),
            resources: resources.unwrap_or_else(Resources::new),
            ipcache,
            identities,
            remote,
            claimed: Mutex::default(),
            learnt: Mutex::default(),
            netlink: OnceCell::new(),
            last: Mutex::default(),
        });
        if this.active {
            this.follow(&jobs);
        }
        Ok(this)
    }

    /// What `cellium status` says of the cluster: `None` standalone.
    pub fn note(&self) -> Option<String> {
        if !self.active {
            return None;
        }
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Some(format!(
            "cluster (routing-mode native): {}",
            last.unwrap_or_else(|| "not looked at yet".into())
        ))
    }

    /// Whether this node is in a cluster it learns from (Kubernetes mode).
    pub fn is_active(&self) -> bool {
        self.active
    }

    fn follow(self: &Arc<Self>, jobs: &Jobs) {
        let trigger = Trigger::new();
        let pull = trigger.clone();
        let r = &self.resources;
        let mut sources = vec![
            WatchStream::from_changes(r.nodes.revision()).boxed(),
            WatchStream::from_changes(r.cilium_nodes.revision()).boxed(),
            WatchStream::from_changes(r.cilium_endpoints.revision()).boxed(),
            WatchStream::from_changes(r.cilium_identities.revision()).boxed(),
        ];
        if let Some(remote) = &self.remote {
            sources.push(WatchStream::from_changes(remote.changes()).boxed());
        }
        let changes = futures::stream::select_all(sources);
        jobs.observer("watch-cluster", changes, move |_, _ctx| {
            pull.trigger();
            async { Ok(()) }
        })
        .add();
        let this = self.clone();
        jobs.timer("reconcile", RESYNC_INTERVAL, move |ctx| {
            let this = this.clone();
            async move {
                let result = this.pass().await;
                let note = match &result {
                    Ok(summary) => summary.clone(),
                    Err(e) => format!("the last pass failed: {e}"),
                };
                *this.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(note);
                ctx.reporter().ok(result?);
                Ok::<(), BoxError>(())
            }
        })
        .trigger(trigger)
        .add();
    }

    /// One pass: identities first (an ipcache entry naming an identity the policy repository
    /// does not know would be denied by every rule), then ipcache entries, then routes.
    pub async fn pass(&self) -> Result<String> {
        let identities = self.learn_identities();
        let nodes = self.resources.nodes.list();
        let endpoints = self.resources.cilium_endpoints.list();
        let remote = self
            .remote
            .as_ref()
            .map(|r| r.endpoints())
            .unwrap_or_default();
        let entries = desired::ipcache(
            nodes.iter().map(|n| &**n),
            endpoints.iter().map(|e| &**e).chain(&remote),
            &self.node,
            Reserved::RemoteNode.id(),
        );
        let entry_count = entries.len();
        self.claim(entries)?;
        let cilium_nodes = self.resources.cilium_nodes.list();
        let routes = desired::routes(
            nodes.iter().map(|n| &**n),
            cilium_nodes.iter().map(|n| &**n),
            &self.node,
        );
        let handle = self.netlink().await?;
        let changed = routes::reconcile(handle, &routes).await?;
        if changed > 0 {
            tracing::info!(
                routes = routes.len(),
                changed,
                "routes to other nodes updated"
            );
        }
        Ok(format!(
            "{} other nodes' pod CIDRs routed, {entry_count} remote addresses, {identities} cluster identities",
            routes.len()
        ))
    }

    /// Learns every CiliumIdentity, forgets those gone; returns how many are known.
    fn learn_identities(&self) -> usize {
        let mut learnt = self.learnt.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = BTreeSet::new();
        for ci in self.resources.cilium_identities.list() {
            let Some(labels) = labels_of(&ci) else {
                continue;
            };
            seen.insert(ci.id);
            if learnt.get(&ci.id) != Some(&labels) {
                self.identities.learn(ci.id, &labels);
                learnt.insert(ci.id, labels);
            }
        }
        let gone: Vec<u32> = learnt
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.identities.forget(id);
            learnt.remove(&id);
        }
        learnt.len()
    }

    /// Claims `entries` in the ipcache as [`Source::Remote`], and gives up the rest.
    fn claim(&self, entries: BTreeMap<IpNet, u32>) -> Result<()> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        for (prefix, id) in &entries {
            if claimed.get(prefix) != Some(id) {
                self.ipcache.upsert(*prefix, *id, Source::Remote)?;
                claimed.insert(*prefix, *id);
            }
        }
        let gone: Vec<IpNet> = claimed
            .keys()
            .filter(|p| !entries.contains_key(p))
            .copied()
            .collect();
        for prefix in gone {
            self.ipcache.delete(prefix, Source::Remote)?;
            claimed.remove(&prefix);
        }
        Ok(())
    }

    async fn netlink(&self) -> Result<&rtnetlink::Handle> {
        self.netlink
            .get_or_try_init(|| async {
                let (conn, handle, _) = rtnetlink::new_connection().map_err(Error::Connect)?;
                tokio::spawn(conn);
                Ok(handle)
            })
            .await
    }
}

/// A CiliumIdentity's labels; `None` (and a warning) when one does not parse.
fn labels_of(ci: &CiliumIdentity) -> Option<Labels> {
    let mut labels = Labels::new();
    for (key, value) in &ci.labels {
        match format!("{key}={value}").parse::<Label>() {
            Ok(label) => {
                labels.insert(label);
            }
            Err(e) => {
                tracing::warn!(id = ci.id, label = %key, error = %e, "a CiliumIdentity's label does not parse; identity ignored");
                return None;
            }
        }
    }
    (!labels.is_empty()).then_some(labels)
}

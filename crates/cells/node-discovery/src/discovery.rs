//! The cluster's other nodes and their pods, made known to this node: identities, ipcache
//! entries and routes, reconciled level-triggered from the resources tables.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_datapath_bpf::maps::ipmasq::POD_CIDR;
use cellium_datapath_bpf::{Direction, Reason};
use cellium_hive::{BoxError, Config, Hook, Jobs, Lifecycle, Trigger};
use cellium_identity::{Identities, Reserved};
use cellium_ipcache::{Ipcache, IpcacheInfo, Source};
use cellium_labels::{Label, Labels, POD_NAMESPACE_LABEL, source};
use cellium_loader::Loader;
use cellium_metrics::Metrics;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::{CiliumIdentity, NamedPort, Resources};
use futures::StreamExt;
use ipnet::IpNet;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::OnceCell;
use tokio_stream::wrappers::WatchStream;

use crate::config::{NodeDiscoveryConfig, RoutingMode, TunnelProtocol};
use crate::covered::Covered;
use crate::desired::{self, Refused};
use crate::error::{Error, Result};
use crate::remote::RemoteEndpoints;
use crate::{netdev, routes, tunnel};

/// How often a pass runs when nothing changed: a route or entry removed by someone else comes
/// back within this.
const RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// Standalone, how often the node's addresses are looked at for the devices
/// `cel_from_netdev` belongs on: no Node object says when they change, and the program
/// serves NodePort and external frontends to the outside.
const STANDALONE_NETDEV_INTERVAL: Duration = Duration::from_secs(5);

/// The label of `cellium_remote_claims_refused_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// What this node learnt of the others, and the means to act on it.
#[derive(Debug)]
pub struct NodeDiscovery {
    /// Whether there is a cluster to learn from (Kubernetes mode).
    active: bool,
    /// Tunnel mode, in a cluster.
    tunnel: bool,
    /// The tunnel device's ifindex, once it is in place (0 before, and in native mode).
    tunnel_ifindex: AtomicU32,
    resources: Arc<Resources>,
    ipcache: Arc<Ipcache>,
    identities: Arc<Identities>,
    /// Other nodes' pods from elsewhere than CiliumEndpoints (the kvstore), if any.
    remote: Option<Arc<dyn RemoteEndpoints>>,
    /// The local identities of other nodes' pods inside this node's ipBlocks (none without a
    /// policy repository).
    covered: Option<Covered>,
    node: String,
    /// The ipcache entries claimed, as last written.
    claimed: Mutex<BTreeMap<IpNet, IpcacheInfo>>,
    /// The named ports given to the claimed entries, as last written.
    claimed_ports: Mutex<BTreeMap<IpNet, Vec<NamedPort>>>,
    /// Other nodes' claims refused at the last pass (each counted once, when first seen).
    refused: Mutex<BTreeSet<Refused>>,
    /// `cellium_remote_claims_refused_total{reason}`.
    refused_total: Family<ReasonLabels, Counter>,
    /// The identities learnt, with their labels.
    learnt: Mutex<BTreeMap<u32, Labels>>,
    netlink: OnceCell<rtnetlink::Handle>,
    /// What the last pass found, or why it failed.
    last: Mutex<Option<String>>,
    loader: Arc<Loader>,
    /// The devices `cel_from_netdev` is attached to.
    netdevs: Mutex<BTreeSet<u32>>,
}

impl NodeDiscovery {
    /// The cell's constructor. Standalone (no API server) it learns nothing; `tunnel-protocol:
    /// geneve` fails the start, naming the key. Its start hook puts the tunnel device in place
    /// in tunnel mode, and removes a previous run's otherwise.
    // A hive constructor: each argument is a dependency the hive injects.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: Config<NodeDiscoveryConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        resources: Option<Arc<Resources>>,
        ipcache: Arc<Ipcache>,
        identities: Arc<Identities>,
        loader: Arc<Loader>,
        remote: Option<Arc<dyn RemoteEndpoints>>,
        policy: Option<Arc<PolicyRepository>>,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Arc<NodeDiscovery>> {
        if cfg.tunnel_protocol == TunnelProtocol::Geneve {
            return Err(Error::Mode(
                "tunnel-protocol geneve is not available in this version; use vxlan".into(),
            ));
        }
        let node = resources.as_ref().and_then(|r| r.node_name());
        let active = node.is_some();
        let this = Arc::new(NodeDiscovery {
            active,
            tunnel: active && cfg.routing_mode == RoutingMode::Tunnel,
            tunnel_ifindex: AtomicU32::new(0),
            node: node.unwrap_or_default(),
            resources: resources.unwrap_or_else(Resources::new),
            ipcache,
            covered: policy.map(|p| Covered::new(p, identities.clone())),
            identities,
            remote,
            claimed: Mutex::default(),
            claimed_ports: Mutex::default(),
            refused: Mutex::default(),
            refused_total: Family::default(),
            learnt: Mutex::default(),
            netlink: OnceCell::new(),
            last: Mutex::default(),
            loader: loader.clone(),
            netdevs: Mutex::default(),
        });
        if let Some(metrics) = metrics {
            metrics.register(
                "remote_claims_refused",
                "Other nodes' claims of an address (CiliumEndpoints, kvstore ip entries) refused, by reason; each counted once",
                this.refused_total.clone(),
            );
        }
        let setup = this.clone();
        let port = cfg.tunnel_port;
        lc.append(Hook::new("tunnel-device").on_start(move |_| async move {
            setup.set_up_tunnel(&loader, port).await?;
            Ok(())
        }));
        if this.active {
            this.follow(&jobs);
            if this.tunnel {
                this.watch_encapsulation(&jobs);
            }
        } else {
            this.follow_addresses(&jobs);
        }
        Ok(this)
    }

    /// Tunnel mode: the VXLAN device, `cel_from_overlay` on its ingress, and its index and
    /// UDP port in the datapath's configuration (from then on pods' traffic to other nodes'
    /// pods takes it, and `cel_from_netdev` leaves the tunnel's packets to the device).
    /// Otherwise: a previous run's device and setting removed.
    async fn set_up_tunnel(&self, loader: &Loader, port: u16) -> Result<()> {
        let dp = loader.datapath()?;
        let handle = self.netlink().await?;
        let (ifindex, on_port) = if self.tunnel {
            let ifindex = tunnel::ensure(handle, port).await?;
            dp.attach_overlay(ifindex).map_err(|source| Error::Tunnel {
                what: "program",
                source,
            })?;
            (ifindex, port)
        } else {
            if let Some(gone) = tunnel::remove(handle).await? {
                // Its programs' pinned links went defunct with it: unpinned here.
                dp.detach_overlay(gone).map_err(|source| Error::Tunnel {
                    what: "program",
                    source,
                })?;
            }
            (0, 0)
        };
        dp.config()
            .set_tunnel(ifindex, on_port)
            .map_err(|source| Error::Tunnel {
                what: "setting",
                source,
            })?;
        self.tunnel_ifindex.store(ifindex, Ordering::Relaxed);
        Ok(())
    }

    /// What `cellium status` says of the cluster: `None` standalone.
    pub fn note(&self) -> Option<String> {
        if !self.active {
            return None;
        }
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mode = if self.tunnel {
            format!("tunnel via {}", tunnel::DEVICE)
        } else {
            "native".into()
        };
        Some(format!(
            "cluster (routing-mode {mode}): {}",
            last.unwrap_or_else(|| "not looked at yet".into())
        ))
    }

    /// Whether this node is in a cluster it learns from (Kubernetes mode).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Standalone: `cel_from_netdev` on the devices holding any of the node's addresses
    /// (every address of its namespace but loopback and link-local ones), looked at every
    /// [`STANDALONE_NETDEV_INTERVAL`].
    fn follow_addresses(self: &Arc<Self>, jobs: &Jobs) {
        let this = self.clone();
        jobs.timer("netdevs", STANDALONE_NETDEV_INTERVAL, move |ctx| {
            let this = this.clone();
            async move {
                let mine: Vec<IpAddr> = cellium_ipcache::node_addresses()
                    .await?
                    .into_iter()
                    .collect();
                let handle = this.netlink().await?;
                this.attach_netdevs(handle, &mine).await?;
                let count = this.netdevs.lock().unwrap_or_else(|p| p.into_inner()).len();
                ctx.reporter()
                    .ok(format!("cel_from_netdev on {count} devices of the node"));
                Ok::<(), BoxError>(())
            }
        })
        .add();
    }

    /// Tunnel mode: Degraded (`node-discovery.encapsulation`) for [`RESYNC_INTERVAL`] after the
    /// datapath dropped packets it could not encapsulate (drop reason `Encapsulation failed`):
    /// traffic to other nodes that should be carried is not, which the node's health says
    /// rather than a counter only.
    fn watch_encapsulation(self: &Arc<Self>, jobs: &Jobs) {
        let this = self.clone();
        // The counter lives in a pinned map, across restarts: the first look sets the mark.
        let last = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        jobs.timer("encapsulation", RESYNC_INTERVAL, move |ctx| {
            let (this, last) = (this.clone(), last.clone());
            async move {
                let dp = this.loader.datapath()?;
                let now = dp
                    .metrics()
                    .get(Direction::Egress, Reason::EncapFailed)?
                    .packets;
                let before = last.swap(now, Ordering::Relaxed);
                if before != u64::MAX && now > before {
                    ctx.reporter().degraded(format!(
                        "{} packets to other nodes dropped as Encapsulation failed in the last {}s; `cellium observe --verdict DROPPED` shows them",
                        now - before,
                        RESYNC_INTERVAL.as_secs()
                    ));
                } else {
                    ctx.reporter().ok("no packets dropped as Encapsulation failed");
                }
                Ok::<(), BoxError>(())
            }
        })
        .add();
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
            for changes in remote.changes() {
                sources.push(WatchStream::from_changes(changes).boxed());
            }
        }
        // An ipBlock added or removed changes which remote pods it covers.
        if let Some(covered) = &self.covered {
            sources.push(WatchStream::from_changes(covered.changes()).boxed());
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
        let mut cilium_nodes = self.resources.cilium_nodes.list();
        if let Some(remote) = &self.remote {
            cilium_nodes.extend(remote.nodes().into_iter().map(Arc::new));
        }
        let endpoints = self.resources.cilium_endpoints.list();
        let (remote, refused_early) = self
            .remote
            .as_ref()
            .map(|r| r.endpoints())
            .unwrap_or_default();
        let world = |ip| self.ipcache.world_identity(ip);
        let namespace_of = |id| {
            let identity = self.identities.get(id)?;
            let ns = identity.labels.get(source::K8S, POD_NAMESPACE_LABEL)?;
            Some(ns.value.clone())
        };
        let mut claims = desired::ipcache(
            &nodes,
            &cilium_nodes,
            endpoints.iter().map(|e| &**e).chain(&remote),
            &self.node,
            Reserved::RemoteNode.id(),
            self.tunnel.then_some(&world as &dyn Fn(_) -> u32),
            &namespace_of,
        );
        let entry_count = claims.entries.len();
        claims.refused.extend(refused_early);
        let refused = self.refuse(std::mem::take(&mut claims.refused));
        let (stale, covered) = match &self.covered {
            Some(c) => c.apply(&mut claims),
            None => (Vec::new(), 0),
        };
        let claimed = self.claim(claims.entries);
        // Once the ipcache no longer names them (or, if that failed, anyway: the next pass
        // writes the entries again with identities it holds).
        if let Some(c) = &self.covered {
            c.release(stale);
        }
        claimed?;
        self.claim_ports(claims.named_ports);
        let mut routes = desired::routes(
            nodes.iter().map(|n| &**n),
            cilium_nodes.iter().map(|n| &**n),
            &self.node,
        );
        // Other nodes' pods know their own addresses: never masqueraded to (lib/masq.h), even
        // where the ipcache gives them a node-local identity (inside an ipBlock).
        let pod_cidrs = routes.iter().map(|r| r.cidr).collect();
        self.loader
            .datapath()?
            .ipmasq()
            .sync(POD_CIDR, &pod_cidrs)
            .map_err(|source| Error::NonMasquerade { source })?;
        let mine = desired::own_addresses(&nodes, &cilium_nodes, &self.node);
        let ifindex = self.tunnel_ifindex.load(Ordering::Relaxed);
        if ifindex != 0 {
            routes = desired::tunnelled(&routes, ifindex, &mine);
        }
        let handle = self.netlink().await?;
        let changed = routes::reconcile(handle, &routes).await?;
        if changed > 0 {
            tracing::info!(
                routes = routes.len(),
                changed,
                "routes to other nodes updated"
            );
        }
        // After the routes: a device that cannot take the program (gone meanwhile) fails the
        // pass, which is retried, but holds nothing else back.
        self.attach_netdevs(handle, &mine).await?;
        let covered = if covered > 0 {
            format!(" ({covered} inside ipBlocks)")
        } else {
            String::new()
        };
        Ok(format!(
            "{} other nodes' pod CIDRs routed, {entry_count} remote addresses{covered}, {identities} cluster identities{refused}",
            routes.len()
        ))
    }

    /// Keeps `refused` as the refused claims: those not refused at the last pass are counted
    /// and logged. Returns what the status note says of them (empty when there are none):
    /// how many, by reason, and an example.
    fn refuse(&self, refused: Vec<Refused>) -> String {
        let now: BTreeSet<Refused> = refused.into_iter().collect();
        let mut last = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        for r in now.difference(&last) {
            tracing::warn!(reason = r.reason.as_str(), claim = %r.claim, "another node's claim refused");
            let labels = ReasonLabels {
                reason: r.reason.as_str(),
            };
            self.refused_total.get_or_create(&labels).inc();
        }
        *last = now;
        let Some(example) = last.iter().next() else {
            return String::new();
        };
        let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
        for r in last.iter() {
            *by_reason.entry(r.reason.as_str()).or_default() += 1;
        }
        let reasons: Vec<String> = by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        format!(
            "; {} remote claims refused ({}), e.g. {}: {}",
            last.len(),
            reasons.join(", "),
            example.reason.as_str(),
            example.claim
        )
    }

    /// `cel_from_netdev` on the devices holding `mine` now, and off those that no longer do.
    async fn attach_netdevs(&self, handle: &rtnetlink::Handle, mine: &[IpAddr]) -> Result<()> {
        let want = netdev::holding(handle, mine).await?;
        let dp = self.loader.datapath()?;
        let mut have = self.netdevs.lock().unwrap_or_else(|p| p.into_inner());
        let failed = |source| Error::Netdev { source };
        for ifindex in want.difference(&have.clone()) {
            dp.attach_netdev(*ifindex).map_err(failed)?;
            tracing::info!(ifindex, "cel_from_netdev attached to a device of the node");
            have.insert(*ifindex);
        }
        for ifindex in have.clone().difference(&want) {
            dp.detach_netdev(*ifindex).map_err(failed)?;
            tracing::info!(
                ifindex,
                "cel_from_netdev detached: the device holds no node address now"
            );
            have.remove(ifindex);
        }
        Ok(())
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
    fn claim(&self, entries: BTreeMap<IpNet, IpcacheInfo>) -> Result<()> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        for (prefix, info) in &entries {
            if claimed.get(prefix) != Some(info) {
                self.ipcache.upsert(*prefix, *info, Source::Remote)?;
                claimed.insert(*prefix, *info);
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

    /// Gives the claimed entries `ports` (after [`claim`](Self::claim)), and takes them from
    /// the entries that have none any more.
    fn claim_ports(&self, ports: BTreeMap<IpNet, Vec<NamedPort>>) {
        let mut claimed = self.claimed_ports.lock().unwrap_or_else(|p| p.into_inner());
        for (prefix, list) in &ports {
            if claimed.get(prefix) != Some(list) {
                self.ipcache.set_named_ports(*prefix, Source::Remote, list);
            }
        }
        for (prefix, _) in claimed.iter().filter(|(p, _)| !ports.contains_key(p)) {
            self.ipcache.set_named_ports(*prefix, Source::Remote, &[]);
        }
        *claimed = ports;
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

//! Creating, deleting, checking and listing endpoints.

use std::collections::{BTreeMap, HashMap, HashSet};

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter};
use cellium_identity::Identities;
use cellium_ipam::Ipam;
use cellium_ipcache::Ipcache;
use cellium_labels::Labels;
use cellium_loader::Loader;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use cellium_statedir::StateDir;
use tokio::sync::watch;

use crate::config::EndpointConfig;
use crate::endpoint::{Address, Endpoint, State};
use crate::error::{Error, Result};
use crate::locks::KeyLocks;
use crate::plumbing::{self, Netlink, PodNetns, PodNetwork};
use crate::policy::EnforcedTable;
use crate::program;
use crate::request::CreateRequest;
use crate::store::Store;

/// The endpoints of this node.
///
/// Every create is recorded on disk (state `Creating`) before the kernel is touched and
/// marked `Ready` once the datapath enforces it, so that after a crash the restore can tell
/// what finished (restored) from what did not (removed, its addresses free again).
#[derive(Debug)]
pub struct EndpointManager {
    pub(crate) cfg: Config<EndpointConfig>,
    pub(crate) ipam: Arc<Ipam>,
    pub(crate) loader: Arc<Loader>,
    pub(crate) resources: Arc<Resources>,
    pub(crate) identities: Arc<Identities>,
    pub(crate) ipcache: Arc<Ipcache>,
    pub(crate) policy: Arc<PolicyRepository>,
    pub(crate) enforced: EnforcedTable,
    pub(crate) store: Store,
    pub(crate) node: OnceLock<Netlink>,
    pub(crate) table: Mutex<Table>,
    locks: KeyLocks,
    /// Bumped whenever the set of endpoints changes (see [`EndpointManager::changes`]).
    changes: watch::Sender<u64>,
}

/// The endpoints in memory, by id and by the runtime's key.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Shared, so that listing (the API, every regeneration) copies pointers, not records.
    pub(crate) endpoints: BTreeMap<u16, Arc<Endpoint>>,
    pub(crate) by_key: HashMap<(String, String), u16>,
    next_id: u16,
}

impl Table {
    pub(crate) fn insert(&mut self, ep: Endpoint) {
        self.by_key.insert(ep.key(), ep.id);
        self.endpoints.insert(ep.id, Arc::new(ep));
    }

    pub(crate) fn remove(&mut self, id: u16) -> Option<Endpoint> {
        let ep = self.endpoints.remove(&id)?;
        self.by_key.remove(&ep.key());
        Some(Arc::unwrap_or_clone(ep))
    }

    /// The next free id, round-robin from the last one, so a deleted endpoint's id (and any
    /// policy entry a failed cleanup left under it) is not reused at once.
    fn take_id(&mut self) -> Result<u16> {
        let capacity = usize::from(u16::MAX);
        if self.endpoints.len() >= capacity {
            return Err(Error::IdsExhausted(capacity));
        }
        loop {
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if !self.endpoints.contains_key(&self.next_id) {
                return Ok(self.next_id);
            }
        }
    }
}

impl EndpointManager {
    /// Declares the manager; endpoints are restored by its start hook.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: Config<EndpointConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        ipam: Arc<Ipam>,
        loader: Arc<Loader>,
        resources: Arc<Resources>,
        state_dir: Arc<StateDir>,
        identities: Arc<Identities>,
        ipcache: Arc<Ipcache>,
        policy: Arc<PolicyRepository>,
    ) -> Arc<EndpointManager> {
        let manager = Arc::new(EndpointManager {
            cfg,
            ipam,
            loader,
            resources,
            identities,
            ipcache,
            policy,
            enforced: EnforcedTable::default(),
            store: Store(state_dir),
            node: OnceLock::new(),
            table: Mutex::new(Table::default()),
            locks: KeyLocks::default(),
            changes: watch::channel(0).0,
        });
        let this = manager.clone();
        // Restored endpoints re-reserve their addresses here, before the API serves any CNI ADD
        // (the API server starts after every cell whose service it mounts): that order is what
        // keeps an address from being handed out twice across a restart.
        lc.append(
            Hook::new("restore-endpoints").on_start(move |_| async move {
                let summary = this.restore().await?;
                reporter.ok(summary);
                crate::watch::regenerate_on_change(&jobs, this);
                Ok(())
            }),
        );
        manager
    }

    /// Creates the endpoint of (`container_id`, `ifname`), or returns the existing one.
    pub async fn create(&self, req: CreateRequest) -> Result<Endpoint> {
        req.validate()?;
        let node = self.node()?.clone();
        let _serial = self
            .locks
            .lock((req.container_id.clone(), req.ifname.clone()))
            .await;
        if let Some(ep) = self.find(&req.container_id, &req.ifname) {
            // A retry of the ADD that made it (the runtime timed out, say) gets the endpoint
            // again. Anything else must not: answering a request for another namespace with
            // this endpoint would tell the runtime that a pod has networking which has none.
            if is_retry_of(&req, &ep) {
                return Ok(ep);
            }
            return Err(Error::AttachmentExists {
                container_id: req.container_id,
                ifname: req.ifname,
                id: ep.id,
                netns: ep.netns.clone(),
                addresses: ips_text(ep.addresses.iter().map(|a| a.ip)),
                requested: format!(
                    "{} with {}",
                    req.netns.path().display(),
                    if req.requested_ips.is_empty() {
                        "any address".to_string()
                    } else {
                        ips_text(req.requested_ips.iter().copied())
                    }
                ),
            });
        }
        let mut ep = self.reserve(&req)?;
        if let Err(e) = self.allocate(&mut ep, &req.requested_ips) {
            self.forget(&ep);
            return Err(e);
        }
        if let Err(e) = self.store.save(&ep) {
            self.release_addresses(&ep);
            self.forget(&ep);
            return Err(e);
        }
        match self.build(&node, &req.netns, &mut ep).await {
            Ok(()) => {
                tracing::info!(endpoint = %ep.describe(), ips = ?ep.addresses.iter().map(|a| a.ip).collect::<Vec<_>>(), "endpoint ready");
                self.changed();
                Ok(ep)
            }
            Err(e) => {
                tracing::warn!(endpoint = %ep.describe(), error = %e, "create failed, rolling back");
                self.remove(&node, &ep).await;
                Err(e)
            }
        }
    }

    /// Deletes the endpoint of (`container_id`, `ifname`); returns whether it existed.
    /// Deleting what is gone succeeds, and a veth pair left without a record is removed too.
    pub async fn delete(&self, container_id: &str, ifname: &str) -> Result<bool> {
        let node = self.node()?.clone();
        let _serial = self
            .locks
            .lock((container_id.to_string(), ifname.to_string()))
            .await;
        let Some(ep) = self.find(container_id, ifname) else {
            let host = plumbing::host_ifname(container_id, ifname);
            plumbing::teardown_pod(&node, &host)
                .await
                .map_err(|source| Error::Plumbing {
                    endpoint: format!("of container {container_id}"),
                    source,
                })?;
            return Ok(false);
        };
        self.teardown(&node, &ep).await?;
        tracing::info!(endpoint = %ep.describe(), "endpoint deleted");
        Ok(true)
    }

    /// Checks that the endpoint's interfaces, in the namespace the caller passed, and its
    /// datapath are as created.
    pub async fn check(
        &self,
        container_id: &str,
        ifname: &str,
        netns: &PodNetns,
    ) -> Result<Endpoint> {
        let node = self.node()?.clone();
        let ep = self.find(container_id, ifname).ok_or_else(|| {
            Error::NotFound(format!("for container {container_id} interface {ifname}"))
        })?;
        if netns.path() != ep.netns {
            return Err(Error::Plumbing {
                endpoint: ep.describe(),
                source: plumbing::Error::Drift(format!(
                    "it was set up in {}, not {}",
                    ep.netns.display(),
                    netns.path().display()
                )),
            });
        }
        plumbing::check_pod(&node, netns, &network(&ep))
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: ep.describe(),
                source,
            })?;
        let dp = self.loader.datapath()?;
        let datapath = |source| Error::Datapath {
            endpoint: ep.describe(),
            source,
        };
        for addr in ep.addresses.iter().filter(|a| a.ip.is_ipv4()) {
            let entry = dp.endpoints().get(addr.ip).map_err(datapath)?;
            if entry.is_none_or(|e| e.id != ep.id) {
                return Err(Error::Plumbing {
                    endpoint: ep.describe(),
                    source: plumbing::Error::Drift(format!(
                        "the datapath has no entry for {}",
                        addr.ip
                    )),
                });
            }
        }
        Ok(ep)
    }

    /// Deletes the endpoints of `network` whose (container id, interface) is not in `valid`.
    pub async fn gc(&self, network: &str, valid: &HashSet<(String, String)>) -> Result<Vec<u16>> {
        let stale: Vec<Endpoint> = self
            .list()
            .into_iter()
            .filter(|ep| ep.network == network && !valid.contains(&ep.key()))
            .collect();
        let mut removed = Vec::new();
        for ep in stale {
            if self.delete(&ep.container_id, &ep.ifname).await? {
                removed.push(ep.id);
            }
        }
        Ok(removed)
    }

    /// A counter bumped whenever an endpoint is created (ready), deleted or removed, and once
    /// when the endpoints are restored at start: for consumers that derive state from the
    /// endpoint list (service backends, say) and re-read it with [`EndpointManager::list`].
    ///
    /// Trap: it says that something changed, not what; and a receiver made before the
    /// restore sees the restored endpoints only through that one bump.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Tells [`EndpointManager::changes`] subscribers to look again.
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Every endpoint, by id.
    pub fn list(&self) -> Vec<Endpoint> {
        self.table()
            .endpoints
            .values()
            .map(|e| Endpoint::clone(e))
            .collect()
    }

    /// Every endpoint, by id, as the shared records the manager holds (cheap: no copy).
    pub fn snapshot(&self) -> Vec<Arc<Endpoint>> {
        self.table().endpoints.values().cloned().collect()
    }

    /// The endpoint with `id`.
    pub fn get(&self, id: u16) -> Option<Endpoint> {
        self.table().endpoints.get(&id).map(|e| Endpoint::clone(e))
    }

    /// The endpoint of (`container_id`, `ifname`).
    pub fn find(&self, container_id: &str, ifname: &str) -> Option<Endpoint> {
        self.find_shared(container_id, ifname)
            .map(Arc::unwrap_or_clone)
    }

    /// The endpoint of (`container_id`, `ifname`), as the shared record.
    pub(crate) fn find_shared(&self, container_id: &str, ifname: &str) -> Option<Arc<Endpoint>> {
        let table = self.table();
        let id = table
            .by_key
            .get(&(container_id.to_string(), ifname.to_string()))?;
        table.endpoints.get(id).cloned()
    }

    /// Waits for and takes the lock of one endpoint key.
    pub(crate) async fn lock(&self, key: (String, String)) -> crate::locks::KeyGuard<'_> {
        self.locks.lock(key).await
    }

    pub(crate) fn node(&self) -> Result<&Netlink> {
        self.node.get().ok_or(Error::NotStarted)
    }

    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        // Every mutation is a single insert or remove, so a poisoned table is consistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new record with an id, in state `Creating`, known to the table.
    fn reserve(&self, req: &CreateRequest) -> Result<Endpoint> {
        let mut table = self.table();
        let id = table.take_id()?;
        let ep = Endpoint {
            id,
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            netns: req.netns.path().to_path_buf(),
            network: req.network.clone(),
            pod: req.pod.clone(),
            addresses: Vec::new(),
            host_ifname: plumbing::host_ifname(&req.container_id, &req.ifname),
            host_ifindex: 0,
            host_mac: [0; 6],
            pod_mac: [0; 6],
            mtu: req.mtu.unwrap_or(self.cfg.mtu),
            labels: Labels::new(),
            identity: 0,
            state: State::Creating,
            created_unix_ms: now_ms(),
        };
        table.insert(ep.clone());
        Ok(ep)
    }

    /// The requested addresses, or one of each configured family.
    fn allocate(&self, ep: &mut Endpoint, requested: &[IpAddr]) -> Result<()> {
        let owner = ep.describe();
        let results = if requested.is_empty() {
            self.ipam
                .families()
                .into_iter()
                .map(|f| self.ipam.allocate_next(f, &owner))
                .collect::<Vec<_>>()
        } else {
            requested
                .iter()
                .map(|ip| self.ipam.allocate(*ip, &owner))
                .collect()
        };
        for result in results {
            match result {
                Ok(a) => ep.addresses.push(Address {
                    ip: a.ip,
                    pool: a.cidr,
                    gateway: a.router,
                }),
                Err(source) => {
                    self.release_addresses(ep);
                    return Err(Error::Ipam { owner, source });
                }
            }
        }
        if ep.addresses.is_empty() {
            return Err(Error::Ipam {
                owner,
                source: cellium_ipam::Error::NoPool { family: 4 },
            });
        }
        Ok(())
    }

    /// Interfaces, identity, policy, programs; then the record says `Ready`. The programs
    /// are attached last: by the first packet, the endpoint's policy is in place.
    async fn build(&self, node: &Netlink, netns: &PodNetns, ep: &mut Endpoint) -> Result<()> {
        let iface = plumbing::setup_pod(node, netns, &network(ep))
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: ep.describe(),
                source,
            })?;
        ep.host_ifindex = iface.host.index;
        ep.host_mac = iface.host.mac;
        ep.pod_mac = iface.pod.mac;
        self.identify(ep)?;
        // Known to the table with its identity before its policy is computed, so a concurrent
        // regeneration sees it.
        self.table().insert(ep.clone());
        let dp = self.loader.datapath()?;
        self.enforce(&dp, ep)?;
        dp.attach(ep.host_ifindex)
            .map_err(|source| Error::Datapath {
                endpoint: ep.describe(),
                source,
            })?;
        ep.state = State::Ready;
        self.store.save(ep)?;
        self.table().insert(ep.clone());
        Ok(())
    }

    /// Takes an endpoint down completely; stops at the first failure so the runtime's retry
    /// finds the rest still recorded.
    pub(crate) async fn teardown(&self, node: &Netlink, ep: &Endpoint) -> Result<()> {
        plumbing::teardown_pod(node, &ep.host_ifname)
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: ep.describe(),
                source,
            })?;
        let dp = self.loader.datapath()?;
        program::unprogram(&dp, ep).map_err(|source| Error::Datapath {
            endpoint: ep.describe(),
            source,
        })?;
        self.unidentify(ep);
        self.enforced.lock().remove(&ep.id);
        self.release_addresses(ep);
        self.store.remove(ep)?;
        self.forget(ep);
        self.changed();
        Ok(())
    }

    /// Best-effort removal after a failed create or of a leftover found at restore: every step
    /// is tried and every failure logged, since there is no caller left to retry.
    pub(crate) async fn remove(&self, node: &Netlink, ep: &Endpoint) {
        if let Err(e) = plumbing::teardown_pod(node, &ep.host_ifname).await {
            tracing::warn!(endpoint = %ep.describe(), error = %e, "removing interfaces failed");
        }
        if let Ok(dp) = self.loader.datapath()
            && let Err(e) = program::unprogram(&dp, ep)
        {
            tracing::warn!(endpoint = %ep.describe(), error = %e, "removing datapath entries failed");
        }
        self.unidentify(ep);
        self.enforced.lock().remove(&ep.id);
        self.release_addresses(ep);
        if let Err(e) = self.store.remove(ep) {
            tracing::warn!(endpoint = %ep.describe(), error = %e, "removing the record failed");
        }
        self.forget(ep);
        self.changed();
    }

    fn release_addresses(&self, ep: &Endpoint) {
        let owner = ep.describe();
        for addr in &ep.addresses {
            // Only what this endpoint holds: after a restart the address may be someone else's.
            if self.ipam.owner(addr.ip).as_deref() == Some(owner.as_str()) {
                self.ipam.release(addr.ip);
            }
        }
    }

    fn forget(&self, ep: &Endpoint) {
        let mut table = self.table();
        if table
            .endpoints
            .get(&ep.id)
            .is_some_and(|e| e.key() == ep.key())
        {
            table.remove(ep.id);
        }
    }
}

/// Whether `req` asks for what `ep` already is: the same network namespace, and addresses it
/// holds (or none in particular).
fn is_retry_of(req: &CreateRequest, ep: &Endpoint) -> bool {
    req.netns.path() == ep.netns
        && req
            .requested_ips
            .iter()
            .all(|ip| ep.addresses.iter().any(|a| a.ip == *ip))
}

fn ips_text(ips: impl Iterator<Item = IpAddr>) -> String {
    ips.map(|ip| ip.to_string()).collect::<Vec<_>>().join(", ")
}

/// What the endpoint's interface must look like.
pub(crate) fn network(ep: &Endpoint) -> PodNetwork {
    PodNetwork {
        host_ifname: ep.host_ifname.clone(),
        ifname: ep.ifname.clone(),
        mtu: ep.mtu,
        addresses: ep.addresses.iter().map(|a| (a.ip, a.gateway)).collect(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        let ip: IpAddr = "10.244.0.5".parse().unwrap();
        Endpoint {
            id: 7,
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/a".into(),
            network: "cellium".into(),
            pod: None,
            addresses: vec![Address {
                ip,
                pool: "10.244.0.0/24".parse().unwrap(),
                gateway: "10.244.0.1".parse().unwrap(),
            }],
            host_ifname: "lxc1".into(),
            host_ifindex: 3,
            host_mac: [0; 6],
            pod_mac: [0; 6],
            mtu: 1500,
            labels: Labels::new(),
            identity: 300,
            state: State::Ready,
            created_unix_ms: 0,
        }
    }

    fn request(netns: &str, ips: &[&str]) -> CreateRequest {
        CreateRequest {
            container_id: "c1".into(),
            netns: PodNetns::unchecked(netns),
            ifname: "eth0".into(),
            pod: None,
            requested_ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            network: "cellium".into(),
            mtu: None,
        }
    }

    #[test]
    fn only_a_request_for_what_the_endpoint_is_counts_as_a_retry() {
        let ep = endpoint();
        assert!(is_retry_of(&request("/run/netns/a", &[]), &ep));
        assert!(is_retry_of(&request("/run/netns/a", &["10.244.0.5"]), &ep));
        assert!(!is_retry_of(&request("/run/netns/b", &[]), &ep));
        assert!(!is_retry_of(&request("/run/netns/a", &["10.244.0.6"]), &ep));
    }
}

//! Recording backends that fail on demand, and a manager built on them with the real
//! in-memory IPAM, identities, ipcache, policy repository and resources and a real state
//! directory: for unit tests of the order and the failure handling of every flow, without
//! root. What only the kernel can show is tested under `integration/`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_datapath_bpf::{EndpointInfo, MacAddr, PolicyEntry, Verdict};
use cellium_hive::{Config, Health, Hive, Level, Module, Reporter};
use cellium_identity::Identities;
use cellium_ipam::Ipam;
use cellium_ipcache::Ipcache;
use cellium_labels::Labels;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use cellium_statedir::StateDir;
use futures::future::BoxFuture;

use crate::config::EndpointConfig;
use crate::datapath::EndpointDatapath;
use crate::endpoint::{Address, Endpoint, State};
use crate::interfaces::Interfaces;
use crate::manager::{Backends, EndpointManager, Parts};
use crate::plumbing::{self, Link, PodInterface, PodNetwork};
use crate::program::Enforcement;
use crate::request::CreateRequest;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A ready endpoint `id` of container `container` at 10.244.0.`id`, host end `lxc<id>`.
pub(crate) fn endpoint(id: u16, container: &str) -> Endpoint {
    let ip: IpAddr = format!("10.244.0.{id}").parse().expect("a literal address");
    Endpoint {
        id,
        container_id: container.into(),
        ifname: "eth0".into(),
        netns: format!("/run/netns/{container}").into(),
        network: "cellium".into(),
        pod: None,
        addresses: vec![Address {
            ip,
            pool: "10.244.0.0/24".parse().expect("a literal CIDR"),
            gateway: "10.244.0.1".parse().expect("a literal address"),
        }],
        host_ifname: format!("lxc{id}"),
        host_ifindex: u32::from(id),
        host_mac: [2, 0, 0, 0, 0, 1],
        pod_mac: [2, 0, 0, 0, 0, 2],
        mtu: 1500,
        labels: Labels::new(),
        identity: 0,
        state: State::Ready,
        created_unix_ms: 0,
    }
}

type Observer = Box<dyn Fn() -> String + Send>;

/// Every backend call, in order, from both fakes: `setup_pod lxc..`, `attach 3`, ... With an
/// observer, each call also notes what the observer sees at that moment (`[records: 1=ready]`).
#[derive(Clone, Default)]
pub(crate) struct Journal {
    calls: Arc<Mutex<Vec<String>>>,
    observer: Arc<Mutex<Option<Observer>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.calls()).finish()
    }
}

impl Journal {
    fn push(&self, mut call: String) {
        if let Some(observe) = lock(&self.observer).as_ref() {
            call = format!("{call} [{}]", observe());
        }
        lock(&self.calls).push(call);
    }

    /// Notes `observe()` with every call from now on.
    pub(crate) fn observe(&self, observe: impl Fn() -> String + Send + 'static) {
        *lock(&self.observer) = Some(Box::new(observe));
    }

    /// The calls so far.
    pub(crate) fn calls(&self) -> Vec<String> {
        lock(&self.calls).clone()
    }

    /// The calls so far whose text starts with one of `prefixes`.
    pub(crate) fn only(&self, prefixes: &[&str]) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| prefixes.iter().any(|p| c.starts_with(p)))
            .collect()
    }

    /// Forgets the calls so far.
    pub(crate) fn clear(&self) {
        lock(&self.calls).clear();
    }
}

/// Which calls fail: the name of a call (`teardown_pod`, `apply_policy`, ...) and how many
/// more times it fails.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults(Arc<Mutex<HashMap<&'static str, usize>>>);

impl Faults {
    /// Makes the next `times` calls of `call` fail.
    pub(crate) fn fail(&self, call: &'static str, times: usize) {
        lock(&self.0).insert(call, times);
    }

    fn strikes(&self, call: &'static str) -> bool {
        let mut faults = lock(&self.0);
        match faults.get_mut(call) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// The node's interfaces, in memory.
#[derive(Debug, Default)]
pub(crate) struct FakeInterfaces {
    journal: Journal,
    faults: Faults,
    state: Mutex<Node>,
}

#[derive(Debug, Default)]
struct Node {
    /// Host ends by name.
    links: BTreeMap<String, Link>,
    /// Pods' network namespaces.
    netns: BTreeSet<PathBuf>,
    /// Routes to pods: (address, host end's index).
    routes: Vec<(IpAddr, u32)>,
    next_index: u32,
}

impl FakeInterfaces {
    /// Makes a pod network namespace exist.
    pub(crate) fn add_netns(&self, path: impl Into<PathBuf>) {
        lock(&self.state).netns.insert(path.into());
    }

    /// Makes a pod network namespace disappear.
    pub(crate) fn remove_netns(&self, path: &Path) {
        lock(&self.state).netns.remove(path);
    }

    /// Adds a route to a pod through host end `index`, as a previous run would have left it.
    pub(crate) fn add_route(&self, ip: IpAddr, index: u32) {
        lock(&self.state).routes.push((ip, index));
    }

    /// Adds a host end, as a previous run would have left it.
    pub(crate) fn add_link(&self, name: &str, index: u32) {
        let mut node = lock(&self.state);
        node.links.insert(name.into(), link(index));
        node.next_index = node.next_index.max(index);
    }

    /// The host ends.
    pub(crate) fn links(&self) -> Vec<String> {
        lock(&self.state).links.keys().cloned().collect()
    }

    fn fault(&self, call: &'static str, what: &str) -> plumbing::Result<()> {
        self.journal.push(format!("{call} {what}"));
        if self.faults.strikes(call) {
            return Err(plumbing::Error::Drift(format!(
                "injected failure of {call}"
            )));
        }
        Ok(())
    }
}

fn link(index: u32) -> Link {
    Link {
        index,
        mac: [2, 0, 0, 0, 0, index as u8],
        mtu: 1500,
        up: true,
    }
}

impl Interfaces for FakeInterfaces {
    fn setup_pod<'a>(
        &'a self,
        netns: &'a Path,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, plumbing::Result<PodInterface>> {
        Box::pin(async move {
            self.fault("setup_pod", &net.host_ifname)?;
            let mut node = lock(&self.state);
            if !node.netns.contains(netns) {
                return Err(plumbing::Error::Netns {
                    path: netns.to_path_buf(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
            node.next_index += 1;
            let host = link(node.next_index);
            node.links.insert(net.host_ifname.clone(), host.clone());
            for (ip, _) in &net.addresses {
                node.routes.push((*ip, host.index));
            }
            Ok(PodInterface { host, pod: link(2) })
        })
    }

    fn teardown_pod<'a>(&'a self, host_ifname: &'a str) -> BoxFuture<'a, plumbing::Result<bool>> {
        Box::pin(async move {
            self.fault("teardown_pod", host_ifname)?;
            let mut node = lock(&self.state);
            let Some(gone) = node.links.remove(host_ifname) else {
                return Ok(false);
            };
            node.routes.retain(|(_, i)| *i != gone.index);
            Ok(true)
        })
    }

    fn check_pod<'a>(
        &'a self,
        netns: &'a Path,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, plumbing::Result<()>> {
        Box::pin(async move {
            self.fault("check_pod", &net.host_ifname)?;
            let node = lock(&self.state);
            if !node.netns.contains(netns) || !node.links.contains_key(&net.host_ifname) {
                return Err(plumbing::Error::LinkMissing {
                    ifname: net.ifname.clone(),
                    netns: netns.display().to_string(),
                });
            }
            Ok(())
        })
    }

    fn find_link<'a>(&'a self, name: &'a str) -> BoxFuture<'a, plumbing::Result<Option<Link>>> {
        Box::pin(async move {
            self.fault("find_link", name)?;
            Ok(lock(&self.state).links.get(name).cloned())
        })
    }

    fn host_links(&self) -> BoxFuture<'_, plumbing::Result<Vec<(String, u32)>>> {
        Box::pin(async move {
            self.fault("host_links", "")?;
            Ok(lock(&self.state)
                .links
                .iter()
                .map(|(n, l)| (n.clone(), l.index))
                .collect())
        })
    }

    fn host_routes(&self) -> BoxFuture<'_, plumbing::Result<Vec<(IpAddr, u32)>>> {
        Box::pin(async move {
            self.fault("host_routes", "")?;
            Ok(lock(&self.state).routes.clone())
        })
    }

    fn netns_exists(&self, path: &Path) -> bool {
        lock(&self.state).netns.contains(path)
    }
}

/// The datapath's endpoint map, policy map and attachments, in memory.
#[derive(Debug, Default)]
pub(crate) struct FakeDatapath {
    journal: Journal,
    faults: Faults,
    state: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    endpoints: BTreeMap<IpAddr, EndpointInfo>,
    policy: BTreeMap<PolicyEntry, Verdict>,
    attached: BTreeSet<u32>,
}

impl FakeDatapath {
    fn fault(&self, call: &'static str, what: String) -> cellium_datapath_bpf::Result<()> {
        self.journal
            .push(format!("{call} {what}").trim_end().to_string());
        if self.faults.strikes(call) {
            return Err(cellium_datapath_bpf::Error::InvalidInput {
                what: call.into(),
                reason: "injected failure".into(),
            });
        }
        Ok(())
    }

    /// The endpoint-map entries.
    pub(crate) fn entries(&self) -> BTreeMap<IpAddr, EndpointInfo> {
        lock(&self.state).endpoints.clone()
    }

    /// The endpoint ids with policy entries.
    pub(crate) fn policy_ids(&self) -> BTreeSet<u16> {
        lock(&self.state)
            .policy
            .keys()
            .map(|e| e.endpoint_id)
            .collect()
    }

    /// The interfaces with programs.
    pub(crate) fn attachments(&self) -> BTreeSet<u32> {
        lock(&self.state).attached.clone()
    }

    /// Adds an endpoint-map entry and a policy entry, as a previous run would have left
    /// them, and attaches programs to `ifindex`.
    pub(crate) fn add_leftover(&self, ip: IpAddr, id: u16, ifindex: u32) {
        let mut maps = lock(&self.state);
        maps.endpoints.insert(
            ip,
            EndpointInfo {
                id,
                ifindex,
                ..EndpointInfo::default()
            },
        );
        maps.policy.insert(
            PolicyEntry {
                endpoint_id: id,
                direction: cellium_datapath_bpf::Direction::Ingress,
                identity: 0,
                l4: cellium_datapath_bpf::L4Match::Any,
            },
            Verdict::Allow,
        );
        maps.attached.insert(ifindex);
    }
}

impl EndpointDatapath for FakeDatapath {
    fn write_endpoint(
        &self,
        ep: &Endpoint,
        enforcement: Enforcement,
    ) -> cellium_datapath_bpf::Result<()> {
        self.fault(
            "write_endpoint",
            format!(
                "{} ingress={} egress={}",
                ep.id, enforcement.ingress, enforcement.egress
            ),
        )?;
        let mut maps = lock(&self.state);
        for addr in &ep.addresses {
            let mut flags = cellium_datapath_bpf::EndpointFlags::NONE;
            if enforcement.ingress {
                flags = flags | cellium_datapath_bpf::EndpointFlags::ENFORCE_INGRESS;
            }
            if enforcement.egress {
                flags = flags | cellium_datapath_bpf::EndpointFlags::ENFORCE_EGRESS;
            }
            maps.endpoints.insert(
                addr.ip,
                EndpointInfo {
                    ifindex: ep.host_ifindex,
                    id: ep.id,
                    flags,
                    identity: ep.identity,
                    host_mac: MacAddr(ep.host_mac),
                    pod_mac: MacAddr(ep.pod_mac),
                },
            );
        }
        Ok(())
    }

    fn read_enforcement(&self, ep: &Endpoint) -> Enforcement {
        let maps = lock(&self.state);
        let flags = ep
            .addresses
            .iter()
            .find_map(|a| maps.endpoints.get(&a.ip))
            .filter(|i| i.id == ep.id)
            .map_or(0, |i| i.flags.0);
        Enforcement {
            ingress: flags & cellium_datapath_bpf::EndpointFlags::ENFORCE_INGRESS.0 != 0,
            egress: flags & cellium_datapath_bpf::EndpointFlags::ENFORCE_EGRESS.0 != 0,
        }
    }

    fn apply_policy(
        &self,
        id: u16,
        current: &[(PolicyEntry, Verdict)],
        desired: &[(PolicyEntry, Verdict)],
    ) -> cellium_datapath_bpf::Result<()> {
        self.fault("apply_policy", format!("{id} ({} entries)", desired.len()))?;
        let mut maps = lock(&self.state);
        for (e, v) in desired {
            maps.policy.insert(*e, *v);
        }
        for (e, _) in current {
            if !desired.iter().any(|(d, _)| d == e) {
                maps.policy.remove(e);
            }
        }
        Ok(())
    }

    fn attach(&self, ifindex: u32) -> cellium_datapath_bpf::Result<()> {
        self.fault("attach", ifindex.to_string())?;
        lock(&self.state).attached.insert(ifindex);
        Ok(())
    }

    fn unprogram(&self, ep: &Endpoint) -> cellium_datapath_bpf::Result<()> {
        self.fault("unprogram", ep.id.to_string())?;
        let mut maps = lock(&self.state);
        for addr in &ep.addresses {
            if maps.endpoints.get(&addr.ip).is_some_and(|i| i.id == ep.id) {
                maps.endpoints.remove(&addr.ip);
            }
        }
        maps.policy.retain(|e, _| e.endpoint_id != ep.id);
        if ep.host_ifindex != 0 {
            maps.attached.remove(&ep.host_ifindex);
        }
        Ok(())
    }

    fn endpoint_entry(&self, ip: IpAddr) -> cellium_datapath_bpf::Result<Option<EndpointInfo>> {
        self.fault("endpoint_entry", ip.to_string())?;
        Ok(lock(&self.state).endpoints.get(&ip).copied())
    }

    fn endpoint_entries(&self) -> cellium_datapath_bpf::Result<Vec<(IpAddr, EndpointInfo)>> {
        self.fault("endpoint_entries", String::new())?;
        Ok(lock(&self.state)
            .endpoints
            .iter()
            .map(|(ip, i)| (*ip, *i))
            .collect())
    }

    fn delete_endpoint_entry(&self, ip: IpAddr) -> cellium_datapath_bpf::Result<bool> {
        self.fault("delete_endpoint_entry", ip.to_string())?;
        Ok(lock(&self.state).endpoints.remove(&ip).is_some())
    }

    fn policy_entries(&self) -> cellium_datapath_bpf::Result<Vec<(PolicyEntry, Verdict)>> {
        self.fault("policy_entries", String::new())?;
        Ok(lock(&self.state)
            .policy
            .iter()
            .map(|(e, v)| (*e, *v))
            .collect())
    }

    fn clear_policy(&self, id: u16) -> cellium_datapath_bpf::Result<usize> {
        self.fault("clear_policy", id.to_string())?;
        let mut maps = lock(&self.state);
        let before = maps.policy.len();
        maps.policy.retain(|e, _| e.endpoint_id != id);
        Ok(before - maps.policy.len())
    }

    fn attached(&self) -> cellium_datapath_bpf::Result<Vec<u32>> {
        self.fault("attached", String::new())?;
        Ok(lock(&self.state).attached.iter().copied().collect())
    }

    fn detach(&self, ifindex: u32) -> cellium_datapath_bpf::Result<()> {
        self.fault("detach", ifindex.to_string())?;
        lock(&self.state).attached.remove(&ifindex);
        Ok(())
    }
}

/// A manager on the fakes, with a state directory of its own and the module's health.
pub(crate) struct Harness {
    pub(crate) manager: Arc<EndpointManager>,
    pub(crate) interfaces: Arc<FakeInterfaces>,
    pub(crate) datapath: Arc<FakeDatapath>,
    pub(crate) journal: Journal,
    pub(crate) faults: Faults,
    pub(crate) ipam: Arc<Ipam>,
    pub(crate) identities: Arc<Identities>,
    pub(crate) ipcache: Arc<Ipcache>,
    pub(crate) resources: Arc<Resources>,
    pub(crate) policy: Arc<PolicyRepository>,
    pub(crate) dir: tempfile::TempDir,
    state_dir: Arc<StateDir>,
    health: Health,
    reporter: Reporter,
    cfg: EndpointConfig,
}

impl Harness {
    /// A manager over the pod CIDR 10.244.0.0/24, not started.
    pub(crate) fn new() -> Harness {
        Harness::with(EndpointConfig::default(), &["10.244.0.0/24"])
    }

    /// A manager with `cfg` over `cidrs`, not started.
    pub(crate) fn with(cfg: EndpointConfig, cidrs: &[&str]) -> Harness {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (health, reporter) = module_reporter();
        let journal = Journal::default();
        let faults = Faults::default();
        let interfaces = Arc::new(FakeInterfaces {
            journal: journal.clone(),
            faults: faults.clone(),
            state: Mutex::default(),
        });
        let datapath = Arc::new(FakeDatapath {
            journal: journal.clone(),
            faults: faults.clone(),
            state: Mutex::default(),
        });
        let pools: Vec<_> = cidrs
            .iter()
            .map(|c| c.parse().expect("a literal CIDR"))
            .collect();
        let ipam = Arc::new(Ipam::with_pools(&pools, "config").expect("valid pools"));
        let identities = Identities::in_memory();
        let ipcache = Ipcache::in_memory();
        let resources = Resources::new();
        let state_dir = Arc::new(StateDir::open_at(dir.path()).expect("a state directory"));
        let policy = Arc::new(PolicyRepository::with_parts(identities.clone(), None, None));
        Harness {
            manager: Arc::new(EndpointManager::with_parts(Parts {
                cfg: Config::new(cfg.clone()),
                ipam: ipam.clone(),
                resources: resources.clone(),
                state_dir: state_dir.clone(),
                identities: identities.clone(),
                ipcache: ipcache.clone(),
                policy: policy.clone(),
                reporter: reporter.clone(),
            })),
            policy,
            interfaces,
            datapath,
            journal,
            faults,
            ipam,
            identities,
            ipcache,
            resources,
            dir,
            health,
            state_dir,
            reporter,
            cfg,
        }
    }

    /// A new manager over the harness's IPAM, identities, ipcache, resources, state directory
    /// and fakes.
    fn rebuild(&mut self) {
        self.manager = Arc::new(EndpointManager::with_parts(Parts {
            cfg: Config::new(self.cfg.clone()),
            ipam: self.ipam.clone(),
            resources: self.resources.clone(),
            state_dir: self.state_dir.clone(),
            identities: self.identities.clone(),
            ipcache: self.ipcache.clone(),
            policy: self.policy.clone(),
            reporter: self.reporter.clone(),
        }));
    }

    /// The backends the manager writes through.
    pub(crate) fn backends(&self) -> Backends {
        Backends {
            interfaces: self.interfaces.clone(),
            datapath: self.datapath.clone(),
        }
    }

    /// Starts the manager: the restore over the fakes. Returns the restore's summary.
    pub(crate) async fn start(&self) -> crate::Result<String> {
        self.manager
            .restore(self.backends(), async { Ok(()) })
            .await
    }

    /// A new agent on the same state directory and node (fakes), with empty memory (IPAM,
    /// identities, tables), as after a restart; with `cidrs` as its pod CIDRs.
    pub(crate) fn restart(&mut self, cidrs: &[&str]) {
        let pools: Vec<_> = cidrs
            .iter()
            .map(|c| c.parse().expect("a literal CIDR"))
            .collect();
        self.ipam = Arc::new(Ipam::with_pools(&pools, "config").expect("valid pools"));
        self.identities = Identities::in_memory();
        self.ipcache = Ipcache::in_memory();
        self.policy = Arc::new(PolicyRepository::with_parts(
            self.identities.clone(),
            None,
            None,
        ));
        self.rebuild();
    }

    /// Sets the configuration of the managers [`Harness::restart`] makes.
    pub(crate) fn configure(&mut self, cfg: EndpointConfig) {
        self.cfg = cfg;
    }

    /// An ADD of `container` into a network namespace that exists.
    pub(crate) fn request(&self, container: &str) -> CreateRequest {
        let netns = PathBuf::from(format!("/run/netns/{container}"));
        self.interfaces.add_netns(&netns);
        CreateRequest {
            container_id: container.into(),
            netns,
            ifname: "eth0".into(),
            pod: None,
            requested_ips: Vec::new(),
            network: "cellium".into(),
            mtu: None,
        }
    }

    /// An ADD of `container` for pod `default/<pod>` labelled `app=<app>` (applied first).
    pub(crate) fn pod_request(&self, container: &str, pod: &str, app: &str) -> CreateRequest {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: default, labels: {{app: {app}}}}}\nspec: {{containers: [{{name: c}}]}}\n"
        );
        self.resources
            .apply("test.yaml", &yaml)
            .expect("a valid pod");
        CreateRequest {
            pod: Some(crate::endpoint::PodRef {
                namespace: "default".into(),
                name: pod.into(),
            }),
            ..self.request(container)
        }
    }

    /// Notes the records on disk (`1=ready 2=creating`) with every backend call.
    pub(crate) fn observe_records(&self) {
        let dir = self.dir.path().join("endpoints");
        self.journal.observe(move || {
            let mut seen: Vec<String> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let id = name.strip_suffix(".json")?.to_string();
                    let bytes = std::fs::read(e.path()).ok()?;
                    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
                    Some(format!("{id}={}", v["state"].as_str().unwrap_or("?")))
                })
                .collect();
            seen.sort();
            format!("records: {}", seen.join(" "))
        });
    }

    /// How many references identity `identity` has (0 when it is gone).
    pub(crate) fn references(&self, identity: u32) -> u64 {
        self.identities.info(identity).map_or(0, |i| i.references)
    }

    /// Writes `ep`'s record as a previous run would have, with its pod's namespace and host
    /// end present (unless it is `Creating`).
    pub(crate) fn write_record(&self, ep: &Endpoint) {
        let dir = self.dir.path().join("endpoints");
        std::fs::create_dir_all(&dir).expect("the records' directory");
        let bytes = serde_json::to_vec(ep).expect("a record serializes");
        std::fs::write(dir.join(format!("{}.json", ep.id)), bytes).expect("write a record");
        self.interfaces.add_netns(&ep.netns);
        self.interfaces.add_link(&ep.host_ifname, ep.host_ifindex);
    }

    /// The state of endpoint `id`'s record on disk (`None`: no record).
    pub(crate) fn record_state(&self, id: u16) -> Option<String> {
        let bytes = std::fs::read(self.dir.path().join(format!("endpoints/{id}.json"))).ok()?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        value["state"].as_str().map(str::to_string)
    }

    /// Makes the records' directory unwritable for real (a file where it should be) until
    /// [`Harness::heal_records`]; returns what to give back.
    pub(crate) fn break_records(&self) -> PathBuf {
        let dir = self.dir.path().join("endpoints");
        let aside = self.dir.path().join("endpoints.aside");
        std::fs::create_dir_all(&dir).expect("the records' directory");
        std::fs::rename(&dir, &aside).expect("move the records aside");
        std::fs::write(&dir, b"not a directory").expect("a file in the way");
        aside
    }

    /// Undoes [`Harness::break_records`].
    pub(crate) fn heal_records(&self, aside: &Path) {
        let dir = self.dir.path().join("endpoints");
        std::fs::remove_file(&dir).expect("remove the file in the way");
        std::fs::rename(aside, &dir).expect("put the records back");
    }

    /// Who IPAM says holds `ip`.
    pub(crate) fn owner(&self, ip: &str) -> Option<String> {
        self.ipam.owner(ip.parse().expect("a literal address"))
    }

    /// The health of `endpoint-manager.<child>` (or of the module with `""`).
    pub(crate) fn health(&self, child: &str) -> Option<(Level, String)> {
        let id = if child.is_empty() {
            "endpoint-manager".to_string()
        } else {
            format!("endpoint-manager.{child}")
        };
        self.health
            .node(&id)
            .map(|n| (n.status.level, n.status.message))
    }
}

/// The reporter of a module `endpoint-manager` of a hive that only exists for it.
fn module_reporter() -> (Health, Reporter) {
    let slot: Arc<Mutex<Option<Reporter>>> = Arc::default();
    let put = slot.clone();
    let mut hive = Hive::new([
        Module::new("endpoint-manager", "The endpoint manager under test")
            .invoke(move |r: Reporter| {
                *lock(&put) = Some(r);
            })
            .into(),
    ]);
    hive.populate().expect("a hive of one module");
    let reporter = lock(&slot).take().expect("the invoke ran");
    (hive.health(), reporter)
}

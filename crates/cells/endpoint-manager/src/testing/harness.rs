//! A manager on the fakes, as the unit tests of the flows use it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cellium_hive::{Config, Health, Hive, Level, Module, Reporter};
use cellium_identity::Identities;
use cellium_ipam::Ipam;
use cellium_ipcache::Ipcache;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use cellium_statedir::StateDir;

use super::{FakeDatapath, FakeInterfaces, Faults, Journal, lock};
use crate::config::EndpointConfig;
use crate::endpoint::Endpoint;
use crate::manager::{Backends, EndpointManager, Parts};
use crate::plumbing::PodNetns;
use crate::request::CreateRequest;

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
    /// Whether the manager is given resources, identities, ipcache and policy repository (the
    /// harness keeps them either way, to show that they are left alone).
    full: bool,
}

impl Harness {
    /// A manager over the pod CIDR 10.244.0.0/24, not started.
    pub(crate) fn new() -> Harness {
        Harness::with(EndpointConfig::default(), &["10.244.0.0/24"])
    }

    /// A manager over the pod CIDR 10.244.0.0/24 as an agent of connectivity only builds it:
    /// without resources, identities, ipcache and policy repository. Not started.
    pub(crate) fn connectivity_only() -> Harness {
        let mut h = Harness::new();
        h.without_optional_cells();
        h.rebuild();
        h
    }

    /// From the next [`Harness::restart`] on, the manager is built without resources,
    /// identities, ipcache and policy repository.
    pub(crate) fn without_optional_cells(&mut self) {
        self.full = false;
    }

    /// A manager with `cfg` over `cidrs`, not started.
    pub(crate) fn with(cfg: EndpointConfig, cidrs: &[&str]) -> Harness {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (health, reporter) = module_reporter();
        let journal = Journal::default();
        let faults = Faults::default();
        let interfaces = Arc::new(FakeInterfaces::new(&journal, &faults));
        let datapath = Arc::new(FakeDatapath::new(&journal, &faults));
        let pools: Vec<_> = cidrs
            .iter()
            .map(|c| c.parse().expect("a literal CIDR"))
            .collect();
        let ipam = Arc::new(Ipam::with_pools(&pools, "config").expect("valid pools"));
        let identities = Identities::in_memory();
        let ipcache = Ipcache::in_memory();
        let resources = Resources::new();
        let state_dir = Arc::new(StateDir::open_at(dir.path()).expect("a state directory"));
        let policy = Arc::new(PolicyRepository::with_parts(
            identities.clone(),
            Some(ipcache.clone()),
            None,
        ));
        Harness {
            manager: Arc::new(EndpointManager::with_parts(Parts {
                cfg: Config::new(cfg.clone()),
                ipam: ipam.clone(),
                resources: Some(resources.clone()),
                state_dir: state_dir.clone(),
                identities: Some(identities.clone()),
                ipcache: Some(ipcache.clone()),
                policy: Some(policy.clone()),
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
            full: true,
        }
    }

    /// A new manager over the harness's IPAM, identities, ipcache, resources, state directory
    /// and fakes.
    fn rebuild(&mut self) {
        self.manager = Arc::new(EndpointManager::with_parts(Parts {
            cfg: Config::new(self.cfg.clone()),
            ipam: self.ipam.clone(),
            resources: self.full.then(|| self.resources.clone()),
            state_dir: self.state_dir.clone(),
            identities: self.full.then(|| self.identities.clone()),
            ipcache: self.full.then(|| self.ipcache.clone()),
            policy: self.full.then(|| self.policy.clone()),
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
            Some(self.ipcache.clone()),
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
        let path = format!("/run/netns/{container}");
        self.interfaces.add_netns(&path);
        CreateRequest {
            container_id: container.into(),
            netns: PodNetns::unchecked(&path),
            ifname: "eth0".into(),
            pod: None,
            requested_ips: Vec::new(),
            network: "cellium".into(),
            mtu: None,
            port_mappings: Vec::new(),
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
        self.interfaces.add_link(&ep.host_ifname, ep.host_ifindex);
        self.interfaces.connect(&ep.netns, &ep.host_ifname);
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

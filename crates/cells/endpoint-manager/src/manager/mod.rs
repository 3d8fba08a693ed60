//! The endpoint manager: the node's endpoints and the flows that change them.
//!
//! The manager composes components that keep their own state: the in-memory table
//! ([`Endpoints`]), the records on disk ([`Store`]), identities ([`Identifier`]), what the
//! datapath enforces ([`Enforcement`]), what regenerations still owe ([`Regeneration`]), and the two
//! backends it writes through ([`Interfaces`], [`EndpointDatapath`]). The flows live in the
//! submodules, one concept each: `create`, `delete`, `teardown` (the one removal every flow
//! uses), `regenerate`, `restore`. See `docs/endpoints.md` for the states and the order of
//! every flow.

mod create;
mod delete;
pub(crate) mod regenerate;
mod restore;
mod spares;
mod teardown;

use std::sync::{Arc, OnceLock};

use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter, Trigger};
use cellium_identity::Identities;
use cellium_ipam::Ipam;
use cellium_ipcache::Ipcache;
use cellium_loader::Loader;
use cellium_metrics::Metrics;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use cellium_statedir::StateDir;
use tokio::sync::watch;

use crate::config::EndpointConfig;
use crate::datapath::EndpointDatapath;
use crate::endpoint::Endpoint;
use crate::enforcement::{Enforced, Enforcement};
use crate::error::{Error, Result};
use crate::identity::{Identifier, UNALLOCATED};
use crate::interfaces::Interfaces;
use crate::store::Store;
use crate::table::Endpoints;

use regenerate::Regeneration;
use teardown::Removals;

/// What the manager writes through, set once the node and the datapath are ready (at start).
#[derive(Clone)]
pub(crate) struct Backends {
    /// Pods' interfaces (netlink).
    pub(crate) interfaces: Arc<dyn Interfaces>,
    /// The datapath's maps and programs.
    pub(crate) datapath: Arc<dyn EndpointDatapath>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends").finish_non_exhaustive()
    }
}

/// The endpoints of this node.
///
/// Every create is recorded on disk (state `Creating`) before the kernel is touched and
/// marked `Ready` once the datapath enforces it; every delete is recorded (state `Deleting`)
/// before the kernel is touched and the record removed last. So after a crash the restore
/// can tell what finished from what did not, and finish the job.
#[derive(Debug)]
pub struct EndpointManager {
    cfg: Config<EndpointConfig>,
    ipam: Arc<Ipam>,
    store: Store,
    endpoints: Endpoints,
    identity: Identifier,
    enforcement: Enforcement,
    regeneration: Regeneration,
    removals: Removals,
    reporter: Reporter,
    backends: OnceLock<Backends>,
    /// Pulled when an endpoint comes or goes: the `spare-policy-maps` job keeps spare policy maps
    /// for the next ids and takes retired ones out (see `spares`).
    policy_maps: Trigger,
    /// The tables pods' labels come from, when the agent has them.
    resources: Option<Arc<Resources>>,
    /// What the manager does without the optional collaborators it lacks (`None`: it has
    /// them all), as `endpoint-manager.scope` states it.
    scope: Option<String>,
}

/// The collaborators of the manager, as the constructor and the tests hand them over. The
/// optional ones belong to cells an agent may be built without (see [`EndpointManager::new`]).
pub(crate) struct Parts {
    pub(crate) cfg: Config<EndpointConfig>,
    pub(crate) ipam: Arc<Ipam>,
    pub(crate) resources: Option<Arc<Resources>>,
    pub(crate) state_dir: Arc<StateDir>,
    pub(crate) identities: Option<Arc<Identities>>,
    pub(crate) ipcache: Option<Arc<Ipcache>>,
    pub(crate) policy: Option<Arc<PolicyRepository>>,
    pub(crate) reporter: Reporter,
}

impl Parts {
    /// What an agent without some of the optional cells does without them, one clause each,
    /// for the module's health; `None` when every one is there.
    fn missing(&self) -> Option<String> {
        let clauses: Vec<String> = [
            self.policy.is_none().then(|| {
                "no policy repository: no direction is enforced, every endpoint's traffic is allowed".to_string()
            }),
            self.identities.is_none().then(|| {
                format!(
                    "no identities: every endpoint has identity {} ({})",
                    UNALLOCATED.id(),
                    UNALLOCATED.labels()
                )
            }),
            self.resources.is_none().then(|| {
                "no resources: a pod's labels are only its namespace, as the runtime named it"
                    .to_string()
            }),
            self.ipcache.is_none().then(|| {
                "no ipcache: pods' addresses are not published to the datapath's ipcache"
                    .to_string()
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!clauses.is_empty()).then(|| clauses.join("; "))
    }
}

impl EndpointManager {
    /// Declares the manager; endpoints are restored by its start hook, and its regeneration
    /// jobs start after it.
    ///
    /// `resources`, `identities`, `ipcache` and `policy` are optional, so that an agent of
    /// connectivity only (statedir, loader, ipam, endpoint-manager, api-server) can be built
    /// without them. What each absence means (no direction enforced, identity
    /// `reserved:init`, labels from the runtime only, no ipcache entries) is stated on the
    /// module's health node `endpoint-manager.scope`, which only such an agent has.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: Config<EndpointConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        ipam: Arc<Ipam>,
        loader: Arc<Loader>,
        resources: Option<Arc<Resources>>,
        state_dir: Arc<StateDir>,
        identities: Option<Arc<Identities>>,
        ipcache: Option<Arc<Ipcache>>,
        policy: Option<Arc<PolicyRepository>>,
        metrics: Option<Arc<Metrics>>,
    ) -> Arc<EndpointManager> {
        let manager = Arc::new(EndpointManager::with_parts(Parts {
            cfg,
            ipam,
            resources: resources.clone(),
            state_dir,
            identities: identities.clone(),
            ipcache,
            policy: policy.clone(),
            reporter,
        }));
        if let Some(metrics) = metrics {
            metrics.register(
                "endpoint_policy_map_overflow",
                "Endpoints locked down because their policy needs more entries than bpf-policy-map-max",
                manager.enforcement.overflow_gauge(),
            );
        }
        let this = manager.clone();
        // Restored endpoints re-reserve their addresses here, before the API serves any CNI ADD
        // (the API server starts after every cell whose service it mounts): that order is what
        // keeps an address from being handed out twice across a restart.
        lc.append(
            Hook::new("restore-endpoints").on_start(move |_| async move {
                this.start(&loader).await?;
                this.report_scope();
                Ok(())
            }),
        );
        // Jobs added here start right after the hook above: regeneration never runs before
        // the restore.
        regenerate::start(
            &jobs,
            manager.clone(),
            policy.as_deref(),
            resources.as_deref(),
            identities.as_deref(),
        );
        spares::start(&jobs, manager.clone());
        manager
    }

    pub(crate) fn with_parts(parts: Parts) -> EndpointManager {
        let policy_map_max = parts.cfg.bpf_policy_map_max;
        let cluster = parts.cfg.cluster_name.clone();
        EndpointManager {
            scope: parts.missing(),
            cfg: parts.cfg,
            ipam: parts.ipam,
            store: Store(parts.state_dir),
            endpoints: Endpoints::default(),
            identity: Identifier::new(
                parts.resources.clone(),
                parts.policy.clone(),
                parts.identities,
                parts.ipcache.clone(),
                cluster,
            ),
            enforcement: Enforcement::new(
                parts.policy,
                parts.resources.clone(),
                parts.ipcache,
                policy_map_max,
                parts.reporter.child("policy-maps"),
            ),
            regeneration: Regeneration::default(),
            removals: Removals::new(parts.reporter.child("removals")),
            reporter: parts.reporter,
            backends: OnceLock::new(),
            policy_maps: Trigger::new(),
            resources: parts.resources,
        }
    }

    /// A counter bumped whenever an endpoint is created (ready), deleted or removed, or gets a
    /// new identity (its labels changed), and once when the endpoints are restored at start: for consumers that derive state from the
    /// endpoint list (service backends, say) and re-read it with [`EndpointManager::list`].
    ///
    /// Trap: it says that something changed, not what; and a receiver made before the
    /// restore sees the restored endpoints only through that one bump.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.endpoints.changes()
    }

    /// Every endpoint, by id.
    pub fn list(&self) -> Vec<Endpoint> {
        self.snapshot()
            .into_iter()
            .map(Arc::unwrap_or_clone)
            .collect()
    }

    /// Every endpoint, by id, as the shared records the manager holds (cheap: no copy).
    pub fn snapshot(&self) -> Vec<Arc<Endpoint>> {
        self.endpoints.snapshot()
    }

    /// The endpoint with `id`.
    pub fn get(&self, id: u16) -> Option<Endpoint> {
        self.endpoints.get(id).map(Arc::unwrap_or_clone)
    }

    /// The endpoint of (`container_id`, `ifname`).
    pub fn find(&self, container_id: &str, ifname: &str) -> Option<Endpoint> {
        self.endpoints
            .find(container_id, ifname)
            .map(Arc::unwrap_or_clone)
    }

    /// The policy endpoint `id`'s datapath entries were last written from, once computed.
    pub fn policy_of(&self, id: u16) -> Option<Arc<cellium_policy_repo::EndpointPolicy>> {
        self.enforcement.table().get(id)?.policy
    }

    /// What the datapath enforces for endpoint `id`.
    pub(crate) fn enforced_of(&self, id: u16) -> Option<Enforced> {
        self.enforcement.table().get(id)
    }

    /// The labels of identity `id`, as text.
    pub(crate) fn identity_labels(&self, id: u32) -> Vec<String> {
        self.identity.labels_of(id)
    }

    /// States on `endpoint-manager.scope` what the manager does without the optional cells
    /// the agent lacks; a full agent has no such node.
    pub(crate) fn report_scope(&self) {
        if let Some(scope) = &self.scope {
            tracing::info!(%scope, "endpoints without some of the optional cells");
            self.reporter.child("scope").ok(scope);
        }
    }

    /// The backends, once started.
    fn backends(&self) -> Result<&Backends> {
        self.backends.get().ok_or(Error::NotStarted)
    }
}

#[cfg(test)]
mod tests {
    use cellium_hive::Level;
    use cellium_labels::{Label, Labels, POLICY_CLUSTER_LABEL};

    use crate::testing::Harness;

    const DENY_ALL_INGRESS: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: default}
spec: {podSelector: {}}
";

    #[tokio::test]
    async fn without_the_optional_cells_an_endpoint_is_connected_enforcing_nothing() {
        let h = Harness::connectivity_only();
        h.start().await.unwrap();
        // The pod's labels are in the resources the harness keeps, which the manager has not.
        let ep = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        assert_eq!(ep.identity, 5, "reserved:init");
        let mut expected = Labels::for_pod("default", &Default::default(), &Default::default());
        expected.insert(Label::k8s(POLICY_CLUSTER_LABEL, "default"));
        assert_eq!(
            ep.labels, expected,
            "only the namespace the runtime named, and the cluster"
        );
        assert_eq!(
            h.journal
                .only(&["setup_pod", "write_endpoint", "apply_policy", "attach "]),
            [
                &format!("setup_pod {}", ep.host_ifname),
                "write_endpoint 1 ingress=false egress=false",
                "apply_policy 1 (0 entries)",
                "attach 1",
            ]
        );
        assert_eq!(h.datapath.entries()[&ep.addresses[0].ip].identity, 5);
        let enforced = h.manager.enforced_of(ep.id).unwrap();
        assert!(!enforced.enforcement.ingress && !enforced.enforcement.egress);
        assert_eq!(h.manager.identity_labels(5), ["reserved:init"]);
        // Nothing reached the cells the manager was built without.
        assert!(h.identities.list().iter().all(|i| i.references == 0));
        assert!(h.ipcache.lookup(ep.addresses[0].ip).is_none());

        // A regeneration finds nothing to change; a DEL removes everything.
        h.journal.clear();
        let pass = h.manager.regenerate_all().await;
        assert_eq!((pass.done, pass.failed.len()), (1, 0));
        assert!(h.journal.calls().is_empty(), "{:?}", h.journal.calls());
        assert!(h.manager.delete("a", "eth0").await.unwrap());
        assert_eq!(h.record_state(ep.id), None);
        assert_eq!(h.owner("10.244.0.2"), None);
        assert!(h.interfaces.links().is_empty() && h.datapath.entries().is_empty());
    }

    #[tokio::test]
    async fn an_endpoint_restored_without_a_policy_repository_stops_enforcing_its_old_policy() {
        let mut h = Harness::new();
        h.resources.apply("np.yaml", DENY_ALL_INGRESS).unwrap();
        h.policy.sync_resources(&h.resources);
        h.start().await.unwrap();
        let ep = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        assert!(h.manager.enforced_of(ep.id).unwrap().enforcement.ingress);
        assert_eq!(h.datapath.policy_ids(), [ep.id].into());

        h.without_optional_cells();
        h.restart(&["10.244.0.0/24"]);
        let summary = h.start().await.unwrap();
        assert!(summary.starts_with("1 endpoints restored"), "{summary}");
        let entry = h.datapath.entries()[&ep.addresses[0].ip];
        assert_eq!(
            entry.flags,
            cellium_datapath_bpf::EndpointFlags::NONE,
            "no direction enforced"
        );
        assert_eq!(entry.identity, 5);
        assert!(
            h.datapath.policy_ids().is_empty(),
            "its old entries removed"
        );
        assert_eq!(h.record_state(ep.id).as_deref(), Some("ready"));
    }

    /// A NetworkPolicy letting `app` in on `ports` separate ports (one entry each).
    fn ports_policy(app: &str, ports: u16) -> String {
        let list: Vec<String> = (0..ports)
            .map(|i| format!("{{port: {}}}", 1000 + 2 * i))
            .collect();
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {app}, namespace: default}}\nspec:\n  podSelector: {{matchLabels: {{app: {app}}}}}\n  ingress: [{{ports: [{}]}}]\n",
            list.join(", ")
        )
    }

    #[tokio::test]
    async fn a_policy_over_the_limit_locks_its_endpoint_alone_down_until_it_fits() {
        let cfg = crate::config::EndpointConfig {
            bpf_policy_map_max: 4,
            ..Default::default()
        };
        let h = Harness::with(cfg, &["10.244.0.0/24"]);
        h.resources
            .apply("web.yaml", &ports_policy("web", 10))
            .unwrap();
        h.resources
            .apply("db.yaml", &ports_policy("db", 2))
            .unwrap();
        h.policy.sync_resources(&h.resources);
        h.start().await.unwrap();
        let web = h
            .manager
            .create(h.pod_request("w", "w", "web"))
            .await
            .unwrap();
        let db = h
            .manager
            .create(h.pod_request("d", "d", "db"))
            .await
            .unwrap();

        let locked = h.manager.enforced_of(web.id).unwrap();
        assert!(
            locked.enforcement.ingress && locked.enforcement.egress,
            "both ways closed"
        );
        assert!(locked.entries.is_empty());
        assert!(
            !h.datapath.policy_ids().contains(&web.id),
            "no entry written"
        );
        let view = crate::grpc::view(&h.manager, &h.manager.get(web.id).unwrap(), false);
        assert!(
            view.status_message.starts_with("locked down: its policy needs 11 policy map entries, more than bpf-policy-map-max (4)"),
            "{}",
            view.status_message
        );
        let (level, message) = h.health("policy-maps").unwrap();
        assert_eq!(level, Level::Ok, "new pods' ADD goes on");
        assert!(
            message.contains(&format!("endpoint {} needs 11", web.id)),
            "{message}"
        );
        // The other endpoint enforces its own policy.
        let other = h.manager.enforced_of(db.id).unwrap();
        // Its two ports and the node's access.
        assert_eq!(other.entries.len(), 3);
        assert!(other.overflow.is_none());
        assert_eq!(h.datapath.policy_ids(), [db.id].into());

        // The policy shrinks: the endpoint enforces it again.
        h.resources
            .apply("web.yaml", &ports_policy("web", 3))
            .unwrap();
        h.policy.sync_resources(&h.resources);
        let pass = h.manager.regenerate_all().await;
        assert!(pass.failed.is_empty(), "{:?}", pass.failed);
        let freed = h.manager.enforced_of(web.id).unwrap();
        assert!(freed.overflow.is_none());
        assert_eq!(freed.entries.len(), 4, "exactly the limit fits");
        assert!(freed.enforcement.ingress && !freed.enforcement.egress);
        assert_eq!(h.datapath.policy_ids(), [web.id, db.id].into());
        let view = crate::grpc::view(&h.manager, &h.manager.get(web.id).unwrap(), false);
        assert_eq!(view.status_message, "");
        let (_, message) = h.health("policy-maps").unwrap();
        assert!(
            message.starts_with("every endpoint's policy fits"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn the_scope_node_states_what_each_missing_cell_changes_and_only_then() {
        let h = Harness::connectivity_only();
        h.manager.report_scope();
        let (level, message) = h.health("scope").expect("a scope node");
        assert_eq!(level, Level::Ok);
        for clause in [
            "no policy repository: no direction is enforced, every endpoint's traffic is allowed",
            "no identities: every endpoint has identity 5 (reserved:init)",
            "no resources: a pod's labels are only its namespace",
            "no ipcache: pods' addresses are not published",
        ] {
            assert!(message.contains(clause), "{clause} not in {message}");
        }

        let full = Harness::new();
        full.manager.report_scope();
        assert_eq!(full.health("scope"), None, "a full agent has no such node");
    }
}

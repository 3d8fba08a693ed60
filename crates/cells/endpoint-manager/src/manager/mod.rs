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
mod teardown;

use std::sync::{Arc, OnceLock};

use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter};
use cellium_identity::Identities;
use cellium_ipam::Ipam;
use cellium_ipcache::Ipcache;
use cellium_loader::Loader;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use cellium_statedir::StateDir;
use tokio::sync::watch;

use crate::config::EndpointConfig;
use crate::datapath::EndpointDatapath;
use crate::endpoint::Endpoint;
use crate::enforcement::{Enforced, Enforcement};
use crate::error::{Error, Result};
use crate::identity::Identifier;
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
}

/// The collaborators of the manager, as the constructor and the tests hand them over.
pub(crate) struct Parts {
    pub(crate) cfg: Config<EndpointConfig>,
    pub(crate) ipam: Arc<Ipam>,
    pub(crate) resources: Arc<Resources>,
    pub(crate) state_dir: Arc<StateDir>,
    pub(crate) identities: Arc<Identities>,
    pub(crate) ipcache: Arc<Ipcache>,
    pub(crate) policy: Arc<PolicyRepository>,
    pub(crate) reporter: Reporter,
}

impl EndpointManager {
    /// Declares the manager; endpoints are restored by its start hook, and its regeneration
    /// jobs start after it.
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
        let manager = Arc::new(EndpointManager::with_parts(Parts {
            cfg,
            ipam,
            resources: resources.clone(),
            state_dir,
            identities,
            ipcache,
            policy: policy.clone(),
            reporter,
        }));
        let this = manager.clone();
        // Restored endpoints re-reserve their addresses here, before the API serves any CNI ADD
        // (the API server starts after every cell whose service it mounts): that order is what
        // keeps an address from being handed out twice across a restart.
        lc.append(
            Hook::new("restore-endpoints")
                .on_start(move |_| async move { this.start(&loader).await }),
        );
        // Jobs added here start right after the hook above: regeneration never runs before
        // the restore.
        regenerate::start(&jobs, manager.clone(), &policy, &resources);
        manager
    }

    pub(crate) fn with_parts(parts: Parts) -> EndpointManager {
        EndpointManager {
            cfg: parts.cfg,
            ipam: parts.ipam,
            store: Store(parts.state_dir),
            endpoints: Endpoints::default(),
            identity: Identifier::new(
                parts.resources.clone(),
                parts.policy.clone(),
                parts.identities,
                parts.ipcache.clone(),
            ),
            enforcement: Enforcement::new(parts.policy, parts.resources, parts.ipcache),
            regeneration: Regeneration::default(),
            removals: Removals::new(parts.reporter.child("removals")),
            reporter: parts.reporter,
            backends: OnceLock::new(),
        }
    }

    /// A counter bumped whenever an endpoint is created (ready), deleted or removed, and once
    /// when the endpoints are restored at start: for consumers that derive state from the
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

    /// What the datapath enforces for endpoint `id`.
    pub(crate) fn enforced_of(&self, id: u16) -> Option<Enforced> {
        self.enforcement.table().get(id)
    }

    /// The labels of identity `id`, as text.
    pub(crate) fn identity_labels(&self, id: u32) -> Vec<String> {
        self.identity.labels_of(id)
    }

    /// The backends, once started.
    fn backends(&self) -> Result<&Backends> {
        self.backends.get().ok_or(Error::NotStarted)
    }
}

//! The `endpoint-manager` cell: one endpoint per pod interface.
//!
//! - **Owns** the endpoints: their ids, records (one JSON file each under `endpoints/` in the
//!   state directory, written atomically), veth pairs, routes and datapath entries.
//! - **Provides** `Arc<EndpointManager>` (create, delete, check, gc, list, get, and
//!   `changes`, a counter bumped when endpoints come and go or change identity) and the
//!   `cellium.v1.Endpoints` gRPC service the CNI plugin and `cellium endpoint` call.
//!   `create` returns only once the datapath enforces the endpoint; `create` and `delete`
//!   are all or nothing (recorded before the kernel is touched, finished or undone by the
//!   next attempt or the restore).
//! - **Depends on** ipam (addresses), loader (the datapath), statedir (records); and,
//!   optionally, so that an agent of connectivity only can be built without them (see
//!   `crates/hive/README.md`, "Embedding"):
//!   - policy-repo: without it no direction is enforced, so every endpoint's traffic is
//!     allowed (and a restored endpoint's old policy entries are removed);
//!   - identity: without it every endpoint has identity 5, `reserved:init`;
//!   - resources: without it a pod's labels are only the namespace the runtime named;
//!   - ipcache: without it pods' addresses are not published in `cel_ipcache`.
//!
//!   What the agent lacks is stated on the health node `endpoint-manager.scope`.
//! - **Config keys:** `mtu` (default 1500), `remove-endpoints-outside-pod-cidr` (default
//!   false: restored endpoints outside the pod CIDRs stop the start, naming them).
//! - **Degraded** (`endpoint-manager.restore`) when a record cannot be read or listed at
//!   start (what may be its own is kept, nothing is swept) or a leftover cannot be removed;
//!   (`.regenerate`) while an endpoint's regeneration fails (retried with backoff);
//!   (`.removals`) while an endpoint is not fully removed.
//!
//! At start it restores the endpoints whose pods still exist (re-reserving their addresses
//! and re-attaching programs, which replaces the old ones atomically), removes those that are
//! gone or whose creation or deletion never finished, and sweeps interfaces, map entries and
//! attachments no endpoint owns. Only then does the API serve CNI calls. The states, the
//! order of every flow and what each fault does are in `docs/endpoints.md`.

mod config;
mod datapath;
mod endpoint;
mod enforcement;
mod error;
mod grpc;
mod identity;
mod interfaces;
mod labels;
mod locks;
mod manager;
pub mod plumbing;
mod program;
mod request;
mod store;
mod table;
#[cfg(test)]
mod testing;

use cellium_hive::Module;

pub use config::EndpointConfig;
pub use endpoint::{Address, Endpoint, PodRef, State};
pub use enforcement::{Enforced, EnforcedTable};
pub use error::{Error, Result};
pub use grpc::{EndpointService, to_proto, view};
pub use labels::named_ports;
pub use manager::EndpointManager;
pub use request::CreateRequest;

/// The `endpoint-manager` module.
pub fn cell() -> Module {
    Module::new(
        "endpoint-manager",
        "Creates, restores and removes pods' endpoints: interfaces, addresses and datapath",
    )
    .config::<EndpointConfig>()
    .provide(EndpointManager::new)
    .contribute(EndpointService::api)
}

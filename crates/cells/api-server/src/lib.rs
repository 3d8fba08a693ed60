//! The `api-server` cell: the agent's gRPC API on a unix socket.
//!
//! - **Owns** the socket (`api-socket`, default `/run/cellium/cellium.sock`, mode 0600) and the
//!   tonic server on it, which accepts connections with `cellium_api::incoming` (a client may
//!   pass a pod's network namespace as it connects), and the `cellium.v1.Agent` service
//!   (`Status`: version, uptime, the module health tree, the readiness it implies for new and
//!   running pods, and the operator notes).
//! - **Provides** `Arc<ApiServer>`; it is a driving cell, so it invokes itself.
//! - **Depends on** every `Arc<ApiService>` and every `Arc<StatusNote>` other cells contribute,
//!   the hive's `Health`, and optionally `Arc<DatapathModules>` (the agent binary provides it:
//!   which modules' health affects running pods).
//! - **Config keys:** `api-socket`.
//! - **Degraded** when the server stops on an error; a socket that another live agent serves,
//!   or that cannot be created, fails the start.

mod agent;
mod config;
mod server;
mod socket;

use std::sync::Arc;

use cellium_hive::Module;

pub use agent::AgentService;
pub use config::ApiServerConfig;
pub use server::ApiServer;
pub use socket::SocketError;

/// The `api-server` module.
pub fn cell() -> Module {
    Module::new(
        "api-server",
        "Serves the agent's gRPC API on a unix socket (mode 0600)",
    )
    .config::<ApiServerConfig>()
    .provide_private(AgentService::new)
    .provide(ApiServer::new)
    .invoke(|_: Arc<ApiServer>| {})
}

//! The `api-server` cell: the agent's gRPC API on a unix socket.
//!
//! - **Owns** the socket (`api-socket`, default `/run/cellium/cellium.sock`, mode 0600) and the
//!   tonic server on it, and the `cellium.v1.Agent` service (`Status`: version, uptime and the
//!   module health tree).
//! - **Provides** `Arc<ApiServer>`; it is a driving cell, so it invokes itself.
//! - **Depends on** every `Arc<ApiService>` other cells contribute, and the hive's `Health`.
//! - **Config keys:** `api-socket`.
//! - **Degraded** when the server stops on an error; a socket that another live agent serves,
//!   or that cannot be created, fails the start.

mod agent;
mod config;
mod server;
mod socket;

use std::sync::Arc;

use cellium_hive::Module;

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
    .provide(ApiServer::new)
    .invoke(|_: Arc<ApiServer>| {})
}

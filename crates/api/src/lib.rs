//! The agent's gRPC API.
//!
//! Owns the Rust code generated from `proto/cellium/v1/*.proto` ([`v1`]), the client side
//! ([`connect`]: a channel over the agent's unix socket, with errors that say whether the agent
//! is running) and the server side's unit of registration ([`ApiService`]: a cell that serves a
//! gRPC service contributes one, and the `api-server` cell mounts them all on one socket).

mod client;
mod service;

pub use client::{ConnectError, DEFAULT_SOCKET, connect};
pub use service::ApiService;

/// Generated messages, clients and server traits of the `cellium.v1` package.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("cellium.v1");
}

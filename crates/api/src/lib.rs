//! The agent's gRPC API.
//!
//! Owns the Rust code generated from `proto/cellium/v1/*.proto` ([`v1`]); the transport both
//! ends use ([`transport`]: a channel over the agent's unix socket with errors that say whether
//! the agent is running, [`connect_with_netns`] that passes a pod's network namespace, and the
//! server's [`incoming`] connections that receive it); the typed reason of a refusal
//! ([`refusal`], [`reason_of`]); and what cells hand the API server: their services
//! ([`ApiService`]), notes for `cellium status` ([`StatusNote`]) and the agent's list of
//! [`DatapathModules`].

mod reason;
mod service;
mod status;
pub mod transport;

pub use reason::{DOMAIN, reason_of, refusal};
pub use service::ApiService;
pub use status::{DatapathModules, StatusNote};
pub use transport::{
    ConnectError, Connection, DEFAULT_SOCKET, HANDSHAKE_TIMEOUT, Peer, connect, connect_with_netns,
    incoming,
};
pub use v1::Reason;

/// Generated messages, clients and server traits of the `cellium.v1` package.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("cellium.v1");
}

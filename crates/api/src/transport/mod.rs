//! The agent's API transport: gRPC over a unix socket, with an optional network namespace
//! passed at the start of a connection.
//!
//! A CNI runtime names the pod's network namespace by a path (`CNI_NETNS`) that is valid in the
//! runtime's mount and PID namespaces, not necessarily in the agent's. So the caller that has the
//! path (the CNI plugin) opens it and hands the agent the namespace itself: right after
//! connecting, before HTTP/2 starts, it sends [`handshake::MAGIC`] with the descriptor attached
//! as `SCM_RIGHTS` ancillary data ([`connect_with_netns`]). The server's accept loop
//! ([`incoming`]) peeks at the first bytes of each connection; when they are the magic it takes
//! them with the descriptor, otherwise it leaves them to HTTP/2, so clients that pass nothing
//! (the CLI, grpcurl) work unchanged. Each request's extensions then hold the connection's
//! [`Peer`]: its credentials (`SO_PEERCRED`) and the namespace, if one was passed.
//!
//! The plugin's connector and the API server use this one module, so the two ends cannot drift.

mod client;
pub(crate) mod handshake;
mod server;

pub use client::{ConnectError, DEFAULT_SOCKET, connect, connect_with_netns};
pub use server::{Connection, HANDSHAKE_TIMEOUT, Peer, incoming};

#[cfg(test)]
mod tests;

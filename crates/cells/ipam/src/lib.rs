//! The `ipam` cell: pod addresses from the node's pod CIDRs.
//!
//! - **Owns** the node's address pools (host scope) and who holds each address.
//! - **Provides** `Arc<Ipam>`: allocate next / allocate a requested address / release / owner,
//!   one pool per CIDR, IPv4 and IPv6; and the `cellium.v1.Ipam` gRPC service
//!   (`cellium ipam list`).
//! - **Depends on** its config only; other sources (the Kubernetes Node, a cluster-pool
//!   operator) feed it through [`Ipam::add_pool`].
//! - **Config keys:** `pod-cidr` (repeatable; default `10.244.0.0/24`).
//! - **Degraded** never: a bad or overlapping CIDR fails the agent's start.
//!
//! The allocator keeps no file of its own: endpoints are the record of who holds what, and
//! the endpoint manager re-reserves restored endpoints' addresses before the API is served.

mod config;
mod error;
mod grpc;
mod ipam;
mod pool;

use cellium_hive::Module;

pub use config::IpamConfig;
pub use error::{Error, Result};
pub use grpc::IpamService;
pub use ipam::{Allocation, Ipam, PoolInfo};
pub use pool::{Owner, Pool, ROUTER_OWNER};

/// The `ipam` module.
pub fn cell() -> Module {
    Module::new("ipam", "Allocates pod addresses from the node's pod CIDRs")
        .config::<IpamConfig>()
        .provide(Ipam::new)
        .contribute(IpamService::api)
}

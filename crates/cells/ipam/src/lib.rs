//! The `ipam` cell: pod addresses from the node's pod CIDRs.
//!
//! - **Owns** the node's address pools (host scope), who holds each address, each pool's
//!   round-robin cursor and the quarantine of released addresses; the last two are kept in
//!   `ipam.json` in the state directory, so a restart neither hands out a just-released
//!   address nor starts over from the first one.
//! - **Provides** `Arc<Ipam>`: allocate next / allocate a requested address / allocate what a
//!   create asks for, all or nothing (`allocate_many`) / release (`release`, `try_release`) /
//!   re-reserve at restore (`restore`) / quarantine a dead endpoint's address (`retire`) /
//!   owner, one pool per CIDR, IPv4 and IPv6; and the `cellium.v1.Ipam` gRPC service
//!   (`cellium ipam list`).
//! - **Depends on** its config and `Arc<StateDir>` (the `statedir` cell); other sources (the
//!   Kubernetes Node, a cluster-pool operator) feed it through [`Ipam::add_pool`].
//! - **Config keys:** `ipam` (`config`, the default: the pools are `pod-cidr`; `kubernetes`:
//!   they are this node's Node `spec.podCIDRs`, read from the resources tables, and the start
//!   waits, Degraded with the reason, until the Node has them), `pod-cidr` (repeatable;
//!   default `10.244.0.0/24`), and
//!   `ipam-release-quarantine` (default `60s`; `0s` disables the quarantine).
//! - **Degraded** when `ipam.json` cannot be written (allocations and releases that need it
//!   fail until it can), or could not be read at start (every address nobody holds is then in
//!   quarantine for one period, since any may have been released just before). A pod CIDR
//!   that cannot serve pods (see [`cidr`]), is too small or overlaps another fails the start,
//!   naming the key and the value.
//!
//! Who holds which address is not kept here: endpoints are that record, and the endpoint
//! manager re-reserves restored endpoints' addresses with [`Ipam::restore`] (which the
//! quarantine does not hold back: those addresses were never released) before the API is
//! served.

#[cfg(test)]
mod cell_tests;
pub mod cidr;
mod config;
mod error;
mod grpc;
mod ipam;
mod node_cidrs;
mod pool;
mod quarantine;
mod record;
mod store;

use cellium_hive::Module;

pub use config::{IpamConfig, IpamMode};
pub use error::{Error, Result};
pub use grpc::IpamService;
pub use ipam::{Allocation, Ipam, PoolInfo};
pub use pool::{Owner, Pool, ROUTER_OWNER};

/// The file in the state directory holding the cursors and the quarantine.
pub const RECORD_FILE: &str = record::FILE;

/// The `ipam` module.
pub fn cell() -> Module {
    Module::new("ipam", "Allocates pod addresses from the node's pod CIDRs")
        .config::<IpamConfig>()
        .provide(Ipam::new)
        .contribute(IpamService::api)
}

//! The `ipcache` cell: which security identity each IP prefix has.
//!
//! - **Owns** the prefix -> identity table (claims by [`Source`], in precedence order
//!   endpoint > host > policy), the named container ports of the pods behind claimed
//!   prefixes, the node's own addresses as host-identity entries, and the mirror of the table
//!   into the datapath's LPM map `cel_ipcache`.
//! - **Provides** `Arc<Ipcache>`: upsert / delete / lookup (longest prefix) / list,
//!   [`Ipcache::set_named_ports`] and [`Ipcache::named_ports`] (per identity, what egress
//!   policy rules' port names resolve against) with [`Ipcache::named_port_changes`],
//!   [`Ipcache::prune_stale`] for the endpoint manager's restore, and
//!   [`Ipcache::refresh_host_addresses`]; and the `cellium.v1.Ipcache` gRPC service
//!   (`cellium ipcache list|get`).
//! - **Depends on** `Arc<Loader>` (the datapath's maps); the host identity number comes from
//!   the `identity` crate.
//! - **Config keys:** `ipcache-host-refresh-interval` (default `30s`),
//!   `ipcache-sync-interval` (default `1m`).
//! - **Degraded** when a map write or the node's addresses cannot be read (the jobs
//!   `ipcache-sync` and `host-addresses` retry); failing to mirror at start fails the start.
//!
//! The restore contract: the map is not flushed at start, so the previous run's entries keep
//! the datapath enforcing; the endpoint manager re-claims its pods' addresses and then calls
//! [`Ipcache::prune_stale`], which removes what nobody claimed again.

mod config;
mod error;
mod grpc;
mod host;
mod ipcache;
mod named_ports;
mod source;
mod sync;
mod table;

use cellium_hive::Module;

pub use cellium_datapath_bpf::IpcacheInfo;
pub use config::IpcacheConfig;
pub use error::{Error, Result};
pub use grpc::IpcacheService;
pub use host::node_addresses;
pub use ipcache::Ipcache;
pub use source::Source;
pub use sync::SyncStats;
pub use table::IpcacheEntry;

/// The `ipcache` module.
pub fn cell() -> Module {
    Module::new(
        "ipcache",
        "Maps IP prefixes to security identities and mirrors them into the datapath",
    )
    .config::<IpcacheConfig>()
    .provide(Ipcache::new)
    .contribute(IpcacheService::api)
}

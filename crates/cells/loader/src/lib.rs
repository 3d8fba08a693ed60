//! The `loader` cell: the eBPF datapath, loaded once and shared.
//!
//! - **Owns** the loaded datapath: bpffs mounted at `bpf-root` when missing, the object
//!   loaded, its maps pinned under `<bpf-root>/maps` and reused across restarts when their
//!   layout matches (so conntrack, policy and services survive an agent restart or upgrade;
//!   a mismatch is migrated or recreated and logged), and the conntrack garbage collector.
//! - **Provides** `Arc<Loader>`: [`Loader::datapath`] once started; attaching a pod's veth
//!   replaces the programs of an existing attachment atomically, with no window without one.
//! - **Depends on** `Metrics` (optional): the datapath's per-reason packet and byte counters
//!   are exported as `cellium_datapath_packets_total` and `cellium_datapath_bytes_total`.
//! - **Config keys:** `bpf-root` (default `/sys/fs/bpf/cellium`), `attach-mode` (`clsact`,
//!   the default, `tcx` or `auto`; see [`AttachModeConfig`] for why clsact),
//!   `conntrack-gc-interval` (default `30s`), `bpf-conntrack-accounting` (default `false`:
//!   conntrack entries count their first packet only).
//! - **Degraded** when a conntrack collection fails; failing to load fails the start.

mod config;
mod counters;
mod error;
mod loader;

use cellium_hive::Module;

pub use config::{AttachModeConfig, LoaderConfig};
pub use error::{Error, Result};
pub use loader::Loader;

/// The `loader` module.
pub fn cell() -> Module {
    Module::new(
        "loader",
        "Loads the eBPF datapath, pins its maps and collects expired connections",
    )
    .config::<LoaderConfig>()
    .provide(Loader::new)
}

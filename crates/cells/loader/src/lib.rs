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
//! - **Hooks:** `load-datapath` starts the load (the verifier's work, off the runtime) as
//!   soon as the node is claimed, and the start goes on beside it; `datapath-loaded` waits for
//!   it before the first cell that uses the datapath starts (in Kubernetes mode, after the API
//!   server's lists are in).
//! - **Degraded** when a conntrack collection fails; failing to load fails the start (at
//!   `datapath-loaded`, naming why; the failure is logged as soon as it happens).

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
    .provide_private(loader::LoadJob::new)
    // Constructed where the module stands in the agent's cells, so that the load starts there.
    .invoke(|_: std::sync::Arc<loader::LoadJob>| {})
    .provide(Loader::new)
}

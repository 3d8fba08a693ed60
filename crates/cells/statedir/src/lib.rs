//! The `statedir` cell: the agent's durable state on disk.
//!
//! - **Owns** the state directory (`state-dir`, default `/var/run/cellium`) and an exclusive
//!   lock on it (`agent.lock`, holding the agent's pid), so two agents never share state.
//! - **Provides** `Arc<StateDir>`: atomic writes (temp file, rename), durable (fsync'd) or, for
//!   records of what does not outlive the node's kernel anyway, left to the page cache; reads,
//!   listings, directory flushes. A failed write removes its temp file; the temp files of a
//!   writer killed half-way are removed when the directory is locked at start.
//! - **Depends on** nothing but the hive.
//! - **Config keys:** `state-dir`.
//! - **Degraded** never: failing to create or lock the directory fails the agent's start; OK
//!   once it is locked.
//!
//! Other cells keep their records here (endpoints under `endpoints/`, identities under
//! `identities/`), which is what lets the agent restore its state after a restart.
//!
//! The `node-lock` cell (`crates/cells/node-lock`) extends "one agent per state directory"
//! to the node: one agent per network namespace, API socket and BPF root.

mod config;
mod error;
mod state_dir;

use cellium_hive::Module;

pub use config::StateDirConfig;
pub use error::{Error, Result};
pub use state_dir::StateDir;

/// The `statedir` module.
pub fn cell() -> Module {
    Module::new(
        "statedir",
        "Keeps the agent's durable state on disk, locked for one agent",
    )
    .config::<StateDirConfig>()
    .provide(StateDir::new)
    // Locked even when no cell keeps state yet, so two agents never share a directory.
    .invoke(|_: std::sync::Arc<StateDir>| {})
}

//! The `loader` configuration section.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the datapath is pinned, how programs are attached and how often conntrack is
/// collected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LoaderConfig {
    /// The directory maps and links are pinned under; mounted as bpffs if it is not one.
    pub bpf_root: PathBuf,
    /// How programs are attached to pods' veths.
    pub attach_mode: AttachModeConfig,
    /// How often expired connections are removed from the conntrack table.
    #[serde(with = "humantime_serde")]
    pub conntrack_gc_interval: Duration,
    /// Count every packet and byte of a connection in its conntrack entry (Cilium's
    /// `bpf-conntrack-accounting`, off by default as there): each packet then writes the
    /// entry both directions share.
    pub bpf_conntrack_accounting: bool,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            bpf_root: PathBuf::from("/sys/fs/bpf/cellium"),
            attach_mode: AttachModeConfig::Clsact,
            conntrack_gc_interval: Duration::from_secs(30),
            bpf_conntrack_accounting: false,
        }
    }
}

/// The `attach-mode` key.
///
/// Both mechanisms run the same programs at the same hooks, outlive the agent and are replaced
/// atomically by a restarted agent. They differ in what a pod's creation and deletion cost:
/// every tcx link attached or detached, and the removal of an interface with tcx programs on
/// it, waits for a full RCU grace period (about 12 ms here, four per pod), while a clsact
/// filter waits at most for an expedited one. Hence `clsact` by default: CNI ADD and DEL are
/// on every pod's start-up path (`docs/performance.md`, "CNI").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachModeConfig {
    /// A clsact qdisc filter per hook, with a fixed handle and priority.
    Clsact,
    /// A tcx link per hook, pinned under `<bpf-root>/links`.
    Tcx,
    /// tcx where the kernel has it, clsact elsewhere.
    Auto,
}

impl From<AttachModeConfig> for cellium_datapath_bpf::AttachMode {
    fn from(mode: AttachModeConfig) -> Self {
        match mode {
            AttachModeConfig::Clsact => cellium_datapath_bpf::AttachMode::Clsact,
            AttachModeConfig::Tcx => cellium_datapath_bpf::AttachMode::Tcx,
            AttachModeConfig::Auto => cellium_datapath_bpf::AttachMode::Auto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_mode_is_kebab_case_and_clsact_by_default() {
        assert_eq!(
            LoaderConfig::default().attach_mode,
            AttachModeConfig::Clsact
        );
        let mode: AttachModeConfig = serde_json::from_str("\"tcx\"").unwrap();
        assert_eq!(
            cellium_datapath_bpf::AttachMode::from(mode),
            cellium_datapath_bpf::AttachMode::Tcx
        );
        assert!(serde_json::from_str::<AttachModeConfig>("\"xdp\"").is_err());
    }
}

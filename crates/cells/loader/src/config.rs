//! The `loader` configuration section.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the datapath is pinned and how often conntrack is collected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LoaderConfig {
    /// The directory maps and links are pinned under; mounted as bpffs if it is not one.
    pub bpf_root: PathBuf,
    /// How often expired connections are removed from the conntrack table.
    #[serde(with = "humantime_serde")]
    pub conntrack_gc_interval: Duration,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            bpf_root: PathBuf::from("/sys/fs/bpf/cellium"),
            conntrack_gc_interval: Duration::from_secs(30),
        }
    }
}

//! The `ipcache` configuration section.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often the ipcache re-reads the node's addresses and re-checks the datapath's map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct IpcacheConfig {
    /// How often the node's own addresses are read again (they are also read at start and
    /// whenever [`Ipcache::refresh_host_addresses`](crate::Ipcache::refresh_host_addresses)
    /// asks).
    #[serde(with = "humantime_serde")]
    pub ipcache_host_refresh_interval: Duration,
    /// How often the datapath's map is compared with the desired entries and repaired
    /// (also at once after a failed write).
    #[serde(with = "humantime_serde")]
    pub ipcache_sync_interval: Duration,
}

impl Default for IpcacheConfig {
    fn default() -> Self {
        IpcacheConfig {
            ipcache_host_refresh_interval: Duration::from_secs(30),
            ipcache_sync_interval: Duration::from_secs(60),
        }
    }
}

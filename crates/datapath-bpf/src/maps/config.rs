//! `cel_config`: the single datapath-wide settings record.

use crate::abi::{DatapathConfig, LAYOUT_VERSION};
use crate::error::Result;
use crate::maps::TypedMap;

/// The map name.
pub const NAME: &str = "cel_config";

/// The config array.
#[derive(Debug)]
pub struct ConfigMap {
    map: TypedMap<u32, DatapathConfig>,
}

impl ConfigMap {
    pub(crate) fn new(map: TypedMap<u32, DatapathConfig>) -> Self {
        Self { map }
    }

    /// The current settings (all zero in a map nobody configured).
    pub fn get(&self) -> Result<DatapathConfig> {
        // An array always holds its slots; a miss would be a kernel oddity.
        Ok(self.map.get(&0)?.unwrap_or(DatapathConfig {
            layout_version: 0,
            flags: 0,
            ct_tcp_syn: 0,
            ct_tcp_established: 0,
            ct_tcp_closing: 0,
            ct_udp: 0,
            ct_icmp: 0,
            ct_other: 0,
        }))
    }

    /// Sets or clears the flags of `flag` (`DatapathConfig::*` flag constants), keeping the
    /// other settings.
    pub fn set_flag(&self, flag: u32, on: bool) -> Result<()> {
        let mut config = self.get()?;
        config.flags = if on {
            config.flags | flag
        } else {
            config.flags & !flag
        };
        self.set(&config)
    }

    /// Replaces the settings; the layout version is always this build's.
    pub fn set(&self, config: &DatapathConfig) -> Result<()> {
        let config = DatapathConfig {
            layout_version: LAYOUT_VERSION,
            ..*config
        };
        self.map.put(&0, &config)
    }
}

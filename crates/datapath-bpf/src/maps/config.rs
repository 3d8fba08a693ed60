//! `cel_config`: the single datapath-wide settings record.

use crate::abi::{DatapathConfig, LAYOUT_VERSION};
use crate::error::Result;
use crate::maps::TypedMap;

/// The map name.
pub const NAME: &str = "cel_config";

/// What VXLAN adds to every packet over IPv4: outer IPv4 (20), UDP (8), VXLAN (8) and inner
/// Ethernet (14) headers. Pods get the node network's MTU minus this in tunnel mode.
pub const VXLAN_OVERHEAD: u32 = 50;

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
            tunnel_ifindex: 0,
            tunnel_port: 0,
            pad: 0,
            host_netns_cookie: 0,
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

    /// Sets the VXLAN device traffic to other nodes' pods is redirected to and its UDP port
    /// (tunnel mode), or 0 and 0 (native routing), keeping the other settings.
    pub fn set_tunnel(&self, ifindex: u32, port: u16) -> Result<()> {
        let config = self.get()?;
        self.set(&DatapathConfig {
            tunnel_ifindex: ifindex,
            tunnel_port: port.to_be(),
            ..config
        })
    }

    /// Sets the network namespace whose sockets the socket-level load balancer translates
    /// (its cookie, `SO_NETNS_COOKIE`), or 0 for none, keeping the other settings.
    pub fn set_host_netns_cookie(&self, cookie: u64) -> Result<()> {
        let config = self.get()?;
        self.set(&DatapathConfig {
            host_netns_cookie: cookie,
            ..config
        })
    }

    /// The bytes the datapath's encapsulation adds to pods' packets: [`VXLAN_OVERHEAD`] in
    /// tunnel mode, else 0.
    pub fn encap_overhead(&self) -> Result<u32> {
        Ok(if self.get()?.tunnel_ifindex != 0 {
            VXLAN_OVERHEAD
        } else {
            0
        })
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

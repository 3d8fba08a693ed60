//! The `ipam` configuration section.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Which addresses pods get in standalone mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct IpamConfig {
    /// The node's pod CIDRs, IPv4 and/or IPv6. A pod gets one address of each family
    /// configured, from the first pool of that family with room.
    pub pod_cidr: Vec<IpNet>,
}

impl Default for IpamConfig {
    fn default() -> Self {
        IpamConfig {
            pod_cidr: vec!["10.244.0.0/24".parse().expect("a valid literal CIDR")],
        }
    }
}

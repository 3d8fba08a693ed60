//! The `endpoint-manager` configuration section.

use serde::{Deserialize, Serialize};

/// How pods' interfaces are set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct EndpointConfig {
    /// The MTU of the node's network. Pods' interfaces get it, minus the encapsulation's
    /// headers in tunnel mode (50 bytes for VXLAN), unless the CNI configuration sets one.
    pub mtu: u32,
    /// At start, remove restored endpoints whose addresses the configured pod CIDRs no longer
    /// cover (their pods lose their interfaces). Off, such endpoints stop the agent from
    /// starting, with a message naming them.
    pub remove_endpoints_outside_pod_cidr: bool,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            mtu: 1500,
            remove_endpoints_outside_pod_cidr: false,
        }
    }
}

//! The `endpoint-manager` configuration section.

use serde::{Deserialize, Serialize};

/// How pods' interfaces are set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct EndpointConfig {
    /// The MTU of pods' interfaces unless the CNI configuration sets one.
    pub mtu: u32,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig { mtu: 1500 }
    }
}

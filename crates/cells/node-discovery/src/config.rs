//! The `node-discovery` configuration section.

use serde::{Deserialize, Serialize};

/// How pods reach pods of other nodes (key `routing-mode`, Cilium's values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingMode {
    /// Plain routing: a route to each other node's pod CIDRs via that node's address (Cilium's
    /// native routing with `auto-direct-node-routes`); the nodes share a network.
    #[default]
    Native,
    /// VXLAN with the source's identity in the VNI: not available in this version.
    Tunnel,
}

/// The `node-discovery` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct NodeDiscoveryConfig {
    /// `native` (the default) or `tunnel` (refused: not available in this version).
    pub routing_mode: RoutingMode,
}

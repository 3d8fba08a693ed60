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
    /// VXLAN: traffic from pods to other nodes' pods is encapsulated towards the node hosting
    /// the destination, with the source's security identity in the VNI.
    Tunnel,
}

/// The encapsulation of tunnel mode (key `tunnel-protocol`, Cilium's values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TunnelProtocol {
    /// VXLAN (RFC 7348), the only one here.
    #[default]
    Vxlan,
    /// Geneve: refused, not available in this version.
    Geneve,
}

/// The `node-discovery` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct NodeDiscoveryConfig {
    /// `native` (the default) or `tunnel`.
    pub routing_mode: RoutingMode,
    /// Tunnel mode's encapsulation: `vxlan` (the default; `geneve` is refused).
    pub tunnel_protocol: TunnelProtocol,
    /// Tunnel mode's UDP port, the same on every node (default 8472, Cilium's).
    pub tunnel_port: u16,
}

impl Default for NodeDiscoveryConfig {
    fn default() -> Self {
        NodeDiscoveryConfig {
            routing_mode: RoutingMode::Native,
            tunnel_protocol: TunnelProtocol::Vxlan,
            tunnel_port: 8472,
        }
    }
}

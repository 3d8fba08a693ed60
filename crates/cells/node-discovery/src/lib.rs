//! The `node-discovery` cell: the cluster's other nodes and their pods, made known to this node.
//!
//! - **Owns** the node's routes to other nodes' pod CIDRs (marked with routing protocol
//!   [`routes::PROTOCOL`], `ip route show proto 206`), the ipcache entries of other nodes and
//!   their pods (source `remote`, with the hosting node as tunnel endpoint in tunnel mode), the
//!   tunnel device, and the identities learnt from the cluster.
//! - **Provides** `Arc<NodeDiscovery>`, inactive standalone, where there is no cluster; and a
//!   status note (`cellium status`) saying how many other nodes are routed, how many remote
//!   addresses and cluster identities are known, and how many other nodes' claims are refused
//!   (by reason, with an example); and `cellium_remote_claims_refused_total{reason}`.
//! - **Depends on** resources (Nodes, CiliumEndpoints and CiliumIdentities from the API
//!   server), ipcache, identity, the loader (the datapath, for the tunnel); and, optional,
//!   `dyn RemoteEndpoints` (the kvstore cell's `cilium/state/ip/v1/` entries), merged with the
//!   CiliumEndpoints; the policy repository, optional (the `cidr:` labels of its ipBlocks,
//!   see below); and `Metrics`, optional.
//! - **Config keys:** `routing-mode`: `native` (the default here: a route to each other node's
//!   pod CIDRs via that node's address of the CIDR's family, as Cilium's native routing with
//!   `auto-direct-node-routes`; the nodes share a network) or `tunnel` (the VXLAN device
//!   [`tunnel::DEVICE`], the source's identity in the VNI; see [`tunnel`]); `tunnel-protocol`
//!   (`vxlan`; `geneve` is refused) and `tunnel-port` (8472).
//! - **Start hook** `tunnel-device`: in tunnel mode, the device, `cel_from_overlay` on it and its
//!   index in the datapath's configuration; otherwise a previous run's device removed.
//! - **Owns** too `cel_from_netdev` on the ingress of the devices holding the node's own
//!   addresses (its Node's or CiliumNode's; standalone, every address of its namespace but
//!   loopback and link-local ones, looked at every 5 s), attached at each pass to the devices
//!   that hold them now and detached from those that no longer do ([`netdev`]): traffic from
//!   other nodes for local pods goes straight to them, and frontends reached from outside
//!   (NodePort, external and load balancer IPs) are translated there.
//! - **Degraded** (`node-discovery.reconcile`) while a pass fails (a netlink or ipcache
//!   write), retried every 30 s and at every change.
//! - **Degraded** (`node-discovery.encapsulation`, tunnel mode) for 30 s after the datapath
//!   dropped packets to other nodes as `Encapsulation failed`.
//!
//! A pass, at every change of those tables and every 30 s: every CiliumIdentity is learnt by the
//! identity cell (so that policies select other nodes' pods by their labels); every other
//! node's addresses enter the ipcache as `remote-node`, and every pod address of a
//! CiliumEndpoint another node hosts as its identity, where the claim holds
//! ([`desired::ipcache`]: a cluster identity of the claim's namespace, from a known node, within
//! that node's pod CIDRs), or, for an address inside an ipBlock of this node's policies, the
//! node-local identity of that identity's labels and the ipBlocks' `cidr:` labels (`covered`:
//! a node publishes its pods' cluster identities only) (the datapath then resolves the source of
//! traffic from other nodes, and the destination of traffic to them, to identities); the routes
//! follow the Nodes' `spec.podCIDRs` and addresses.

mod config;
mod covered;
pub mod desired;
mod discovery;
mod error;
pub mod masquerade;
pub mod netdev;
mod remote;
pub mod routes;
pub mod tunnel;

use std::sync::Arc;

use cellium_api::StatusNote;
use cellium_hive::Module;

pub use config::{NodeDiscoveryConfig, RoutingMode, TunnelProtocol};
pub use discovery::NodeDiscovery;
pub use error::{Error, Result};
pub use remote::RemoteEndpoints;

/// The `node-discovery` module.
pub fn cell() -> Module {
    Module::new(
        "node-discovery",
        "Learns the cluster's other nodes and their pods: routes, ipcache entries, identities",
    )
    .config::<NodeDiscoveryConfig>()
    .provide(NodeDiscovery::new)
    // `cellium status` says what the node knows of the cluster; and the API, which takes every
    // note, so starts after this cell's jobs and stops before them.
    .contribute(|nd: Arc<NodeDiscovery>| Arc::new(StatusNote::new(move || nd.note())))
}

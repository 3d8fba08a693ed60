//! Nodes through etcd: this node as `cilium/state/nodes/v1/default/<node>` on its lease (its
//! addresses and pod CIDRs), and the other nodes read back for node-discovery, which routes to
//! them and enters their addresses in the ipcache as it does for CiliumNodes.

use std::net::IpAddr;

use cellium_resources::CiliumNode;
use ipnet::IpNet;

use crate::keys::{self, NodeAddress, NodeEntry};
use crate::store::{Kept, Kvstore};

/// This node's entry: its addresses, and its first pod CIDR of each family.
pub fn own_entry(node: &str, addresses: &[IpAddr], cidrs: &[IpNet]) -> NodeEntry {
    NodeEntry {
        name: node.to_string(),
        cluster: keys::CLUSTER.to_string(),
        addresses: addresses
            .iter()
            .map(|ip| NodeAddress {
                kind: "InternalIP".into(),
                ip: *ip,
            })
            .collect(),
        ipv4_alloc_cidr: cidrs.iter().find(|c| matches!(c, IpNet::V4(_))).copied(),
        ipv6_alloc_cidr: cidrs.iter().find(|c| matches!(c, IpNet::V6(_))).copied(),
    }
}

impl Kvstore {
    /// Keeps `entry` as this node's key (none: the key is removed).
    pub fn keep_node(&self, entry: Option<&NodeEntry>) {
        let kept = entry
            .and_then(|e| {
                Some((
                    keys::node_key(&e.name),
                    Kept {
                        value: serde_json::to_string(e).ok()?,
                        master: None,
                    },
                ))
            })
            .into_iter()
            .collect();
        self.keep_all(keys::NODES_PREFIX, kept);
    }

    /// The other nodes of this cluster now, as CiliumNodes: this node's own key left out, and
    /// entries that do not decode skipped.
    pub fn remote_nodes(&self) -> Vec<CiliumNode> {
        let prefix = format!("{}{}/", keys::NODES_PREFIX, keys::CLUSTER);
        let nodes = self.nodes.lock();
        nodes
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && !self.keeps(k))
            .filter_map(|(k, v)| match serde_json::from_str::<NodeEntry>(v) {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::debug!(key = k, error = %e, "a node entry does not decode; skipped");
                    None
                }
            })
            .filter(|e| e.name != self.node())
            .map(|e| CiliumNode {
                name: e.name,
                addresses: e.addresses.into_iter().map(|a| a.ip).collect(),
                pod_cidrs: e
                    .ipv4_alloc_cidr
                    .into_iter()
                    .chain(e.ipv6_alloc_cidr)
                    .collect(),
                operator_error: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_entry_takes_one_cidr_per_family() {
        let cidrs: Vec<IpNet> = ["10.245.1.0/24", "10.246.0.0/24", "fd00:1::/112"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        let e = own_entry("n1", &["192.0.2.1".parse().unwrap()], &cidrs);
        assert_eq!(e.ipv4_alloc_cidr, Some(cidrs[0]));
        assert_eq!(e.ipv6_alloc_cidr, Some(cidrs[2]));
        assert_eq!(e.addresses[0].kind, "InternalIP");
        assert_eq!(e.cluster, "default");
    }
}

//! An "external" network: a namespace outside the cluster, routed through the node, holding
//! addresses that are neither pods nor the node, so that policies about the world and about
//! CIDRs outside the cluster meet real traffic while every packet stays inside namespaces the
//! test created.
//!
//! ```text
//!  node netns                          external netns
//!  celx0 10.98.0.1/30  <----veth---->  eth0 10.98.0.2/30
//!  10.99.0.0/24 via 10.98.0.2               10.99.0.10/32, 10.99.0.20/32
//!                                      <pod CIDRs> via 10.98.0.1
//! ```

use std::net::Ipv4Addr;

use crate::error::Result;
use crate::netns::NetNs;

/// The node's end of the link.
pub const NODE_LINK_IP: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 1);
/// The external namespace's end of the link.
pub const EXT_LINK_IP: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 2);
/// The external prefix routed through the link.
pub const EXT_PREFIX: &str = "10.99.0.0/24";
/// The external addresses: the tables call them `ext-a` and `ext-b`.
pub const EXT_ADDRS: [(&str, Ipv4Addr); 2] = [
    ("ext-a", Ipv4Addr::new(10, 99, 0, 10)),
    ("ext-b", Ipv4Addr::new(10, 99, 0, 20)),
];

/// The external namespace (removed on drop, with its end of the link; the node's end goes
/// with it).
#[derive(Debug)]
pub struct External {
    ns: NetNs,
}

impl External {
    /// Creates the namespace and the link, and routes `pod_cidrs` back through the node.
    pub fn attach(node: &NetNs, pod_cidrs: &[String]) -> Result<External> {
        let ns = NetNs::new()?;
        node.ip(&[
            "link",
            "add",
            "celx0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ])?;
        let link = format!("{NODE_LINK_IP}/30");
        node.ip(&["addr", "add", &link, "dev", "celx0"])?;
        node.ip(&["link", "set", "celx0", "up"])?;
        let peer = format!("{EXT_LINK_IP}/30");
        ns.ip(&["addr", "add", &peer, "dev", "eth0"])?;
        for (_, ip) in EXT_ADDRS {
            ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        }
        ns.ip(&["link", "set", "eth0", "up"])?;
        node.ip(&["route", "add", EXT_PREFIX, "via", &EXT_LINK_IP.to_string()])?;
        for cidr in pod_cidrs {
            ns.ip(&["route", "add", cidr, "via", &NODE_LINK_IP.to_string()])?;
        }
        Ok(External { ns })
    }

    /// The external namespace.
    pub fn netns(&self) -> &NetNs {
        &self.ns
    }
}

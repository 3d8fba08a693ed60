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
//!
//! With an IPv6 pod CIDR, the link also carries `fd00:98::1/64` and `fd00:98::2/64`, and the
//! external side holds `fd00:99::10` and `fd00:99::20` (`fd00:99::/64` routed to it).

use std::net::{Ipv4Addr, Ipv6Addr};

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

/// The external addresses' IPv6 twins, for `ext-a` and `ext-b`.
pub const EXT_ADDRS6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x10),
    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x20),
];
/// The node's and the external side's IPv6 addresses on the link.
const LINK6: [&str; 2] = ["fd00:98::1", "fd00:98::2"];
/// The external IPv6 prefix routed through the link.
pub const EXT_PREFIX6: &str = "fd00:99::/64";

/// The external namespace (removed on drop, with its end of the link; the node's end goes
/// with it).
#[derive(Debug)]
pub struct External {
    ns: NetNs,
    v6: bool,
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
        let v6 = pod_cidrs.iter().any(|c| c.contains(':'));
        if v6 {
            // Before the links come up: their link-local addresses, which neighbour discovery
            // sends from, must not wait out duplicate address detection (nothing else is on
            // this link), or the first IPv6 flows find no neighbour for a second or two.
            node.sysctl("net.ipv6.conf.celx0.accept_dad", "0")?;
            ns.sysctl("net.ipv6.conf.eth0.accept_dad", "0")?;
        }
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
        for cidr in pod_cidrs.iter().filter(|c| !c.contains(':')) {
            ns.ip(&["route", "add", cidr, "via", &NODE_LINK_IP.to_string()])?;
        }
        if v6 {
            ipv6(node, &ns, pod_cidrs)?;
        }
        Ok(External { ns, v6 })
    }

    /// The external IPv6 addresses, when the lab has IPv6.
    pub fn addrs6(&self) -> Option<[Ipv6Addr; 2]> {
        self.v6.then_some(EXT_ADDRS6)
    }

    /// The external namespace.
    pub fn netns(&self) -> &NetNs {
        &self.ns
    }
}

/// The IPv6 half of the link: addresses usable at once (no duplicate address detection on a
/// link nothing else is on), the external addresses, and the routes both ways.
fn ipv6(node: &NetNs, ns: &NetNs, pod_cidrs: &[String]) -> Result<()> {
    let [node_ip, ext_ip] = LINK6;
    node.ip(&[
        "addr",
        "add",
        &format!("{node_ip}/64"),
        "dev",
        "celx0",
        "nodad",
    ])?;
    ns.ip(&[
        "addr",
        "add",
        &format!("{ext_ip}/64"),
        "dev",
        "eth0",
        "nodad",
    ])?;
    for ip in EXT_ADDRS6 {
        ns.ip(&["addr", "add", &format!("{ip}/128"), "dev", "eth0", "nodad"])?;
    }
    node.ip(&["-6", "route", "add", EXT_PREFIX6, "via", ext_ip])?;
    for cidr in pod_cidrs.iter().filter(|c| c.contains(':')) {
        ns.ip(&["-6", "route", "add", cidr, "via", node_ip])?;
    }
    Ok(())
}

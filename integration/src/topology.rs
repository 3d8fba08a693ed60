//! The node-and-pods topology the datapath serves, built from network
//! namespaces and veth pairs the way a CNI plugin would:
//!
//! - a node namespace with forwarding on and the gateway address on `lo`;
//! - per pod, a namespace with `eth0` holding `<ip>/32`, routes
//!   `<gw>/32 dev eth0 scope link` and `default via <gw>`, and a permanent
//!   neighbour entry for the gateway (the host veth's MAC), so pods never
//!   ARP for it; on the node, the host veth `lxc<i>` with a `/32` route to
//!   the pod.
//!
//! MACs are fixed per pod index so a datapath loaded by another process can
//! be told them without asking the kernel. IPv6 is off unless
//! [`Topology::enable_ipv6`] adds the same shape in IPv6 (`<ip6>/128`, the
//! gateway `fd00:10:244::1`, permanent neighbour entries both ways).

use std::net::{Ipv4Addr, Ipv6Addr};

use cellium_datapath_bpf::{EndpointFlags, EndpointInfo, MacAddr};

use crate::error::{Error, Result};
use crate::netns::NetNs;

/// The gateway pods route through.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);

/// The address of pod `index` (1-based).
pub fn pod_ip(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, 10 + index)
}

/// The IPv6 gateway, once [`Topology::enable_ipv6`] ran.
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 1);

/// The IPv6 address of pod `index` (1-based), once [`Topology::enable_ipv6`] ran.
pub fn pod_ip6(index: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0x10 + u16::from(index))
}

/// The host-side veth MAC of pod `index`.
pub fn host_mac(index: u8) -> MacAddr {
    MacAddr([0x02, 0xce, 0, 0, index, 0x01])
}

/// The pod-side `eth0` MAC of pod `index`.
pub fn pod_mac(index: u8) -> MacAddr {
    MacAddr([0x02, 0xce, 0, 0, index, 0x02])
}

/// One pod.
#[derive(Debug)]
pub struct Pod {
    /// Its namespace.
    pub ns: NetNs,
    /// 1-based index.
    pub index: u8,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Host-side veth name in the node namespace.
    pub host_if: String,
    /// Host-side veth ifindex in the node namespace.
    pub host_ifindex: u32,
    /// Host-side veth MAC.
    pub host_mac: MacAddr,
    /// Pod-side MAC.
    pub pod_mac: MacAddr,
}

impl Pod {
    /// The endpoint entry for this pod.
    pub fn endpoint(&self, id: u16, identity: u32, flags: EndpointFlags) -> EndpointInfo {
        EndpointInfo {
            ifindex: self.host_ifindex,
            id,
            flags,
            identity,
            host_mac: self.host_mac,
            pod_mac: self.pod_mac,
            cluster_identity: identity,
        }
    }
}

/// A node with pods. Pods are declared before the node so they are removed
/// first (their veths go with them).
#[derive(Debug)]
pub struct Topology {
    /// The pods, index 1 first.
    pub pods: Vec<Pod>,
    /// The node namespace.
    pub node: NetNs,
}

impl Topology {
    /// A node with `pods` pods, in uniquely named namespaces removed on drop.
    pub fn new(pods: u8) -> Result<Self> {
        let node = NetNs::new()?;
        let mut t = Self {
            pods: Vec::new(),
            node,
        };
        t.setup_node()?;
        for i in 1..=pods {
            let ns = NetNs::new()?;
            t.add_pod(ns, i)?;
        }
        Ok(t)
    }

    /// A node `cel-<name>-node` with pods `cel-<name>-pod<i>` that outlive
    /// this process (for scripts); remove them with [`Topology::remove_named`].
    pub fn named(name: &str, pods: u8) -> Result<Self> {
        Self::build_named(name, pods).inspect_err(|_| Self::remove_named(name, pods))
    }

    fn build_named(name: &str, pods: u8) -> Result<Self> {
        let node = NetNs::create(&format!("cel-{name}-node"))?.keep();
        let mut t = Self {
            pods: Vec::new(),
            node,
        };
        t.setup_node()?;
        for i in 1..=pods {
            let ns = NetNs::create(&format!("cel-{name}-pod{i}"))?.keep();
            t.add_pod(ns, i)?;
        }
        Ok(t)
    }

    /// Describes an existing named topology (made by [`Topology::named`]).
    pub fn open_named(name: &str, pods: u8) -> Result<Self> {
        let node = NetNs::existing(&format!("cel-{name}-node"));
        let mut out = Vec::new();
        for i in 1..=pods {
            let host_if = format!("lxc{i}");
            let host_ifindex = ifindex_in(&node, &host_if)?;
            out.push(Pod {
                ns: NetNs::existing(&format!("cel-{name}-pod{i}")),
                index: i,
                ip: pod_ip(i),
                host_if,
                host_ifindex,
                host_mac: host_mac(i),
                pod_mac: pod_mac(i),
            });
        }
        Ok(Self { pods: out, node })
    }

    /// Deletes the namespaces of a named topology; missing ones are fine.
    pub fn remove_named(name: &str, pods: u8) {
        for i in 1..=pods {
            let _ = crate::cmd::run("ip", &["netns", "del", &format!("cel-{name}-pod{i}")]);
        }
        let _ = crate::cmd::run("ip", &["netns", "del", &format!("cel-{name}-node")]);
    }

    /// Pod `index` (1-based).
    pub fn pod(&self, index: u8) -> &Pod {
        &self.pods[usize::from(index) - 1]
    }

    /// Gives the node and every pod IPv6 in the topology's shape: the gateway [`GATEWAY6`] on
    /// the node's `lo`, each pod [`pod_ip6`] on `eth0` (without duplicate address detection),
    /// its routes through the gateway, and permanent neighbour entries both ways, so neither
    /// side ever solicits the other.
    pub fn enable_ipv6(&self) -> Result<()> {
        let n = &self.node;
        n.sysctl("net.ipv6.conf.all.disable_ipv6", "0")?;
        n.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        n.ip(&["-6", "addr", "add", &format!("{GATEWAY6}/128"), "dev", "lo"])?;
        for pod in &self.pods {
            let ip6 = pod_ip6(pod.index);
            n.sysctl(&format!("net.ipv6.conf.{}.disable_ipv6", pod.host_if), "0")?;
            n.ip(&[
                "-6",
                "route",
                "add",
                &format!("{ip6}/128"),
                "dev",
                &pod.host_if,
            ])?;
            n.ip(&[
                "-6",
                "neigh",
                "replace",
                &ip6.to_string(),
                "lladdr",
                &pod.pod_mac.to_string(),
                "dev",
                &pod.host_if,
                "nud",
                "permanent",
            ])?;
            let ns = &pod.ns;
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "0")?;
            ns.sysctl("net.ipv6.conf.eth0.disable_ipv6", "0")?;
            ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{ip6}/128"),
                "dev",
                "eth0",
                "nodad",
            ])?;
            ns.ip(&[
                "-6",
                "route",
                "add",
                &format!("{GATEWAY6}/128"),
                "dev",
                "eth0",
            ])?;
            ns.ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &GATEWAY6.to_string(),
                "dev",
                "eth0",
            ])?;
            ns.ip(&[
                "-6",
                "neigh",
                "replace",
                &GATEWAY6.to_string(),
                "lladdr",
                &pod.host_mac.to_string(),
                "dev",
                "eth0",
                "nud",
                "permanent",
            ])?;
        }
        Ok(())
    }

    fn setup_node(&mut self) -> Result<()> {
        let n = &self.node;
        n.sysctl("net.ipv4.ip_forward", "1")?;
        n.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        // The node owns the gateway address, so packets it originates
        // towards pods have a source (the kernel may lack dummy devices).
        n.ip(&["addr", "add", &format!("{GATEWAY}/32"), "dev", "lo"])?;
        Ok(())
    }

    fn add_pod(&mut self, ns: NetNs, i: u8) -> Result<()> {
        let host_if = format!("lxc{i}");
        let (ip, hmac, pmac) = (pod_ip(i), host_mac(i), pod_mac(i));
        let node = &self.node;
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        crate::veth::create(node, &host_if, hmac, &ns, "eth0", pmac)?;
        node.ip(&["route", "add", &format!("{ip}/32"), "dev", &host_if])?;
        node.ip(&[
            "neigh",
            "replace",
            &ip.to_string(),
            "lladdr",
            &pmac.to_string(),
            "dev",
            &host_if,
            "nud",
            "permanent",
        ])?;

        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        ns.ip(&[
            "route",
            "add",
            &format!("{GATEWAY}/32"),
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            &GATEWAY.to_string(),
            "dev",
            "eth0",
        ])?;
        ns.ip(&[
            "neigh",
            "replace",
            &GATEWAY.to_string(),
            "lladdr",
            &hmac.to_string(),
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])?;

        let host_ifindex = ifindex_in(node, &host_if)?;
        self.pods.push(Pod {
            ns,
            index: i,
            ip,
            host_if,
            host_ifindex,
            host_mac: hmac,
            pod_mac: pmac,
        });
        Ok(())
    }
}

/// The ifindex of `ifname` inside `ns`.
pub fn ifindex_in(ns: &NetNs, ifname: &str) -> Result<u32> {
    let name = ifname.to_owned();
    ns.run(move || nix::net::if_::if_nametoindex(name.as_str()))?
        .map_err(|e| Error::Unexpected {
            what: "interface",
            detail: format!("{ifname} in {}: {e}", ns.name()),
        })
}

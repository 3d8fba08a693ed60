//! What the cluster says this node should know of the others: a pure function of the tables.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use cellium_ipcache::IpcacheInfo;
use cellium_resources::{CiliumEndpoint, CiliumNode, NamedPort, Node};
use ipnet::IpNet;

/// A route to another node's pod CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeRoute {
    /// The pod CIDR.
    pub cidr: IpNet,
    /// Where the node's packets for it go.
    pub next_hop: NextHop,
}

/// Where a route to another node's pods leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NextHop {
    /// Native routing: the other node's address of the CIDR's family.
    Via(IpAddr),
    /// Tunnel mode: the tunnel device (whose egress program finds the node to encapsulate
    /// towards), from this node's own address of the family, so that replies come back by
    /// the underlay.
    Tunnel {
        /// The device's ifindex.
        ifindex: u32,
        /// This node's address.
        src: IpAddr,
    },
}

impl std::fmt::Display for NodeRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.next_hop {
            NextHop::Via(via) => write!(f, "{} via {via}", self.cidr),
            NextHop::Tunnel { ifindex, src } => {
                write!(f, "{} dev #{ifindex} src {src}", self.cidr)
            }
        }
    }
}

/// The routes to every other node's pod CIDRs, each via that node's first address of the
/// CIDR's family; a node without one of that family gets no route for it. A node's CIDRs are
/// its Node's `spec.podCIDRs` (`ipam: kubernetes`) and its CiliumNode's `spec.ipam.podCIDRs`
/// (`ipam: cluster-pool`); its addresses, its Node's, else its CiliumNode's.
pub fn routes<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    cilium_nodes: impl IntoIterator<Item = &'a CiliumNode>,
    me: &str,
) -> BTreeSet<NodeRoute> {
    let mut out = BTreeSet::new();
    for (_, (cidrs, addresses)) in others(nodes, cilium_nodes, me) {
        for cidr in cidrs {
            let via = addresses
                .iter()
                .find(|a| a.is_ipv4() == matches!(cidr, IpNet::V4(_)));
            if let Some(via) = via {
                out.insert(NodeRoute {
                    cidr,
                    next_hop: NextHop::Via(*via),
                });
            }
        }
    }
    out
}

/// Tunnel mode's routes: the same CIDRs as `native`, into the tunnel device `ifindex`, from this
/// node's address of each CIDR's family among `mine` (a CIDR of a family this node has no
/// address of gets no route).
pub fn tunnelled(
    native: &BTreeSet<NodeRoute>,
    ifindex: u32,
    mine: &[IpAddr],
) -> BTreeSet<NodeRoute> {
    native
        .iter()
        .filter_map(|r| {
            let src = mine
                .iter()
                .find(|a| a.is_ipv4() == matches!(r.cidr, IpNet::V4(_)))?;
            Some(NodeRoute {
                cidr: r.cidr,
                next_hop: NextHop::Tunnel { ifindex, src: *src },
            })
        })
        .collect()
}

/// This node's own addresses: its Node's, else its CiliumNode's.
pub fn own_addresses(
    nodes: &[impl Borrow<Node>],
    cilium_nodes: &[impl Borrow<CiliumNode>],
    me: &str,
) -> Vec<IpAddr> {
    let node = nodes.iter().map(Borrow::borrow).find(|n| n.name == me);
    match node {
        Some(n) if !n.addresses.is_empty() => n.addresses.clone(),
        _ => cilium_nodes
            .iter()
            .map(Borrow::borrow)
            .find(|n| n.name == me)
            .map(|n| n.addresses.clone())
            .unwrap_or_default(),
    }
}

/// Every other node by name with its pod CIDRs and addresses: its Node's and its CiliumNode's
/// CIDRs; its Node's addresses, else its CiliumNode's.
fn others<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    cilium_nodes: impl IntoIterator<Item = &'a CiliumNode>,
    me: &str,
) -> BTreeMap<&'a str, (Vec<IpNet>, Vec<IpAddr>)> {
    let mut known: BTreeMap<&str, (Vec<IpNet>, Vec<IpAddr>)> = BTreeMap::new();
    for node in nodes {
        let entry = known.entry(&node.name).or_default();
        entry.0.extend(&node.pod_cidrs);
        entry.1.extend(&node.addresses);
    }
    for node in cilium_nodes {
        let entry = known.entry(&node.name).or_default();
        entry.0.extend(&node.pod_cidrs);
        if entry.1.is_empty() {
            entry.1.extend(&node.addresses);
        }
    }
    known.remove(me);
    known
}

/// The ipcache entries of the cluster's other nodes and their pods: each other node's
/// addresses (its Node's, else its CiliumNode's) as `remote-node`, each pod address of a
/// CiliumEndpoint that another node hosts as its identity. A CiliumEndpoint this node hosts
/// (its `node_ip` is one of `my_ips`) is skipped: this node knows its own pods better.
///
/// With `tunnel` (tunnel mode), a pod's entry also names its node's IPv4 address as the
/// tunnel endpoint, and each other node's pod CIDRs enter with the world's identity (the
/// closure gives it per address family) and that node as the tunnel endpoint, so that traffic
/// to a pod not known yet still takes the tunnel, as in Cilium.
pub fn ipcache<'a>(
    nodes: &'a [impl Borrow<Node>],
    cilium_nodes: &'a [impl Borrow<CiliumNode>],
    endpoints: impl IntoIterator<Item = &'a CiliumEndpoint>,
    me: &str,
    remote_node: u32,
    tunnel: Option<&dyn Fn(IpAddr) -> u32>,
) -> BTreeMap<IpNet, IpcacheInfo> {
    let mut out = BTreeMap::new();
    let my_ips: BTreeSet<IpAddr> = nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| n.name == me)
        .flat_map(|n| n.addresses.iter().copied())
        .collect();
    let others = others(
        nodes.iter().map(Borrow::borrow),
        cilium_nodes.iter().map(Borrow::borrow),
        me,
    );
    for (cidrs, addresses) in others.values() {
        if let (Some(world), Some(endpoint)) = (tunnel, ipv4_of(addresses)) {
            for cidr in cidrs {
                let info = IpcacheInfo {
                    identity: world(cidr.addr()),
                    tunnel_endpoint: Some(endpoint),
                };
                out.insert(*cidr, info);
            }
        }
    }
    // A node's addresses are its Node's (a CiliumNode's may lag behind), else, for a node
    // known only by its CiliumNode or its kvstore entry, those.
    for (_, addresses) in others.values() {
        for ip in addresses {
            out.insert(IpNet::from(*ip), IpcacheInfo::from(remote_node));
        }
    }
    for ep in endpoints {
        if ep.identity == 0 || ep.node_ip.is_some_and(|ip| my_ips.contains(&ip)) {
            continue;
        }
        let tunnel_endpoint = match (tunnel, ep.node_ip) {
            (Some(_), Some(IpAddr::V4(node))) => Some(node),
            _ => None,
        };
        for ip in &ep.addresses {
            let info = IpcacheInfo {
                identity: ep.identity,
                tunnel_endpoint,
            };
            out.insert(IpNet::from(*ip), info);
        }
    }
    out
}

/// The named ports of the remote pods whose addresses `entries` (from [`ipcache`]) give their
/// identity: what an egress rule naming a port means when one of them is the peer, as a local
/// pod's named ports are. A pod whose address another claim took (its node's own pods) adds
/// nothing.
pub fn named_ports<'a>(
    endpoints: impl IntoIterator<Item = &'a CiliumEndpoint>,
    entries: &BTreeMap<IpNet, IpcacheInfo>,
) -> BTreeMap<IpNet, Vec<NamedPort>> {
    let mut out = BTreeMap::new();
    for ep in endpoints {
        if ep.named_ports.is_empty() {
            continue;
        }
        for ip in &ep.addresses {
            let prefix = IpNet::from(*ip);
            if entries
                .get(&prefix)
                .is_some_and(|e| e.identity == ep.identity)
            {
                out.insert(prefix, ep.named_ports.clone());
            }
        }
    }
    out
}

/// A node's first IPv4 address: the one tunnels go to.
fn ipv4_of(addresses: &[IpAddr]) -> Option<Ipv4Addr> {
    addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ips: &[&str], cidrs: &[&str]) -> Node {
        Node {
            name: name.into(),
            labels: Default::default(),
            addresses: ips.iter().map(|i| i.parse().unwrap()).collect(),
            pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    fn cep(name: &str, ip: &str, identity: u32, node: &str) -> CiliumEndpoint {
        CiliumEndpoint {
            namespace: "shop".into(),
            name: name.into(),
            id: 1,
            identity,
            addresses: vec![ip.parse().unwrap()],
            node_ip: Some(node.parse().unwrap()),
            named_ports: Vec::new(),
        }
    }

    #[test]
    fn a_remote_pods_named_ports_go_with_its_entry_only() {
        let http = NamedPort {
            name: "http".into(),
            port: 8080,
            protocol: cellium_resources::Protocol::Tcp,
        };
        let mut web = cep("web", "10.2.0.5", 3001, "192.0.2.2");
        web.named_ports = vec![http.clone()];
        let mut mine = cep("mine", "10.1.0.5", 3002, "192.0.2.1");
        mine.named_ports = vec![http.clone()];
        let entries: BTreeMap<IpNet, IpcacheInfo> = [
            ("10.2.0.5/32".parse().unwrap(), IpcacheInfo::from(3001)),
            // Another claim's identity for the address: not this pod's entry.
            ("10.1.0.5/32".parse().unwrap(), IpcacheInfo::from(9)),
        ]
        .into();
        let ports = named_ports([&web, &mine], &entries);
        assert_eq!(ports, [("10.2.0.5/32".parse().unwrap(), vec![http])].into());
    }

    #[test]
    fn routes_go_to_every_other_node_by_family() {
        let nodes = [
            node("n1", &["192.0.2.1"], &["10.1.0.0/24"]),
            node(
                "n2",
                &["192.0.2.2", "2001:db8::2"],
                &["10.2.0.0/24", "fd00:2::/64"],
            ),
            node("n3", &["192.0.2.3"], &["10.3.0.0/24", "fd00:3::/64"]),
        ];
        let cilium = [CiliumNode {
            name: "n4".into(),
            addresses: vec!["192.0.2.4".parse().unwrap()],
            pod_cidrs: vec!["10.4.0.0/24".parse().unwrap()],
            operator_error: None,
        }];
        let r: Vec<String> = routes(&nodes, &cilium, "n1")
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(
            r,
            [
                "10.2.0.0/24 via 192.0.2.2",
                "10.3.0.0/24 via 192.0.2.3",
                "10.4.0.0/24 via 192.0.2.4",
                "fd00:2::/64 via 2001:db8::2"
            ]
        );
    }

    #[test]
    fn other_nodes_and_their_pods_are_known_this_nodes_are_left_to_it() {
        let nodes = [
            node("n1", &["192.0.2.1"], &["10.1.0.0/24"]),
            node("n2", &["192.0.2.2"], &["10.2.0.0/24"]),
        ];
        let eps = [
            cep("a", "10.1.0.5", 300, "192.0.2.1"),
            cep("b", "10.2.0.5", 301, "192.0.2.2"),
            cep("c", "10.2.0.6", 0, "192.0.2.2"),
        ];
        let m = ipcache(&nodes, &[] as &[CiliumNode], &eps, "n1", 6, None);
        let text: Vec<String> = m
            .iter()
            .map(|(k, v)| format!("{k}={}", v.identity))
            .collect();
        assert_eq!(text, ["10.2.0.5/32=301", "192.0.2.2/32=6"]);
        assert!(m.values().all(|v| v.tunnel_endpoint.is_none()));
    }

    #[test]
    fn tunnel_routes_go_into_the_device_from_this_node_s_address_of_the_family() {
        let nodes = [
            node("n1", &["192.0.2.1"], &["10.1.0.0/24"]),
            node(
                "n2",
                &["192.0.2.2", "2001:db8::2"],
                &["10.2.0.0/24", "fd00:2::/64"],
            ),
        ];
        let native = routes(&nodes, &[], "n1");
        let mine = own_addresses(&nodes, &[] as &[CiliumNode], "n1");
        let r: Vec<String> = tunnelled(&native, 7, &mine)
            .iter()
            .map(|r| r.to_string())
            .collect();
        // n1 has no IPv6 address: no IPv6 route.
        assert_eq!(r, ["10.2.0.0/24 dev #7 src 192.0.2.1"]);
    }

    #[test]
    fn tunnel_mode_names_the_hosting_node_of_pods_and_pod_cidrs() {
        let nodes = [
            node("n1", &["192.0.2.1"], &["10.1.0.0/24"]),
            node(
                "n2",
                &["2001:db8::2", "192.0.2.2"],
                &["10.2.0.0/24", "fd00:2::/64"],
            ),
        ];
        let eps = [cep("a", "10.2.0.5", 301, "192.0.2.2")];
        let world = |ip: IpAddr| if ip.is_ipv4() { 9 } else { 10 };
        let m = ipcache(&nodes, &[] as &[CiliumNode], &eps, "n1", 6, Some(&world));
        let text: Vec<String> = m
            .iter()
            .map(|(k, v)| {
                let via = v.tunnel_endpoint.map(|t| t.to_string()).unwrap_or_default();
                format!("{k}={}@{via}", v.identity)
            })
            .collect();
        assert_eq!(
            text,
            [
                "10.2.0.0/24=9@192.0.2.2",
                "10.2.0.5/32=301@192.0.2.2",
                "192.0.2.2/32=6@",
                "2001:db8::2/128=6@",
                "fd00:2::/64=10@192.0.2.2",
            ]
        );
    }
}

//! What the cluster says this node should know of the others: a pure function of the tables.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use cellium_identity::CLUSTER_IDENTITIES;
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

/// Why a claim of another node's (a CiliumEndpoint, a kvstore ip entry) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// A reserved identity (1-255: host, world, remote-node, ...): only this node gives those.
    ReservedIdentity,
    /// A number outside the cluster's range (a node-local one, `1 << 24` and up, included):
    /// another node's local numbers mean nothing here.
    NotClusterIdentity,
    /// Its `node_ip` (HostIP) is no known node's address, or there is none.
    UnknownNode,
    /// The address is not in the pod CIDRs of the node it names.
    ForeignAddress,
    /// The identity's labels name another namespace than the claim's.
    NamespaceMismatch,
    /// A kvstore ip entry under a key that is not its own address's.
    KeyMismatch,
    /// Another claim of the same node took the address first.
    Conflict,
}

impl Refusal {
    /// The metric's `reason` label and the status note's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ReservedIdentity => "reserved-identity",
            Refusal::NotClusterIdentity => "not-cluster-identity",
            Refusal::UnknownNode => "unknown-node",
            Refusal::ForeignAddress => "foreign-address",
            Refusal::NamespaceMismatch => "namespace-mismatch",
            Refusal::KeyMismatch => "key-mismatch",
            Refusal::Conflict => "conflict",
        }
    }
}

/// A claim refused, with what it claimed (`shop/web 10.2.0.5 as 301 from 192.0.2.2`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Refused {
    /// Why.
    pub reason: Refusal,
    /// The claim, for the log and the status note.
    pub claim: String,
}

impl Refused {
    /// `ep`'s claim of `address` (all its addresses: `None`), refused for `reason`.
    pub fn new(reason: Refusal, ep: &CiliumEndpoint, address: Option<IpAddr>) -> Refused {
        let what = match address {
            Some(ip) => ip.to_string(),
            None => ep
                .addresses
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(","),
        };
        let from = ep
            .node_ip
            .map(|n| n.to_string())
            .unwrap_or_else(|| "no node".into());
        Refused {
            reason,
            claim: format!(
                "{}/{} {what} as {} from {from}",
                ep.namespace, ep.name, ep.identity
            ),
        }
    }
}

/// What [`ipcache`] gives: the entries, the named ports of the remote pods whose claims
/// stand, and the claims refused.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The ipcache entries.
    pub entries: BTreeMap<IpNet, IpcacheInfo>,
    /// The named ports of the pods whose addresses the entries give their identity: what an
    /// egress rule naming a port means when one of them is the peer.
    pub named_ports: BTreeMap<IpNet, Vec<NamedPort>>,
    /// The entries that are pods' addresses (with the cluster identity their claim carries).
    pub pods: BTreeSet<IpNet>,
    /// The claims refused.
    pub refused: Vec<Refused>,
}

/// Whether a claim may carry `identity`: a cluster number only ([`Refusal`] otherwise).
fn check_identity(identity: u32) -> Result<(), Refusal> {
    if identity <= 255 {
        Err(Refusal::ReservedIdentity)
    } else if !CLUSTER_IDENTITIES.contains(&identity) {
        Err(Refusal::NotClusterIdentity)
    } else {
        Ok(())
    }
}

/// The ipcache entries of the cluster's other nodes and their pods: each other node's
/// addresses (its Node's, else its CiliumNode's) as `remote-node`, and each pod address of a
/// CiliumEndpoint (or kvstore ip entry) another node hosts as its identity, where the claim
/// holds (see below). A CiliumEndpoint this node hosts (its `node_ip` is one of this node's
/// addresses) is skipped: this node knows its own pods better. One with identity 0 has none
/// yet.
///
/// An address belongs to one node: a claim stands only where its identity is a cluster
/// number (not reserved, not node-local), its `node_ip` is a known other node's address, the
/// address is in that node's pod CIDRs, and the identity's labels (`namespace_of` gives their
/// `io.kubernetes.pod.namespace`, when they are known) name the claim's namespace. Claims that
/// still disagree on one address's identity resolve to the first in (namespace, name) order.
/// Every other claim is refused, and returned with why.
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
    namespace_of: &dyn Fn(u32) -> Option<String>,
) -> Remote {
    let mut out = Remote::default();
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
                out.entries.insert(*cidr, info);
            }
        }
    }
    // A node's addresses are its Node's (a CiliumNode's may lag behind), else, for a node
    // known only by its CiliumNode or its kvstore entry, those.
    for (_, addresses) in others.values() {
        for ip in addresses {
            out.entries
                .insert(IpNet::from(*ip), IpcacheInfo::from(remote_node));
        }
    }
    // The node each address is of: the one a claim's `node_ip` names.
    let node_of: BTreeMap<IpAddr, &(Vec<IpNet>, Vec<IpAddr>)> = others
        .values()
        .flat_map(|node| node.1.iter().map(move |ip| (*ip, node)))
        .collect();
    let mut endpoints: Vec<&CiliumEndpoint> = endpoints
        .into_iter()
        .filter(|ep| ep.identity != 0 && !ep.node_ip.is_some_and(|ip| my_ips.contains(&ip)))
        .collect();
    // The order conflicts resolve in (equal names claim different addresses: one kvstore
    // entry per address).
    endpoints.sort_unstable_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut namespaces: BTreeMap<u32, Option<String>> = BTreeMap::new();
    for ep in endpoints {
        let node = match check_identity(ep.identity) {
            Err(reason) => Err(reason),
            Ok(()) => ep
                .node_ip
                .and_then(|ip| node_of.get(&ip))
                .ok_or(Refusal::UnknownNode),
        };
        // Many pods share an identity: its labels are looked up once.
        let namespace = namespaces
            .entry(ep.identity)
            .or_insert_with(|| namespace_of(ep.identity));
        let node = node.and_then(|node| match namespace {
            Some(ns) if *ns != ep.namespace => Err(Refusal::NamespaceMismatch),
            _ => Ok(node),
        });
        let (cidrs, addresses) = match node {
            Ok(node) => node,
            Err(reason) => {
                out.refused.push(Refused::new(reason, ep, None));
                continue;
            }
        };
        let tunnel_endpoint = tunnel.and_then(|_| ipv4_of(addresses));
        for ip in &ep.addresses {
            let prefix = IpNet::from(*ip);
            if !cidrs.iter().any(|c| c.contains(ip)) {
                out.refused
                    .push(Refused::new(Refusal::ForeignAddress, ep, Some(*ip)));
                continue;
            }
            // The address is taken by a claim before this one, or is another node's own
            // (`remote-node`): only the same identity agrees with it.
            match out.entries.get(&prefix) {
                Some(first) if first.identity != ep.identity => {
                    out.refused
                        .push(Refused::new(Refusal::Conflict, ep, Some(*ip)));
                    continue;
                }
                Some(_) => {}
                None => {
                    let info = IpcacheInfo {
                        identity: ep.identity,
                        tunnel_endpoint,
                    };
                    out.entries.insert(prefix, info);
                    out.pods.insert(prefix);
                }
            }
            if !ep.named_ports.is_empty() {
                out.named_ports
                    .entry(prefix)
                    .or_insert_with(|| ep.named_ports.clone());
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

    /// No identity's labels known: no namespace to compare.
    fn unknown(_: u32) -> Option<String> {
        None
    }

    fn two_nodes() -> [Node; 3] {
        [
            node("n1", &["192.0.2.1"], &["10.1.0.0/24"]),
            node("n2", &["192.0.2.2"], &["10.2.0.0/24"]),
            node("n3", &["192.0.2.3"], &["10.3.0.0/24"]),
        ]
    }

    /// The entries as `prefix=identity`, and the refusals as `reason: claim`.
    fn claims(
        eps: &[CiliumEndpoint],
        ns: &dyn Fn(u32) -> Option<String>,
    ) -> (Vec<String>, Vec<String>) {
        let r = ipcache(&two_nodes(), &[] as &[CiliumNode], eps, "n1", 6, None, ns);
        let entries = r
            .entries
            .iter()
            .map(|(k, v)| format!("{k}={}", v.identity))
            .collect();
        let refused = r
            .refused
            .iter()
            .map(|r| format!("{}: {}", r.reason.as_str(), r.claim))
            .collect();
        (entries, refused)
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
        // This node's own pod, and a claim refused (n3 claiming n2's address): no ports.
        let mut mine = cep("mine", "10.1.0.5", 3002, "192.0.2.1");
        mine.named_ports = vec![http.clone()];
        let mut forged = cep("a-forged", "10.2.0.6", 3001, "192.0.2.3");
        forged.named_ports = vec![http.clone()];
        let r = ipcache(
            &two_nodes(),
            &[] as &[CiliumNode],
            [&web, &mine, &forged],
            "n1",
            6,
            None,
            &unknown,
        );
        assert_eq!(
            r.named_ports,
            [("10.2.0.5/32".parse().unwrap(), vec![http])].into()
        );
    }

    #[test]
    fn reserved_local_and_out_of_range_identities_from_other_nodes_are_refused() {
        let eps = [
            cep("host", "10.2.0.1", 1, "192.0.2.2"),
            cep("world", "10.2.0.2", 2, "192.0.2.2"),
            cep("ingress", "10.2.0.3", 255, "192.0.2.2"),
            cep(
                "local",
                "10.2.0.4",
                cellium_identity::LOCAL_IDENTITY_FLAG + 5,
                "192.0.2.2",
            ),
            cep("above", "10.2.0.5", 65536, "192.0.2.2"),
            cep("fine", "10.2.0.6", 65535, "192.0.2.2"),
        ];
        let (entries, refused) = claims(&eps, &unknown);
        assert_eq!(
            entries,
            ["10.2.0.6/32=65535", "192.0.2.2/32=6", "192.0.2.3/32=6"]
        );
        assert_eq!(
            refused,
            [
                "not-cluster-identity: shop/above 10.2.0.5 as 65536 from 192.0.2.2",
                "reserved-identity: shop/host 10.2.0.1 as 1 from 192.0.2.2",
                "reserved-identity: shop/ingress 10.2.0.3 as 255 from 192.0.2.2",
                "not-cluster-identity: shop/local 10.2.0.4 as 16777221 from 192.0.2.2",
                "reserved-identity: shop/world 10.2.0.2 as 2 from 192.0.2.2",
            ]
        );
    }

    #[test]
    fn an_address_is_claimed_only_by_the_node_whose_pod_cidrs_hold_it() {
        let mut nowhere = cep("nowhere", "10.2.0.7", 301, "192.0.2.2");
        nowhere.node_ip = None;
        let eps = [
            cep("web", "10.2.0.5", 300, "192.0.2.2"),
            // n3 claims n2's pod, this node's pod, and n2's own address.
            cep("thief", "10.2.0.5", 301, "192.0.2.3"),
            cep("mine", "10.1.0.5", 301, "192.0.2.3"),
            cep("node", "192.0.2.2", 301, "192.0.2.3"),
            // A node no one knows, and none at all.
            cep("stranger", "10.2.0.6", 301, "198.51.100.1"),
            nowhere,
        ];
        let (entries, refused) = claims(&eps, &unknown);
        assert_eq!(
            entries,
            ["10.2.0.5/32=300", "192.0.2.2/32=6", "192.0.2.3/32=6"]
        );
        assert_eq!(
            refused,
            [
                "foreign-address: shop/mine 10.1.0.5 as 301 from 192.0.2.3",
                "foreign-address: shop/node 192.0.2.2 as 301 from 192.0.2.3",
                "unknown-node: shop/nowhere 10.2.0.7 as 301 from no node",
                "unknown-node: shop/stranger 10.2.0.6 as 301 from 198.51.100.1",
                "foreign-address: shop/thief 10.2.0.5 as 301 from 192.0.2.3",
            ]
        );
    }

    #[test]
    fn a_claim_whose_identity_is_of_another_namespace_is_refused_and_conflicts_resolve_by_name() {
        let ns = |id: u32| (id == 300).then(|| "shop".to_string());
        let mut evil = cep("aaa", "10.2.0.5", 300, "192.0.2.2");
        evil.namespace = "evil".into();
        let eps = [
            cep("web", "10.2.0.5", 300, "192.0.2.2"),
            // Named to sort first, in another namespace, with web's node as its own.
            evil,
            // The same node's two claims on one address: the first by name stands.
            cep("b", "10.2.0.9", 302, "192.0.2.2"),
            cep("a", "10.2.0.9", 301, "192.0.2.2"),
            cep("c", "10.2.0.9", 301, "192.0.2.2"),
        ];
        let (entries, refused) = claims(&eps, &ns);
        assert_eq!(
            entries,
            [
                "10.2.0.5/32=300",
                "10.2.0.9/32=301",
                "192.0.2.2/32=6",
                "192.0.2.3/32=6"
            ]
        );
        assert_eq!(
            refused,
            [
                "namespace-mismatch: evil/aaa 10.2.0.5 as 300 from 192.0.2.2",
                "conflict: shop/b 10.2.0.9 as 302 from 192.0.2.2",
            ]
        );
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
        let m = ipcache(&nodes, &[] as &[CiliumNode], &eps, "n1", 6, None, &unknown).entries;
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
        // Named by its node's IPv6 address, a pod still goes to that node's IPv4 one: the
        // tunnel endpoint is the node's, never an address the claim names.
        let eps = [
            cep("a", "10.2.0.5", 301, "192.0.2.2"),
            cep("b", "10.2.0.6", 302, "2001:db8::2"),
        ];
        let world = |ip: IpAddr| if ip.is_ipv4() { 9 } else { 10 };
        let m = ipcache(
            &nodes,
            &[] as &[CiliumNode],
            &eps,
            "n1",
            6,
            Some(&world),
            &unknown,
        )
        .entries;
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
                "10.2.0.6/32=302@192.0.2.2",
                "192.0.2.2/32=6@",
                "2001:db8::2/128=6@",
                "fd00:2::/64=10@192.0.2.2",
            ]
        );
    }
}

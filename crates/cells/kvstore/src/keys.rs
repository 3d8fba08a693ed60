//! Cilium's key layout in etcd, so the data reads the same to anyone who knows Cilium's.
//!
//! - `cilium/state/identities/v1/id/<N>` -> the labels key: the number's owner, no lease;
//! - `cilium/state/identities/v1/value/<labels key>/<node IP>` -> `<N>`: one per node using
//!   it, on that node's lease, ending with the node's IPv4 address (else IPv6), as Cilium's
//!   `GetNodeSuffix`;
//! - `cilium/state/identities/v1/locks/<labels key>` -> the holder: allocation's lock;
//! - `cilium/state/ip/v1/default/<IP>` -> [`IpEntry`] JSON, on the hosting node's lease;
//! - `cilium/state/nodes/v1/<cluster>/<node>` -> [`NodeEntry`] JSON, on the node's lease.

use std::net::IpAddr;

use cellium_identity::CLUSTER_IDENTITIES;
use cellium_labels::{Label, Labels};
use serde::{Deserialize, Serialize};

/// Every identity key.
pub const IDENTITIES: &str = "cilium/state/identities/v1/";
/// Numbers to labels keys.
pub const ID_PREFIX: &str = "cilium/state/identities/v1/id/";
/// Labels keys to numbers, per node.
pub const VALUE_PREFIX: &str = "cilium/state/identities/v1/value/";
/// Allocation locks.
pub const LOCK_PREFIX: &str = "cilium/state/identities/v1/locks/";
/// ip -> identity entries of the default address space.
pub const IP_PREFIX: &str = "cilium/state/ip/v1/default/";
/// Nodes, by cluster.
pub const NODES_PREFIX: &str = "cilium/state/nodes/v1/";
/// The cluster's name in node keys (Cilium's default `cluster-name`).
pub const CLUSTER: &str = "default";

/// The labels key of a label set: each label `source:key=value;`, sorted, as Cilium's
/// `SortedList` (`k8s:app=web;k8s:io.kubernetes.pod.namespace=demo;`).
pub fn labels_key(labels: &Labels) -> String {
    let mut all: Vec<String> = labels.iter().map(|l| format!("{l};")).collect();
    all.sort();
    all.concat()
}

/// The label set of a labels key; `None` when one label does not parse or there is none.
pub fn parse_labels_key(key: &str) -> Option<Labels> {
    let mut labels = Labels::new();
    for part in key.split(';').filter(|p| !p.is_empty()) {
        labels.insert(part.parse::<Label>().ok()?);
    }
    (!labels.is_empty()).then_some(labels)
}

/// `id/<N>`.
pub fn id_key(id: u32) -> String {
    format!("{ID_PREFIX}{id}")
}

/// `value/<labels key>/` (every node's use of the labels).
pub fn value_prefix(labels_key: &str) -> String {
    format!("{VALUE_PREFIX}{labels_key}/")
}

/// `value/<labels key>/<node IP>`: `suffix` is the node's address (`Kvstore::node_suffix`).
pub fn value_key(labels_key: &str, suffix: &str) -> String {
    format!("{VALUE_PREFIX}{labels_key}/{suffix}")
}

/// `locks/<labels key>`.
pub fn lock_key(labels_key: &str) -> String {
    format!("{LOCK_PREFIX}{labels_key}")
}

/// `nodes/v1/<cluster>/<node>`.
pub fn node_key(node: &str) -> String {
    format!("{NODES_PREFIX}{CLUSTER}/{node}")
}

/// The value of `nodes/v1/<cluster>/<node>`: the fields of Cilium's `nodeTypes.Node` that
/// routing needs (Go's field names; CIDRs as Go encodes a `net.IPNet`: the address and the
/// mask in base64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The node's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Its cluster.
    #[serde(rename = "Cluster", default)]
    pub cluster: String,
    /// Its addresses.
    #[serde(rename = "IPAddresses", default)]
    pub addresses: Vec<NodeAddress>,
    /// Its IPv4 pod CIDR.
    #[serde(rename = "IPv4AllocCIDR", default, with = "go_ipnet")]
    pub ipv4_alloc_cidr: Option<ipnet::IpNet>,
    /// Its IPv6 pod CIDR.
    #[serde(rename = "IPv6AllocCIDR", default, with = "go_ipnet")]
    pub ipv6_alloc_cidr: Option<ipnet::IpNet>,
}

/// One address of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    /// `InternalIP` (Kubernetes' address types).
    #[serde(rename = "Type")]
    pub kind: String,
    /// The address.
    #[serde(rename = "IP")]
    pub ip: IpAddr,
}

/// A CIDR as Go's `encoding/json` writes a `net.IPNet`: `{"IP": "10.0.0.0", "Mask": "////AA=="}`.
mod go_ipnet {
    use std::net::IpAddr;

    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use ipnet::IpNet;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct GoIpNet {
        #[serde(rename = "IP")]
        ip: IpAddr,
        #[serde(rename = "Mask")]
        mask: String,
    }

    pub fn serialize<S: Serializer>(net: &Option<IpNet>, s: S) -> Result<S::Ok, S::Error> {
        net.map(|n| {
            let mask = match n.netmask() {
                IpAddr::V4(m) => STANDARD.encode(m.octets()),
                IpAddr::V6(m) => STANDARD.encode(m.octets()),
            };
            GoIpNet {
                ip: n.network(),
                mask,
            }
        })
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpNet>, D::Error> {
        let Some(go) = Option::<GoIpNet>::deserialize(d)? else {
            return Ok(None);
        };
        let bad = |why: &str| serde::de::Error::custom(format!("a CIDR's mask: {why}"));
        let mask = STANDARD.decode(&go.mask).map_err(|_| bad("not base64"))?;
        if mask.len() != if go.ip.is_ipv4() { 4 } else { 16 } {
            return Err(bad("not of the address's family"));
        }
        let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
        let prefix = u8::try_from(ones).map_err(|_| bad("too long"))?;
        IpNet::new(go.ip, prefix)
            .map(|n| Some(n.trunc()))
            .map_err(|_| bad("out of range"))
    }
}

/// `ip/v1/default/<IP>`.
pub fn ip_key(ip: IpAddr) -> String {
    format!("{IP_PREFIX}{ip}")
}

/// The numbers to try for a labels key, every cluster number once, starting at a hash of it
/// (FNV-1a: stable across versions and machines). Every node walks the same sequence for the
/// same labels, so two that race on a label set pick the same first free number.
pub fn probe_sequence(labels_key: &str) -> impl Iterator<Item = u32> + use<> {
    let first = *CLUSTER_IDENTITIES.start();
    let size = CLUSTER_IDENTITIES.end() - first + 1;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in labels_key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let start = (hash % u64::from(size)) as u32;
    (0..size).map(move |i| first + (start + i) % size)
}

/// A named port of an ip entry, as Cilium writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPort {
    /// The port's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The port number.
    #[serde(rename = "Port")]
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(rename = "Protocol")]
    pub protocol: String,
}

/// The value of `ip/v1/default/<IP>`: Cilium's `IPIdentityPair`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpEntry {
    /// The address.
    #[serde(rename = "IP")]
    pub ip: IpAddr,
    /// A prefix length (always absent: entries are single addresses).
    #[serde(rename = "Mask", default)]
    pub mask: Option<String>,
    /// The address of the node that hosts it: where traffic to it goes.
    #[serde(rename = "HostIP", default)]
    pub host_ip: Option<IpAddr>,
    /// Its security identity.
    #[serde(rename = "ID")]
    pub id: u32,
    /// The encryption key index (0: none).
    #[serde(rename = "Key", default)]
    pub key: u8,
    /// Who wrote it: `cilium-global:default:<node>:<endpoint id>`.
    #[serde(rename = "Metadata", default)]
    pub metadata: String,
    /// The pod's namespace.
    #[serde(rename = "K8sNamespace", default)]
    pub namespace: String,
    /// The pod's name.
    #[serde(rename = "K8sPodName", default)]
    pub pod_name: String,
    /// Its named ports.
    #[serde(rename = "NamedPorts", default)]
    pub named_ports: Vec<NamedPort>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_entries_read_as_cilium_writes_them() {
        let text = r#"{"Name":"n9","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"192.0.2.9"}],"IPv4AllocCIDR":{"IP":"10.245.9.0","Mask":"////AA=="},"IPv6AllocCIDR":null,"ClusterID":0}"#;
        let entry: NodeEntry = serde_json::from_str(text).unwrap();
        assert_eq!(entry.name, "n9");
        assert_eq!(
            entry.addresses[0].ip,
            "192.0.2.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            entry.ipv4_alloc_cidr,
            Some("10.245.9.0/24".parse().unwrap())
        );
        assert_eq!(entry.ipv6_alloc_cidr, None);
        let back = serde_json::to_string(&entry).unwrap();
        assert!(
            back.contains(r#""IPv4AllocCIDR":{"IP":"10.245.9.0","Mask":"////AA=="}"#),
            "{back}"
        );
        let v6: NodeEntry = serde_json::from_str(
            r#"{"Name":"n9","IPv6AllocCIDR":{"IP":"fd00::","Mask":"//////////////////8AAA=="}}"#,
        )
        .unwrap();
        assert_eq!(v6.ipv6_alloc_cidr, Some("fd00::/112".parse().unwrap()));
        let bad =
            r#"{"Name":"n9","IPv4AllocCIDR":{"IP":"10.0.0.0","Mask":"/////////////////wAAAA=="}}"#;
        assert!(serde_json::from_str::<NodeEntry>(bad).is_err());
        assert_eq!(node_key("n1"), "cilium/state/nodes/v1/default/n1");
    }

    #[test]
    fn labels_keys_are_cilium_s_and_read_back() {
        let labels: Labels = "k8s:io.kubernetes.pod.namespace=demo,k8s:app=web"
            .parse()
            .unwrap();
        let key = labels_key(&labels);
        assert_eq!(key, "k8s:app=web;k8s:io.kubernetes.pod.namespace=demo;");
        assert_eq!(parse_labels_key(&key), Some(labels));
        assert_eq!(parse_labels_key(""), None);
        assert_eq!(parse_labels_key("no source;"), None);
        assert_eq!(
            value_key(&key, "192.0.2.1"),
            "cilium/state/identities/v1/value/k8s:app=web;k8s:io.kubernetes.pod.namespace=demo;/192.0.2.1"
        );
    }

    #[test]
    fn the_probe_sequence_covers_every_cluster_number_once() {
        let all: std::collections::BTreeSet<u32> = probe_sequence("k8s:app=web;").collect();
        assert_eq!(
            all.len() as u32,
            CLUSTER_IDENTITIES.end() - CLUSTER_IDENTITIES.start() + 1
        );
        assert_eq!(
            probe_sequence("k8s:app=web;").next(),
            probe_sequence("k8s:app=web;").next()
        );
    }

    #[test]
    fn ip_entries_read_as_cilium_writes_them() {
        let json = r#"{"IP":"10.0.1.5","Mask":null,"HostIP":"192.0.2.1","ID":300,"Key":0,
            "Metadata":"cilium-global:default:n1:12","K8sNamespace":"demo","K8sPodName":"web",
            "NamedPorts":[{"Name":"http","Port":80,"Protocol":"TCP"}]}"#;
        let e: IpEntry = serde_json::from_str(json).unwrap();
        assert_eq!(e.id, 300);
        assert_eq!(e.host_ip, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(e.named_ports[0].port, 80);
        let back: IpEntry = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back, e);
        // Hostile input: not JSON, or missing the identity.
        assert!(serde_json::from_str::<IpEntry>("{").is_err());
        assert!(serde_json::from_str::<IpEntry>(r#"{"IP":"10.0.0.1"}"#).is_err());
    }
}

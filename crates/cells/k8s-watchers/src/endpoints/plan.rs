//! What the API server should hold for this node's endpoints, and the writes that get it
//! there from what it holds: pure functions, so every case is a unit test.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cellium_endpoint_manager::{Endpoint, State};
use cellium_resources::NamedPort;
use serde::Serialize;
use serde_json::Value;

/// A CiliumEndpoint's place: (namespace, name), the pod's.
pub(crate) type Key = (String, String);

/// A CiliumEndpoint's `status`, as Cilium's agent writes it (the fields Cellium knows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CepStatus {
    /// The endpoint id.
    pub(crate) id: u64,
    /// Who the runtime and Kubernetes know it as.
    #[serde(rename = "external-identifiers")]
    pub(crate) external_identifiers: ExternalIdentifiers,
    /// Its security identity.
    pub(crate) identity: CepIdentity,
    /// Its addresses and node.
    pub(crate) networking: CepNetworking,
    /// `ready`: only ready endpoints are written.
    pub(crate) state: &'static str,
    /// The pod's named container ports: what other nodes' egress rules naming a port mean
    /// when this pod is the peer.
    #[serde(rename = "named-ports", skip_serializing_if = "Vec::is_empty")]
    pub(crate) named_ports: Vec<CepNamedPort>,
}

/// One entry of `status.named-ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CepNamedPort {
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) protocol: String,
}

/// `status.external-identifiers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ExternalIdentifiers {
    #[serde(rename = "container-id")]
    pub(crate) container_id: String,
    #[serde(rename = "k8s-namespace")]
    pub(crate) k8s_namespace: String,
    #[serde(rename = "k8s-pod-name")]
    pub(crate) k8s_pod_name: String,
    /// `namespace/name`.
    #[serde(rename = "pod-name")]
    pub(crate) pod_name: String,
}

/// `status.identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CepIdentity {
    pub(crate) id: u64,
    /// `source:key=value`, sorted.
    pub(crate) labels: Vec<String>,
}

/// `status.networking`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CepNetworking {
    pub(crate) addressing: Vec<AddressPair>,
    /// The node's IP; empty while the Node's addresses are not known.
    pub(crate) node: String,
}

/// One entry of `status.networking.addressing`: an IPv4 and an IPv6 address of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AddressPair {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ipv4: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ipv6: Option<String>,
}

/// What the endpoints ask of the API server.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Desired {
    /// The status each CiliumEndpoint must have, as JSON (compared with what is stored).
    pub(crate) write: BTreeMap<Key, Value>,
    /// Pods whose endpoint is being created or deleted: their CiliumEndpoint, if any, is
    /// left as it is until the endpoint is ready (then written) or gone (then deleted), so
    /// that a pod's object does not flap while its endpoint is set up again.
    pub(crate) hold: BTreeSet<Key>,
}

/// What one of this node's CiliumEndpoints holds now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observed {
    /// Its uid, so that a delete never removes an object written since it was listed.
    pub(crate) uid: Option<String>,
    /// Its `status` (`Null` when it has none).
    pub(crate) status: Value,
}

/// The writes of one pass.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Missing objects.
    pub(crate) create: Vec<Key>,
    /// Objects whose status differs.
    pub(crate) update: Vec<Key>,
    /// Objects whose endpoint is gone, with the uid they were listed with.
    pub(crate) delete: Vec<(Key, Option<String>)>,
    /// Objects already as they should be.
    pub(crate) in_line: usize,
}

impl Plan {
    /// How many writes it makes.
    pub(crate) fn writes(&self) -> usize {
        self.create.len() + self.update.len() + self.delete.len()
    }
}

/// The longest label value the API server accepts.
const LABEL_VALUE_MAX: usize = 63;

/// The [`NODE_LABEL`](super::NODE_LABEL) value of the objects of `node`: its name, or, for a
/// name longer than a label value may be (node names may have 253 characters), its first 46
/// characters, `-` and the 64-bit FNV-1a digest of the whole name in hex, so that two long
/// names that share their start still differ. The digest is computed here, not by a hasher
/// of the standard library, because it must not change between builds: it is how a
/// restarted agent finds its objects.
pub(crate) fn owner_label(node: &str) -> String {
    if node.len() <= LABEL_VALUE_MAX {
        return node.to_string();
    }
    let digest = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    // Node names are DNS subdomains: ASCII, so any byte index is a character boundary, and
    // they start with an alphanumeric, as a label value must (it must end with one too,
    // which the hex digest does).
    let stem = node.get(..LABEL_VALUE_MAX - 17).unwrap_or(node);
    format!("{stem}-{digest:016x}")
}

/// The CiliumEndpoints the node's endpoints ask for: one per pod, from its ready endpoint,
/// with the named ports `ports` gives it. Endpoints without a pod (a runtime that named none)
/// have no object. A pod with several endpoints (a sandbox being replaced) gets the newest
/// one's.
pub(crate) fn desired(
    endpoints: &[Endpoint],
    node_ip: Option<IpAddr>,
    ports: &dyn Fn(&Endpoint) -> Vec<NamedPort>,
) -> Desired {
    let mut newest: BTreeMap<Key, &Endpoint> = BTreeMap::new();
    let mut out = Desired::default();
    for ep in endpoints {
        let Some(pod) = &ep.pod else { continue };
        let key = (pod.namespace.clone(), pod.name.clone());
        if ep.state != State::Ready {
            out.hold.insert(key);
            continue;
        }
        let newer = |old: &&Endpoint| (ep.created_unix_ms, ep.id) > (old.created_unix_ms, old.id);
        if newest.get(&key).is_none_or(newer) {
            newest.insert(key, ep);
        }
    }
    for (key, ep) in newest {
        // A ready endpoint of the pod wins over one being set up or torn down.
        out.hold.remove(&key);
        let status = serde_json::to_value(status(ep, node_ip, &ports(ep))).unwrap_or(Value::Null);
        out.write.insert(key, status);
    }
    out
}

/// The status of `ep`'s CiliumEndpoint.
pub(crate) fn status(ep: &Endpoint, node_ip: Option<IpAddr>, ports: &[NamedPort]) -> CepStatus {
    let (namespace, name) = ep
        .pod
        .as_ref()
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .unwrap_or_default();
    let v4: Vec<String> = (ep.addresses.iter())
        .filter(|a| a.ip.is_ipv4())
        .map(|a| a.ip.to_string())
        .collect();
    let v6: Vec<String> = (ep.addresses.iter())
        .filter(|a| a.ip.is_ipv6())
        .map(|a| a.ip.to_string())
        .collect();
    // Cilium pairs the pod's IPv4 and IPv6 addresses in one entry; further addresses of a
    // family (not made by Cellium's IPAM today) get entries of their own.
    let addressing = (0..v4.len().max(v6.len()))
        .map(|i| AddressPair {
            ipv4: v4.get(i).cloned(),
            ipv6: v6.get(i).cloned(),
        })
        .collect();
    CepStatus {
        id: u64::from(ep.id),
        external_identifiers: ExternalIdentifiers {
            container_id: ep.container_id.clone(),
            pod_name: format!("{namespace}/{name}"),
            k8s_namespace: namespace,
            k8s_pod_name: name,
        },
        // What other nodes know the pod by: its `cidr:` labels, and the node-local number
        // they give, mean something on this node only.
        identity: CepIdentity {
            id: u64::from(ep.cluster_identity),
            labels: ep.labels.without_cidr().to_strings(),
        },
        networking: CepNetworking {
            addressing,
            node: node_ip.map(|ip| ip.to_string()).unwrap_or_default(),
        },
        state: "ready",
        named_ports: ports
            .iter()
            .map(|p| CepNamedPort {
                name: p.name.clone(),
                port: p.port,
                protocol: p.protocol.to_string(),
            })
            .collect(),
    }
}

/// The writes that bring `existing` (this node's CiliumEndpoints) to `desired`: create
/// what is missing, update what differs, delete what no endpoint asks for (unless held).
pub(crate) fn plan(desired: &Desired, existing: &BTreeMap<Key, Observed>) -> Plan {
    let mut plan = Plan::default();
    for (key, status) in &desired.write {
        match existing.get(key) {
            None => plan.create.push(key.clone()),
            Some(seen) if seen.status != *status => plan.update.push(key.clone()),
            Some(_) => plan.in_line += 1,
        }
    }
    for (key, seen) in existing {
        if !desired.write.contains_key(key) && !desired.hold.contains(key) {
            plan.delete.push((key.clone(), seen.uid.clone()));
        }
    }
    plan
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use cellium_endpoint_manager::{Address, PodRef};
    use cellium_labels::{Label, Labels};
    use serde_json::json;

    use super::*;

    pub(crate) fn ep(id: u16, pod: Option<(&str, &str)>, ips: &[&str]) -> Endpoint {
        Endpoint {
            id,
            container_id: format!("cid-{id}"),
            ifname: "eth0".into(),
            netns: PathBuf::from("/run/netns/x"),
            network: "cellium".into(),
            pod: pod.map(|(namespace, name)| PodRef {
                namespace: namespace.into(),
                name: name.into(),
            }),
            addresses: ips
                .iter()
                .map(|ip| {
                    let ip: IpAddr = ip.parse().unwrap();
                    Address {
                        ip,
                        pool: if ip.is_ipv4() {
                            "10.0.0.0/24".parse().unwrap()
                        } else {
                            "fd00::/64".parse().unwrap()
                        },
                        gateway: if ip.is_ipv4() {
                            "10.0.0.1".parse().unwrap()
                        } else {
                            "fd00::1".parse().unwrap()
                        },
                    }
                })
                .collect(),
            host_ifname: format!("cel{id}"),
            host_ifindex: 7,
            host_mac: [0; 6],
            pod_mac: [0; 6],
            mtu: 1500,
            labels: Labels::from_iter([
                Label::k8s("app", "web"),
                Label::k8s("io.kubernetes.pod.namespace", "shop"),
            ]),
            identity: 1234,
            cluster_identity: 1234,
            port_mappings: Vec::new(),
            state: State::Ready,
            created_unix_ms: i64::from(id),
        }
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.into(), name.into())
    }

    #[test]
    fn a_long_node_name_is_cut_with_a_digest_of_the_whole() {
        assert_eq!(owner_label("n1"), "n1");
        let max = "a".repeat(63);
        assert_eq!(owner_label(&max), max);
        let long = format!(
            "{}.compute.internal",
            "ip-10-0-0-1.eu-west-1-long-zone-name".repeat(2)
        );
        let label = owner_label(&long);
        assert_eq!(label.len(), 63, "{label}");
        assert_eq!(label[..46], long[..46]);
        assert!(label[46..].starts_with('-') && label[47..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(owner_label(&long.replace("internal", "external")), label);
        assert_eq!(owner_label(&long), label, "the same at every start");
        // FNV-1a of a known input, so a change of the digest is caught here.
        assert_eq!(
            owner_label(&format!("{}-b", "a".repeat(62))),
            format!("{}-dc037d49f43b6d38", "a".repeat(46))
        );
    }

    #[test]
    fn the_status_is_ciliums_shape() {
        let web = ep(12, Some(("shop", "web")), &["10.0.0.5", "fd00::5"]);
        let web = serde_json::to_value(status(
            &web,
            Some("192.168.1.10".parse().unwrap()),
            &[NamedPort {
                name: "http".into(),
                port: 8080,
                protocol: cellium_resources::Protocol::Tcp,
            }],
        ));
        assert_eq!(
            web.unwrap(),
            json!({
                "id": 12,
                "external-identifiers": {
                    "container-id": "cid-12",
                    "k8s-namespace": "shop",
                    "k8s-pod-name": "web",
                    "pod-name": "shop/web"
                },
                "identity": {
                    "id": 1234,
                    "labels": ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"]
                },
                "networking": {
                    "addressing": [{"ipv4": "10.0.0.5", "ipv6": "fd00::5"}],
                    "node": "192.168.1.10"
                },
                "state": "ready",
                "named-ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
            })
        );
        let v4 = ep(3, Some(("shop", "db")), &["10.0.0.7"]);
        let v4 = serde_json::to_value(status(&v4, None, &[])).unwrap();
        assert_eq!(
            v4["networking"],
            json!({"addressing": [{"ipv4": "10.0.0.7"}], "node": ""}),
            "no IPv6 key without an IPv6 address, and no node IP while it is unknown"
        );
    }

    #[test]
    fn a_pod_inside_an_ipblock_is_published_with_its_cluster_identity() {
        let mut web = ep(12, Some(("shop", "web")), &["10.0.0.5"]);
        web.labels
            .insert(Label::cidr("10.0.0.0/8".parse().unwrap()));
        web.identity = cellium_identity::LOCAL_IDENTITY_FLAG + 1;
        let published = status(&web, None, &[]).identity;
        assert_eq!(published.id, 1234);
        assert_eq!(
            published.labels,
            ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"]
        );
    }

    #[test]
    fn one_object_per_pod_from_its_newest_ready_endpoint() {
        let mut old = ep(4, Some(("shop", "web")), &["10.0.0.4"]);
        old.created_unix_ms = 100;
        let mut new = ep(9, Some(("shop", "web")), &["10.0.0.9"]);
        new.created_unix_ms = 200;
        let mut creating = ep(10, Some(("shop", "db")), &["10.0.0.10"]);
        creating.state = State::Creating;
        let mut deleting = ep(11, Some(("shop", "cache")), &["10.0.0.11"]);
        deleting.state = State::Deleting;
        let podless = ep(12, None, &["10.0.0.12"]);
        let d = desired(&[new, old, creating, deleting, podless], None, &|_| {
            Vec::new()
        });
        assert_eq!(
            d.write.keys().cloned().collect::<Vec<_>>(),
            [key("shop", "web")]
        );
        assert_eq!(d.write[&key("shop", "web")]["id"], 9);
        assert_eq!(
            d.hold,
            BTreeSet::from([key("shop", "db"), key("shop", "cache")])
        );
    }

    #[test]
    fn a_ready_endpoint_beats_one_being_replaced() {
        let ready = ep(4, Some(("shop", "web")), &["10.0.0.4"]);
        let mut creating = ep(5, Some(("shop", "web")), &["10.0.0.5"]);
        creating.state = State::Creating;
        let d = desired(&[creating, ready], None, &|_| Vec::new());
        assert!(d.hold.is_empty());
        assert_eq!(d.write[&key("shop", "web")]["id"], 4);
    }

    #[test]
    fn the_plan_creates_updates_deletes_and_leaves_alone() {
        let eps = [
            ep(1, Some(("shop", "new")), &["10.0.0.1"]),
            ep(2, Some(("shop", "same")), &["10.0.0.2"]),
            ep(3, Some(("shop", "moved")), &["10.0.0.3"]),
        ];
        let mut d = desired(&eps, None, &|_| Vec::new());
        d.hold.insert(key("shop", "being-set-up"));
        let observed = |k: &Key, uid: &str| Observed {
            uid: Some(uid.into()),
            status: d.write.get(k).cloned().unwrap_or(json!({"id": 99})),
        };
        let mut existing = BTreeMap::new();
        existing.insert(
            key("shop", "same"),
            observed(&key("shop", "same"), "u-same"),
        );
        let mut stale = observed(&key("shop", "moved"), "u-moved");
        stale.status["networking"]["addressing"] = json!([{"ipv4": "10.0.0.99"}]);
        existing.insert(key("shop", "moved"), stale);
        existing.insert(
            key("shop", "gone"),
            observed(&key("shop", "gone"), "u-gone"),
        );
        existing.insert(
            key("shop", "being-set-up"),
            observed(&key("shop", "being-set-up"), "u-held"),
        );
        assert_eq!(
            plan(&d, &existing),
            Plan {
                create: vec![key("shop", "new")],
                update: vec![key("shop", "moved")],
                delete: vec![(key("shop", "gone"), Some("u-gone".into()))],
                in_line: 1,
            }
        );
    }

    #[test]
    fn nothing_to_do_when_in_line_and_everything_goes_without_endpoints() {
        let eps = [ep(1, Some(("shop", "web")), &["10.0.0.1"])];
        let d = desired(&eps, Some("10.1.0.1".parse().unwrap()), &|_| Vec::new());
        let existing: BTreeMap<Key, Observed> = d
            .write
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    Observed {
                        uid: None,
                        status: s.clone(),
                    },
                )
            })
            .collect();
        let p = plan(&d, &existing);
        assert_eq!((p.writes(), p.in_line), (0, 1));
        let p = plan(&desired(&[], None, &|_| Vec::new()), &existing);
        assert_eq!(p.delete, [(key("shop", "web"), None)]);
    }
}

//! ip -> identity through etcd: this node's pods written as `cilium/state/ip/v1/default/<IP>`
//! on its lease, and the other nodes' read back as remote endpoints for node-discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use cellium_endpoint_manager::{Endpoint, State};
use cellium_identity::Reserved;
use cellium_node_discovery::RemoteEndpoints;
use cellium_node_discovery::desired::{Refusal, Refused};
use cellium_resources::{CiliumEndpoint, CiliumNode, Pod};
use tokio::sync::watch;

use crate::keys::{self, IpEntry, NamedPort};
use crate::store::{Kept, Kvstore};

/// The entries of this node's ready endpoints with a pod and an identity: one per address,
/// hosted at `host_ip`, with the pod's named ports (`pods` finds a pod by namespace and name).
pub fn desired(
    endpoints: &[Endpoint],
    node: &str,
    host_ip: Option<IpAddr>,
    pod: impl Fn(&str, &str) -> Option<Arc<Pod>>,
) -> BTreeMap<String, IpEntry> {
    let mut out = BTreeMap::new();
    for ep in endpoints {
        let Some(pod_ref) = &ep.pod else { continue };
        if ep.state != State::Ready || ep.cluster_identity == 0 {
            continue;
        }
        let named_ports: Vec<NamedPort> = pod(&pod_ref.namespace, &pod_ref.name)
            .map(|p| {
                p.ports
                    .iter()
                    .map(|np| NamedPort {
                        name: np.name.clone(),
                        port: np.port,
                        protocol: np.protocol.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        for a in &ep.addresses {
            out.insert(
                keys::ip_key(a.ip),
                IpEntry {
                    ip: a.ip,
                    mask: None,
                    host_ip,
                    // Its node-local identity, when an ipBlock covers it, means nothing
                    // elsewhere.
                    id: ep.cluster_identity,
                    key: 0,
                    metadata: format!("cilium-global:default:{node}:{}", ep.id),
                    namespace: pod_ref.namespace.clone(),
                    pod_name: pod_ref.name.clone(),
                    named_ports: named_ports.clone(),
                },
            );
        }
    }
    out
}

impl Kvstore {
    /// Keeps exactly `entries` as this node's ip entries.
    pub fn keep_ips(&self, entries: &BTreeMap<String, IpEntry>) {
        let kept = entries
            .iter()
            .filter_map(|(k, e)| {
                Some((
                    k.clone(),
                    Kept {
                        value: serde_json::to_string(e).ok()?,
                        master: None,
                    },
                ))
            })
            .collect();
        self.keep_all(keys::IP_PREFIX, kept);
    }

    /// The other nodes' ip entries now, as remote endpoints (see
    /// [`remote_claims`](Self::remote_claims)).
    pub fn remote_endpoints(&self, my_ips: &BTreeSet<IpAddr>) -> Vec<CiliumEndpoint> {
        self.remote_claims(my_ips).0
    }

    /// The other nodes' ip entries now, as remote endpoints, and those refused: this node's
    /// own keys, and entries hosted at one of `my_ips`, left out; an entry under another key
    /// than its own address's (`ip/v1/default/zzz` naming a pod's address) refused, as it
    /// would otherwise take the address whatever its real entry says; a node's entry for its
    /// own address with the host identity (Cilium's nodes write one) left out, the node's
    /// address being `remote-node` from its node entry; entries that do not decode skipped.
    /// Node-discovery judges the rest ([`desired::ipcache`]).
    ///
    /// [`desired::ipcache`]: cellium_node_discovery::desired::ipcache
    pub fn remote_claims(&self, my_ips: &BTreeSet<IpAddr>) -> (Vec<CiliumEndpoint>, Vec<Refused>) {
        let ips = self.ips.lock();
        let mut refused = Vec::new();
        let endpoints = ips
            .iter()
            .filter(|(k, _)| !self.keeps(k))
            .filter_map(|(k, v)| match serde_json::from_str::<IpEntry>(v) {
                Ok(e) => Some((k, e)),
                Err(e) => {
                    tracing::debug!(key = k, error = %e, "an ip entry does not decode; skipped");
                    None
                }
            })
            .filter(|(_, e)| e.id != 0 && !e.host_ip.is_some_and(|h| my_ips.contains(&h)))
            .filter(|(_, e)| !(e.id == Reserved::Host.id() && e.host_ip == Some(e.ip)))
            .filter_map(|(k, e)| {
                let ep = endpoint(e);
                if *k != keys::ip_key(ep.addresses[0]) {
                    let mut r = Refused::new(Refusal::KeyMismatch, &ep, None);
                    r.claim = format!("{k}: {}", r.claim);
                    refused.push(r);
                    return None;
                }
                Some(ep)
            })
            .collect();
        (endpoints, refused)
    }
}

/// An ip entry as the CiliumEndpoint it stands for.
fn endpoint(e: IpEntry) -> CiliumEndpoint {
    CiliumEndpoint {
        namespace: e.namespace,
        name: e.pod_name,
        id: e
            .metadata
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        identity: e.id,
        addresses: vec![e.ip],
        node_ip: e.host_ip,
        named_ports: e.named_ports.iter().filter_map(named_port).collect(),
    }
}

/// An entry's named port as the tables hold one; a port with a protocol that is not TCP, UDP
/// or SCTP, or a zero port, is skipped (the rest of the entry stands).
fn named_port(p: &NamedPort) -> Option<cellium_resources::NamedPort> {
    Some(cellium_resources::NamedPort {
        name: p.name.clone(),
        port: Some(p.port).filter(|n| *n > 0)?,
        protocol: p.protocol.parse().ok()?,
    })
}

/// The kvstore's ip and node entries as node-discovery takes them.
#[derive(Debug)]
pub struct KvRemote {
    kv: Arc<Kvstore>,
}

impl KvRemote {
    /// As node-discovery takes it.
    pub fn provide(kv: Arc<Kvstore>) -> Arc<dyn RemoteEndpoints> {
        Arc::new(KvRemote { kv })
    }
}

impl RemoteEndpoints for KvRemote {
    fn endpoints(&self) -> (Vec<CiliumEndpoint>, Vec<Refused>) {
        self.kv.remote_claims(&BTreeSet::new())
    }

    fn nodes(&self) -> Vec<CiliumNode> {
        self.kv.remote_nodes()
    }

    fn changes(&self) -> Vec<watch::Receiver<u64>> {
        vec![self.kv.ips.changes(), self.kv.nodes.changes()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KvstoreConfig;

    fn entry(ip: &str, host: &str, id: u32) -> String {
        format!(
            r#"{{"IP":"{ip}","HostIP":"{host}","ID":{id},"Metadata":"cilium-global:default:n2:7","K8sNamespace":"shop","K8sPodName":"web"}}"#
        )
    }

    #[test]
    fn an_entry_under_another_addresss_key_is_refused_and_a_nodes_host_entry_left_out() {
        let kv = Kvstore::new(KvstoreConfig::default(), Some("n1".into())).unwrap();
        kv.ips.replace(BTreeMap::from([
            (
                keys::ip_key("10.2.0.5".parse().unwrap()),
                entry("10.2.0.5", "192.0.2.2", 300),
            ),
            (
                format!("{}zzz", keys::IP_PREFIX),
                entry("10.2.0.6", "192.0.2.3", 301),
            ),
            (
                keys::ip_key("10.2.0.7".parse().unwrap()),
                entry("10.2.0.8", "192.0.2.2", 301),
            ),
            (
                keys::ip_key("192.0.2.2".parse().unwrap()),
                entry("192.0.2.2", "192.0.2.2", 1),
            ),
            // The host identity for another address: passed on, for node-discovery to refuse.
            (
                keys::ip_key("10.2.0.9".parse().unwrap()),
                entry("10.2.0.9", "192.0.2.2", 1),
            ),
        ]));
        let (eps, refused) = kv.remote_claims(&BTreeSet::new());
        let eps: Vec<String> = eps
            .iter()
            .map(|e| format!("{}={}@{:?}#{}", e.addresses[0], e.identity, e.node_ip, e.id))
            .collect();
        assert_eq!(
            eps,
            [
                "10.2.0.5=300@Some(192.0.2.2)#7",
                "10.2.0.9=1@Some(192.0.2.2)#7"
            ]
        );
        let refused: Vec<String> = refused
            .iter()
            .map(|r| format!("{}: {}", r.reason.as_str(), r.claim))
            .collect();
        assert_eq!(
            refused,
            [
                "key-mismatch: cilium/state/ip/v1/default/10.2.0.7: shop/web 10.2.0.8 as 301 from 192.0.2.2",
                "key-mismatch: cilium/state/ip/v1/default/zzz: shop/web 10.2.0.6 as 301 from 192.0.2.3",
            ]
        );
    }
}

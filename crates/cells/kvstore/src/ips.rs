//! ip -> identity through etcd: this node's pods written as `cilium/state/ip/v1/default/<IP>`
//! on its lease, and the other nodes' read back as remote endpoints for node-discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use cellium_endpoint_manager::{Endpoint, State};
use cellium_identity::Reserved;
use cellium_node_discovery::RemoteEndpoints;
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
        if ep.state != State::Ready || ep.identity == 0 {
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
                    id: ep.identity,
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

    /// The other nodes' ip entries now, as remote endpoints: this node's own keys, and
    /// entries hosted at one of `my_ips`, left out; an entry with the host identity (its
    /// node's own) becomes `remote-node`; entries that do not decode are skipped.
    pub fn remote_endpoints(&self, my_ips: &BTreeSet<IpAddr>) -> Vec<CiliumEndpoint> {
        let ips = self.ips.lock();
        ips.iter()
            .filter(|(k, _)| !self.keeps(k))
            .filter_map(|(k, v)| match serde_json::from_str::<IpEntry>(v) {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::debug!(key = k, error = %e, "an ip entry does not decode; skipped");
                    None
                }
            })
            .filter(|e| e.id != 0 && !e.host_ip.is_some_and(|h| my_ips.contains(&h)))
            .map(|e| CiliumEndpoint {
                namespace: e.namespace,
                name: e.pod_name,
                id: e
                    .metadata
                    .rsplit(':')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
                identity: if e.id == Reserved::Host.id() {
                    Reserved::RemoteNode.id()
                } else {
                    e.id
                },
                addresses: vec![e.ip],
                node_ip: e.host_ip,
                named_ports: e.named_ports.iter().filter_map(named_port).collect(),
            })
            .collect()
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
    fn endpoints(&self) -> Vec<CiliumEndpoint> {
        self.kv.remote_endpoints(&BTreeSet::new())
    }

    fn nodes(&self) -> Vec<CiliumNode> {
        self.kv.remote_nodes()
    }

    fn changes(&self) -> Vec<watch::Receiver<u64>> {
        vec![self.kv.ips.changes(), self.kv.nodes.changes()]
    }
}

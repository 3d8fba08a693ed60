//! The tables' writers, held by the apply path: the one source of changes to the tables.

use std::collections::BTreeMap;

use crate::resources::{Action, Outcome};
use crate::table::{Change, Table, Writer};
use cellium_k8s_objects::kinds::Parsed;
use cellium_k8s_objects::{
    CiliumCidrGroup, CiliumClusterwideNetworkPolicy, CiliumEndpoint, CiliumIdentity,
    CiliumNetworkPolicy, CiliumNode, EndpointSlice, Namespace, NetworkPolicy, Node, Pod,
    SYSTEM_NAMESPACES, Service,
};
use cellium_k8s_objects::{Object, ObjectKey};

/// One writer per table.
#[derive(Debug)]
pub(crate) struct Writers {
    namespaces: Writer<Namespace>,
    pods: Writer<Pod>,
    network_policies: Writer<NetworkPolicy>,
    cilium_network_policies: Writer<CiliumNetworkPolicy>,
    cilium_clusterwide_network_policies: Writer<CiliumClusterwideNetworkPolicy>,
    cilium_cidr_groups: Writer<CiliumCidrGroup>,
    services: Writer<Service>,
    endpoint_slices: Writer<EndpointSlice>,
    nodes: Writer<Node>,
    cilium_nodes: Writer<CiliumNode>,
    cilium_identities: Writer<CiliumIdentity>,
    cilium_endpoints: Writer<CiliumEndpoint>,
}

/// A reader of every table, as `Resources` hands them out.
pub(crate) struct Readers {
    pub(crate) namespaces: Table<Namespace>,
    pub(crate) pods: Table<Pod>,
    pub(crate) network_policies: Table<NetworkPolicy>,
    pub(crate) cilium_network_policies: Table<CiliumNetworkPolicy>,
    pub(crate) cilium_clusterwide_network_policies: Table<CiliumClusterwideNetworkPolicy>,
    pub(crate) cilium_cidr_groups: Table<CiliumCidrGroup>,
    pub(crate) services: Table<Service>,
    pub(crate) endpoint_slices: Table<EndpointSlice>,
    pub(crate) nodes: Table<Node>,
    pub(crate) cilium_nodes: Table<CiliumNode>,
    pub(crate) cilium_identities: Table<CiliumIdentity>,
    pub(crate) cilium_endpoints: Table<CiliumEndpoint>,
}

/// Every kind the tables hold.
pub(crate) const KINDS: [&str; 12] = [
    Namespace::KIND,
    Pod::KIND,
    NetworkPolicy::KIND,
    CiliumNetworkPolicy::KIND,
    CiliumClusterwideNetworkPolicy::KIND,
    CiliumCidrGroup::KIND,
    Service::KIND,
    EndpointSlice::KIND,
    Node::KIND,
    CiliumNode::KIND,
    CiliumIdentity::KIND,
    CiliumEndpoint::KIND,
];

/// The kinds that live in a namespace and go with it, by kind name.
pub(crate) const NAMESPACED: [&str; 5] = [
    Pod::KIND,
    NetworkPolicy::KIND,
    CiliumNetworkPolicy::KIND,
    Service::KIND,
    EndpointSlice::KIND,
];

impl Writers {
    /// Empty tables but for the system namespaces, which always exist.
    pub(crate) fn new() -> Writers {
        let mut writers = Writers {
            namespaces: Writer::default(),
            pods: Writer::default(),
            network_policies: Writer::default(),
            cilium_network_policies: Writer::default(),
            cilium_clusterwide_network_policies: Writer::default(),
            cilium_cidr_groups: Writer::default(),
            services: Writer::default(),
            endpoint_slices: Writer::default(),
            nodes: Writer::default(),
            cilium_nodes: Writer::default(),
            cilium_identities: Writer::default(),
            cilium_endpoints: Writer::default(),
        };
        for name in SYSTEM_NAMESPACES {
            if let Ok(ns) = Namespace::new(name, BTreeMap::new()) {
                writers.namespaces.upsert(ns);
            }
        }
        writers.publish();
        writers
    }

    /// Announces every change made since the last call, table by table: the changes of one
    /// apply or delete go out together, once they are all in the tables.
    pub(crate) fn publish(&mut self) {
        self.namespaces.publish();
        self.pods.publish();
        self.network_policies.publish();
        self.cilium_network_policies.publish();
        self.cilium_clusterwide_network_policies.publish();
        self.cilium_cidr_groups.publish();
        self.services.publish();
        self.endpoint_slices.publish();
        self.nodes.publish();
        self.cilium_nodes.publish();
        self.cilium_identities.publish();
        self.cilium_endpoints.publish();
    }

    /// Says that every table holds its source's complete state (the record restored).
    pub(crate) fn mark_all_synced(&mut self) {
        for kind in KINDS {
            self.mark_synced(kind);
        }
    }

    /// Says that the table of `kind` holds its source's complete state.
    pub(crate) fn mark_synced(&mut self, kind: &str) {
        match kind {
            Namespace::KIND => self.namespaces.mark_synced(),
            Pod::KIND => self.pods.mark_synced(),
            NetworkPolicy::KIND => self.network_policies.mark_synced(),
            CiliumNetworkPolicy::KIND => self.cilium_network_policies.mark_synced(),
            CiliumCidrGroup::KIND => self.cilium_cidr_groups.mark_synced(),
            CiliumClusterwideNetworkPolicy::KIND => {
                self.cilium_clusterwide_network_policies.mark_synced()
            }
            Service::KIND => self.services.mark_synced(),
            EndpointSlice::KIND => self.endpoint_slices.mark_synced(),
            Node::KIND => self.nodes.mark_synced(),
            CiliumNode::KIND => self.cilium_nodes.mark_synced(),
            CiliumIdentity::KIND => self.cilium_identities.mark_synced(),
            CiliumEndpoint::KIND => self.cilium_endpoints.mark_synced(),
            _ => {}
        }
    }

    /// Whether the table of `kind` holds its source's complete state.
    pub(crate) fn is_synced(&self, kind: &str) -> bool {
        self.synced(kind).is_some_and(|rx| *rx.borrow())
    }

    /// The signal of the table of `kind` becoming synced ([`Table::synced`]); `None` for a
    /// kind the tables do not hold.
    pub(crate) fn synced(&self, kind: &str) -> Option<tokio::sync::watch::Receiver<bool>> {
        let r = self.readers();
        Some(match kind {
            Namespace::KIND => r.namespaces.synced(),
            Pod::KIND => r.pods.synced(),
            NetworkPolicy::KIND => r.network_policies.synced(),
            CiliumNetworkPolicy::KIND => r.cilium_network_policies.synced(),
            CiliumClusterwideNetworkPolicy::KIND => r.cilium_clusterwide_network_policies.synced(),
            CiliumCidrGroup::KIND => r.cilium_cidr_groups.synced(),
            Service::KIND => r.services.synced(),
            EndpointSlice::KIND => r.endpoint_slices.synced(),
            Node::KIND => r.nodes.synced(),
            CiliumNode::KIND => r.cilium_nodes.synced(),
            CiliumIdentity::KIND => r.cilium_identities.synced(),
            CiliumEndpoint::KIND => r.cilium_endpoints.synced(),
            _ => return None,
        })
    }

    /// The keys of every object of `kind`.
    pub(crate) fn keys(&self, kind: &str) -> Vec<ObjectKey> {
        match kind {
            Namespace::KIND => self.namespaces.keys(),
            Pod::KIND => self.pods.keys(),
            NetworkPolicy::KIND => self.network_policies.keys(),
            CiliumNetworkPolicy::KIND => self.cilium_network_policies.keys(),
            CiliumClusterwideNetworkPolicy::KIND => self.cilium_clusterwide_network_policies.keys(),
            CiliumCidrGroup::KIND => self.cilium_cidr_groups.keys(),
            Service::KIND => self.services.keys(),
            EndpointSlice::KIND => self.endpoint_slices.keys(),
            Node::KIND => self.nodes.keys(),
            CiliumNode::KIND => self.cilium_nodes.keys(),
            CiliumIdentity::KIND => self.cilium_identities.keys(),
            CiliumEndpoint::KIND => self.cilium_endpoints.keys(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn readers(&self) -> Readers {
        Readers {
            namespaces: self.namespaces.as_reader(),
            pods: self.pods.as_reader(),
            network_policies: self.network_policies.as_reader(),
            cilium_network_policies: self.cilium_network_policies.as_reader(),
            cilium_clusterwide_network_policies: self
                .cilium_clusterwide_network_policies
                .as_reader(),
            cilium_cidr_groups: self.cilium_cidr_groups.as_reader(),
            services: self.services.as_reader(),
            endpoint_slices: self.endpoint_slices.as_reader(),
            nodes: self.nodes.as_reader(),
            cilium_nodes: self.cilium_nodes.as_reader(),
            cilium_identities: self.cilium_identities.as_reader(),
            cilium_endpoints: self.cilium_endpoints.as_reader(),
        }
    }

    /// Creates or updates a parsed object in its table.
    pub(crate) fn upsert(&mut self, parsed: Parsed) -> Outcome {
        let (kind, key, change) = match parsed {
            Parsed::Namespace(ns) => (Namespace::KIND, ns.key(), self.namespaces.upsert(ns)),
            Parsed::Pod(pod) => (Pod::KIND, pod.key(), self.pods.upsert(pod)),
            Parsed::NetworkPolicy(p) => (
                NetworkPolicy::KIND,
                p.key(),
                self.network_policies.upsert(p),
            ),
            Parsed::CiliumNetworkPolicy(p) => (
                CiliumNetworkPolicy::KIND,
                p.key(),
                self.cilium_network_policies.upsert(p),
            ),
            Parsed::CiliumClusterwideNetworkPolicy(p) => (
                CiliumClusterwideNetworkPolicy::KIND,
                p.key(),
                self.cilium_clusterwide_network_policies.upsert(p),
            ),
            Parsed::CiliumCidrGroup(g) => (
                CiliumCidrGroup::KIND,
                g.key(),
                self.cilium_cidr_groups.upsert(g),
            ),
            Parsed::Service(d) => (
                Service::KIND,
                d.service.key(),
                self.services.upsert(d.service),
            ),
            Parsed::EndpointSlice(s) => {
                (EndpointSlice::KIND, s.key(), self.endpoint_slices.upsert(s))
            }
            Parsed::Node(n) => (Node::KIND, n.key(), self.nodes.upsert(n)),
            Parsed::CiliumNode(n) => (CiliumNode::KIND, n.key(), self.cilium_nodes.upsert(n)),
            Parsed::CiliumIdentity(i) => (
                CiliumIdentity::KIND,
                i.key(),
                self.cilium_identities.upsert(i),
            ),
            Parsed::CiliumEndpoint(e) => (
                CiliumEndpoint::KIND,
                e.key(),
                self.cilium_endpoints.upsert(e),
            ),
        };
        let action = match change {
            Change::Created => Action::Created,
            Change::Configured => Action::Configured,
            Change::Unchanged => Action::Unchanged,
        };
        Outcome { kind, key, action }
    }

    /// Deletes the object `kind`/`key` from its table; whether it was there.
    pub(crate) fn delete(&mut self, kind: &str, key: &ObjectKey) -> bool {
        match kind {
            Namespace::KIND => self.namespaces.delete(key).is_some(),
            Pod::KIND => self.pods.delete(key).is_some(),
            NetworkPolicy::KIND => self.network_policies.delete(key).is_some(),
            CiliumNetworkPolicy::KIND => self.cilium_network_policies.delete(key).is_some(),
            CiliumClusterwideNetworkPolicy::KIND => self
                .cilium_clusterwide_network_policies
                .delete(key)
                .is_some(),
            CiliumCidrGroup::KIND => self.cilium_cidr_groups.delete(key).is_some(),
            Service::KIND => self.services.delete(key).is_some(),
            EndpointSlice::KIND => self.endpoint_slices.delete(key).is_some(),
            Node::KIND => self.nodes.delete(key).is_some(),
            CiliumNode::KIND => self.cilium_nodes.delete(key).is_some(),
            CiliumIdentity::KIND => self.cilium_identities.delete(key).is_some(),
            CiliumEndpoint::KIND => self.cilium_endpoints.delete(key).is_some(),
            _ => false,
        }
    }

    /// How many objects the tables hold.
    pub(crate) fn count(&self) -> usize {
        let r = self.readers();
        r.namespaces.len()
            + r.pods.len()
            + r.network_policies.len()
            + r.cilium_network_policies.len()
            + r.cilium_clusterwide_network_policies.len()
            + r.cilium_cidr_groups.len()
            + r.services.len()
            + r.endpoint_slices.len()
            + r.nodes.len()
            + r.cilium_nodes.len()
            + r.cilium_identities.len()
            + r.cilium_endpoints.len()
    }

    /// The keys of the objects of `kind` in `namespace`.
    pub(crate) fn keys_in_namespace(&self, kind: &str, namespace: &str) -> Vec<ObjectKey> {
        let readers = self.readers();
        match kind {
            Pod::KIND => keys(readers.pods.list_namespace(namespace)),
            NetworkPolicy::KIND => keys(readers.network_policies.list_namespace(namespace)),
            CiliumNetworkPolicy::KIND => {
                keys(readers.cilium_network_policies.list_namespace(namespace))
            }
            Service::KIND => keys(readers.services.list_namespace(namespace)),
            EndpointSlice::KIND => keys(readers.endpoint_slices.list_namespace(namespace)),
            _ => Vec::new(),
        }
    }
}

fn keys<T: Object>(objects: Vec<std::sync::Arc<T>>) -> Vec<ObjectKey> {
    objects.iter().map(|o| o.key()).collect()
}

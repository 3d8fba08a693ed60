//! What a Cilium rule names besides labels and prefixes: CIDR groups (`cidrGroupRef`,
//! `cidrGroupSelector`) and services (`toServices`), read from the tables when the rule is
//! translated. The repository translates the policies that name them again whenever those
//! tables change, so the rules follow the groups and services as they come, change and go.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use cellium_resources::{
    CidrGroupMatch, CiliumCidrGroup, CiliumPolicy, EndpointSlice, LabelSelector, ObjectKey,
    Resources, SelectorOperator, Service, ServiceRef, Table,
};
use ipnet::IpNet;

/// The tables a Cilium rule may depend on.
#[derive(Debug, Clone)]
pub struct Deps {
    cidr_groups: Table<CiliumCidrGroup>,
    services: Table<Service>,
    slices: Table<EndpointSlice>,
}

/// The backends of a selected service: its pods, by its selector; or, for a service without
/// one, the addresses of its EndpointSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backends {
    /// The pods of `namespace` whose labels `selector` holds.
    Pods {
        /// The service's namespace.
        namespace: String,
        /// The service's selector.
        selector: BTreeMap<String, String>,
    },
    /// Addresses, each a host prefix.
    Addresses(Vec<IpNet>),
}

impl Deps {
    /// The tables of `resources`.
    pub fn of(resources: &Resources) -> Deps {
        Deps {
            cidr_groups: resources.cilium_cidr_groups.clone(),
            services: resources.services.clone(),
            slices: resources.endpoint_slices.clone(),
        }
    }

    /// The prefixes of the groups `groups` names; none when no such group exists (yet).
    pub fn group_prefixes(&self, groups: &CidrGroupMatch) -> Vec<IpNet> {
        let found: Vec<Arc<CiliumCidrGroup>> = match groups {
            CidrGroupMatch::Name(name) => self
                .cidr_groups
                .get(&ObjectKey::cluster(name))
                .into_iter()
                .collect(),
            CidrGroupMatch::Selector(sel) => self
                .cidr_groups
                .list()
                .into_iter()
                .filter(|g| selects(sel, &g.labels))
                .collect(),
        };
        let mut out: Vec<IpNet> = found.iter().flat_map(|g| g.cidrs.clone()).collect();
        out.sort();
        out.dedup();
        out
    }

    /// The backends of the services `svc` names, for a rule of a policy in `policy_ns` (empty
    /// for the cluster-wide kind): a service name without a namespace is in the policy's
    /// (none for the cluster-wide kind), a service selector without one selects in the
    /// policy's, or in every namespace for the cluster-wide kind.
    pub fn service_backends(&self, policy_ns: &str, svc: &ServiceRef) -> Vec<Backends> {
        let services: Vec<Arc<Service>> = match svc {
            ServiceRef::Name { namespace, name } => {
                let ns = namespace.as_deref().unwrap_or(policy_ns);
                if ns.is_empty() {
                    return Vec::new();
                }
                self.services
                    .get(&ObjectKey::namespaced(ns, name))
                    .into_iter()
                    .collect()
            }
            ServiceRef::Selector {
                namespace,
                selector,
            } => {
                let ns = namespace.as_deref().unwrap_or(policy_ns);
                let candidates = if ns.is_empty() {
                    self.services.list()
                } else {
                    self.services.list_namespace(ns)
                };
                candidates
                    .into_iter()
                    .filter(|s| selects(selector, &s.labels))
                    .collect()
            }
        };
        services.iter().map(|s| self.backends(s)).collect()
    }

    fn backends(&self, svc: &Service) -> Backends {
        if !svc.selector.is_empty() {
            return Backends::Pods {
                namespace: svc.namespace.clone(),
                selector: svc.selector.clone(),
            };
        }
        let mut out: Vec<IpNet> = self
            .slices
            .list_namespace(&svc.namespace)
            .iter()
            .filter(|s| s.service.as_deref() == Some(svc.name.as_str()))
            .flat_map(|s| s.endpoints.iter().map(|e| host(e.address())))
            .collect();
        out.sort();
        out.dedup();
        Backends::Addresses(out)
    }
}

/// Whether a policy's rules name CIDR groups or services, so that its translation depends on
/// [`Deps`].
pub fn depends(policy: &CiliumPolicy) -> bool {
    policy.rules.iter().any(|r| {
        [&r.ingress, &r.ingress_deny, &r.egress, &r.egress_deny]
            .into_iter()
            .flatten()
            .any(|p| p.cidr_groups.is_some() || p.services.is_some())
    })
}

fn host(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

/// Whether a Kubernetes label selector selects an object with `labels`.
pub fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    sel.match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().all(|r| {
            let value = labels.get(&r.key);
            match r.operator {
                SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                SelectorOperator::Exists => value.is_some(),
                SelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

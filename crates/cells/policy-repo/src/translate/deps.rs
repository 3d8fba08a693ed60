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

    /// The backends of the services `svc` names. As in Cilium, an item without a namespace
    /// names services of every namespace, whatever the policy's (Cilium copies `toServices`
    /// as written and matches an empty namespace against any).
    pub fn service_backends(&self, svc: &ServiceRef) -> Vec<Backends> {
        let (ServiceRef::Name { namespace, .. } | ServiceRef::Selector { namespace, .. }) = svc;
        let candidates = match namespace {
            Some(ns) => self.services.list_namespace(ns),
            None => self.services.list(),
        };
        candidates
            .iter()
            .filter(|s| names(svc, s))
            .map(|s| self.backends(s))
            .collect()
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
            // The endpoints Cilium takes as backends: ready, or serving while terminating.
            .flat_map(|s| s.endpoints.iter().filter(|e| e.ready || e.serving))
            .map(|e| host(e.address()))
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

/// Whether a `toServices` item names the service `s` (its namespace aside).
fn names(svc: &ServiceRef, s: &Service) -> bool {
    match svc {
        ServiceRef::Name { name, .. } => s.name == *name,
        ServiceRef::Selector { selector, .. } => selects(selector, &s.labels),
    }
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

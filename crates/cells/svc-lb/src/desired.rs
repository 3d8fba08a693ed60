//! What the load-balancing maps should hold: one frontend per port and cluster IP (one per
//! family of a dual-stack service) of every ClusterIP service, with the backends the
//! endpointslice controller and kube-proxy would give it.
//!
//! - A service some EndpointSlice names (label `kubernetes.io/service-name`, same namespace)
//!   takes its backends from its slices, whoever manages them (label
//!   `endpointslice.kubernetes.io/managed-by`: the controller's, another's, or none), as
//!   kube-proxy merges them; a slice owned by another Service of the same name (an owner
//!   reference of kind Service with another uid: the service was deleted and created again,
//!   and the garbage collector is about to delete the slice) is not the service's, and counts
//!   as absent. Each frontend takes its backends from the slices of its family
//!   (`addressType`): for each slice port of the service port's name and protocol, every ready
//!   endpoint's first address at that port (as kube-proxy reads slices); when none is ready,
//!   the endpoints still serving while terminating (kube-proxy's fallback). Every other
//!   endpoint the slices list (not ready, or terminating while others serve) is *draining*:
//!   no new connection goes to it, but its backend stays so that the connections it has keep
//!   flowing until they end, as with kube-proxy and Cilium (a rolling update does not cut long
//!   connections).
//! - Otherwise, a service with a selector takes this node's ready endpoints whose pod (in the
//!   service's namespace) matches it, their addresses of the frontend's family, at the target
//!   port: a number as is, a name resolved through the pod's container port of that name and
//!   protocol (a pod without one is no backend of that port), as the endpointslice controller
//!   would write them.
//! - A service with neither has no backends: its frontend refuses new connections (or drops
//!   them, with `service-no-backend-response: drop`).
//!
//! - `internalTrafficPolicy: Local`: only this node's endpoints serve, as with kube-proxy: from
//!   slices, those whose `nodeName` is this node's name (one without `nodeName`, or with no
//!   node name known, is elsewhere); from the selector, all of them (they are this node's
//!   already). None here: no backends, so new connections are refused, never sent to
//!   another node.
//!
//! - Topology, as kube-proxy: when every ready endpoint of the slices has zone hints
//!   (`hints.forZones`), those hinted for this node's zone (its `topology.kubernetes.io/zone`
//!   label) take the new connections; otherwise, with `trafficDistribution: PreferClose`,
//!   those whose `zone` is the node's. None there, or the node's zone unknown: all of them.
//!   The others are draining. Not with a `Local` traffic policy, which is narrower already.
//!
//! NodePort, external IP and load balancer ingress frontends ([`crate::external`]) take the
//! backends of the cluster IP frontend of their family, only this node's with
//! `externalTrafficPolicy: Local`.
//!
//! `loadBalancerSourceRanges` restrict the load balancer ingress frontends only, as with
//! kube-proxy (the cluster IP, node ports and external IPs of the service admit everyone):
//! such a frontend carries the ranges of its family ([`Plan::source_ranges`]) and a new
//! connection from a client outside them is dropped (`NOT_IN_SRC_RANGE`).
//!
//! What the datapath cannot do is left out frontend by frontend, with an error that reports
//! it, and the rest of the service is served: an SCTP port (the datapath balances TCP and
//! UDP).
//!
//! Headless and ExternalName services have no frontend. Everything here is a pure function of its inputs.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use cellium_datapath_bpf::{Backend, Frontend, IpNet};
use cellium_endpoint_manager::{Endpoint, State};
use cellium_resources::{
    EndpointSlice, HostPort, IpFamily, LbAlgorithm, Object, ObjectKey, Pod, PortRef, Protocol,
    Resources, Service, ServicePort, SliceEndpoint, TrafficPolicy,
};

pub use crate::external::FrontendKind;

/// The most backends a frontend can have (slot numbers are 16-bit, slot 0 is the header).
pub const MAX_BACKENDS: usize = 65534;

impl Plan {
    /// The datapath flags of its frontend (`CEL_SVC_F_*`).
    pub fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.kind != FrontendKind::ClusterIp {
            flags |= cellium_datapath_bpf::SERVICE_EXTERNAL;
        }
        if self.local {
            flags |= cellium_datapath_bpf::SERVICE_LOCAL;
        }
        if self.source_ranges.is_some() {
            flags |= cellium_datapath_bpf::SERVICE_SOURCE_RANGE;
        }
        flags
    }
}

/// Where a frontend's backends come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendsFrom {
    /// EndpointSlices labelled with the service's name.
    EndpointSlices,
    /// This node's endpoints whose pods match the service's selector.
    Selector,
    /// Nowhere: no slice names the service and it has no selector.
    None,
    /// The Pod object's `hostPort`s, for the endpoint of that pod ([`crate::host_ports`]).
    Pod,
    /// The endpoint's own `portMappings`, which the runtime passed with its CNI ADD
    /// ([`crate::host_ports`]).
    PortMappings,
}

impl fmt::Display for BackendsFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendsFrom::EndpointSlices => "endpoint-slices",
            BackendsFrom::Selector => "selector",
            BackendsFrom::None => "none",
            BackendsFrom::Pod => "pod",
            BackendsFrom::PortMappings => "port-mappings",
        })
    }
}

/// One backend of a frontend, and what it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBackend {
    /// The address, port and protocol traffic is translated to.
    pub backend: Backend,
    /// `EndpointSlice shop/web-1`, or the endpoint (`endpoint 12 (shop/web-0)`).
    pub source: String,
}

/// One frontend as it should be programmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The service.
    pub service: ObjectKey,
    /// The service port this frontend serves.
    pub port: ServicePort,
    /// The address (cluster IP, node address, external or ingress IP), port and protocol.
    pub frontend: Frontend,
    /// What kind of frontend it is.
    pub kind: FrontendKind,
    /// `externalTrafficPolicy: Local` on a frontend reached from outside: only this node's
    /// backends, and the client's address kept.
    pub local: bool,
    /// Where the backends come from.
    pub from: BackendsFrom,
    /// The backends new connections go to, ordered by address and port, without duplicates.
    pub backends: Vec<PlannedBackend>,
    /// Backends that take no new connection but keep those they have (see the module), ordered
    /// likewise, none of them among `backends`.
    pub draining: Vec<PlannedBackend>,
    /// How new connections choose among `backends`: the service's annotation
    /// `service.cilium.io/lb-algorithm`, else `bpf-lb-algorithm`.
    pub algorithm: LbAlgorithm,
    /// `sessionAffinity: ClientIP`: its timeout in seconds; `None` without affinity.
    pub session_affinity: Option<u32>,
    /// A load balancer ingress frontend of a service with `loadBalancerSourceRanges`: the
    /// client prefixes of the frontend's family it admits (none: it admits no client of its
    /// family). `None`: no restriction.
    pub source_ranges: Option<Vec<IpNet>>,
    /// Why it cannot be programmed, if it cannot.
    pub error: Option<String>,
    /// Whether `error` says what the datapath does not do (an SCTP port, source ranges): the
    /// frontend is left out by design, which is reported but is no fault of the node's.
    pub unsupported: bool,
    /// Why a host port frontend is refused (the reason `cellium_host_ports_refused` counts it
    /// under); `None` for every other plan.
    pub host_port_refusal: Option<crate::host_ports::Refusal>,
}

impl Plan {
    /// `shop/web http (10.96.1.1:80/TCP)`, `shop/web http ([fd00:96::11]:80/TCP)`, as
    /// messages name a frontend.
    pub fn describe(&self) -> String {
        let name = if self.port.name.is_empty() {
            String::new()
        } else {
            format!(" {}", self.port.name)
        };
        format!(
            "{}{name} ({}/{})",
            self.service,
            SocketAddr::new(self.frontend.vip, self.frontend.port),
            self.port.protocol
        )
    }
}

/// An endpoint of this node, as far as load balancing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEndpoint {
    /// How it is named in sources (`endpoint 12 (shop/web-0)`).
    pub name: String,
    /// Its pod, if the runtime named one.
    pub pod: Option<ObjectKey>,
    /// Its addresses, of both families.
    pub addresses: Vec<IpAddr>,
    /// Whether the datapath serves it (state `Ready`).
    pub ready: bool,
    /// The ports its runtime asked to publish on the node (CNI `portMappings`).
    pub port_mappings: Vec<HostPort>,
}

impl From<&Endpoint> for LocalEndpoint {
    fn from(ep: &Endpoint) -> Self {
        LocalEndpoint {
            name: ep.describe(),
            pod: ep
                .pod
                .as_ref()
                .map(|p| ObjectKey::namespaced(&p.namespace, &p.name)),
            addresses: ep.addresses.iter().map(|a| a.ip).collect(),
            ready: ep.state == State::Ready,
            port_mappings: ep.port_mappings.clone(),
        }
    }
}

/// Everything the plans derive from, read at one moment.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Every service.
    pub services: Vec<Arc<Service>>,
    /// Every EndpointSlice.
    pub slices: Vec<Arc<EndpointSlice>>,
    /// Every pod, by key.
    pub pods: BTreeMap<ObjectKey, Arc<Pod>>,
    /// This node's endpoints.
    pub endpoints: Vec<LocalEndpoint>,
    /// This node's name, as EndpointSlices' `nodeName` say it; `None` when unknown.
    pub node_name: Option<String>,
    /// `bpf-lb-algorithm`: the algorithm of services without the annotation.
    pub lb_algorithm: LbAlgorithm,
    /// This node's addresses: NodePort frontends listen on each.
    pub node_addresses: Vec<IpAddr>,
    /// This node's `topology.kubernetes.io/zone` label, if its Node object has one.
    pub node_zone: Option<String>,
    /// `enable-host-port`: pods' host ports get frontends ([`crate::host_ports`]).
    pub host_ports: bool,
}

/// The label that names a node's zone, which topology-aware routing prefers.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

impl Inputs {
    /// Reads the tables and the endpoints.
    pub fn read(resources: &Resources, endpoints: &[Endpoint], node_name: Option<&str>) -> Inputs {
        Inputs {
            services: resources.services.list(),
            slices: resources.endpoint_slices.list(),
            pods: resources
                .pods
                .list()
                .into_iter()
                .map(|p| (p.key(), p))
                .collect(),
            endpoints: endpoints.iter().map(LocalEndpoint::from).collect(),
            node_name: node_name.map(str::to_string),
            lb_algorithm: LbAlgorithm::default(),
            node_addresses: Vec::new(),
            node_zone: node_name
                .and_then(|n| resources.nodes.get(&ObjectKey::cluster(n)))
                .and_then(|node| node.labels.get(ZONE_LABEL).cloned()),
            host_ports: false,
        }
    }
}

/// The frontends every ClusterIP service should have, ordered by service, cluster IP (the
/// first family's first) and port, then those of pods' host ports.
pub fn plans(inputs: &Inputs) -> Vec<Plan> {
    let mut slices_of: BTreeMap<ObjectKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in &inputs.slices {
        if let Some(service) = &slice.service {
            slices_of
                .entry(ObjectKey::namespaced(&slice.namespace, service))
                .or_default()
                .push(slice);
        }
    }
    let mut out = Vec::new();
    for svc in &inputs.services {
        let key = svc.key();
        let slices = own_slices(svc, slices_of.get(&key));
        let slices = slices.as_slice();
        for (&vip, port) in svc
            .vips()
            .iter()
            .flat_map(|vip| svc.ports.iter().map(move |port| (vip, port)))
        {
            let frontend = Frontend {
                vip,
                port: port.port,
                protocol: datapath_protocol(port.protocol),
            };
            out.push(plan(
                svc,
                slices,
                port,
                frontend,
                FrontendKind::ClusterIp,
                inputs,
            ));
        }
        for (kind, frontend, port) in crate::external::frontends(svc, &inputs.node_addresses) {
            out.push(plan(svc, slices, port, frontend, kind, inputs));
        }
    }
    out.extend(crate::host_ports::plans(inputs));
    crate::external::refuse_shared(&mut out);
    out
}

/// One frontend's plan: its backends of its family, from the slices or the selector; only
/// this node's with `externalTrafficPolicy: Local` for a frontend reached from outside.
fn plan(
    svc: &Service,
    slices: &[&EndpointSlice],
    port: &ServicePort,
    frontend: Frontend,
    kind: FrontendKind,
    inputs: &Inputs,
) -> Plan {
    let family = IpFamily::of(frontend.vip);
    // internalTrafficPolicy is the cluster IP's; externalTrafficPolicy the others'.
    let internal_local = (kind == FrontendKind::ClusterIp
        && svc.internal_traffic_policy == TrafficPolicy::Local)
        .then_some(inputs.node_name.as_deref());
    let local = kind != FrontendKind::ClusterIp
        && svc.exposure.external_traffic_policy == TrafficPolicy::Local;
    let zone = (internal_local.is_none() && !local)
        .then(|| topology(svc, slices, inputs.node_zone.as_deref()))
        .flatten();
    let (from, (backends, draining)) = if !slices.is_empty() {
        (
            BackendsFrom::EndpointSlices,
            from_slices(slices, family, port, internal_local, zone.as_ref()),
        )
    } else if !svc.selector.is_empty() {
        (
            BackendsFrom::Selector,
            (from_selector(svc, family, port, inputs), Vec::new()),
        )
    } else {
        (BackendsFrom::None, (Vec::new(), Vec::new()))
    };
    let mut backends = dedup_sorted(backends);
    let mut draining = dedup_sorted(draining);
    if local {
        let here = |b: &PlannedBackend| {
            inputs
                .endpoints
                .iter()
                .any(|e| e.addresses.contains(&b.backend.addr))
        };
        backends.retain(here);
        draining.retain(here);
    }
    draining.retain(|d| !backends.iter().any(|b| b.backend == d.backend));
    let unsupported = unservable(port);
    let is_unsupported = unsupported.is_some();
    let error = unsupported.or_else(|| {
        (backends.len() > MAX_BACKENDS).then(|| {
            format!(
                "{} backends, more than the {MAX_BACKENDS} a frontend can hold",
                backends.len()
            )
        })
    });
    Plan {
        service: svc.key(),
        port: port.clone(),
        frontend,
        kind,
        local,
        from,
        backends,
        draining,
        algorithm: svc.lb_algorithm.unwrap_or(inputs.lb_algorithm),
        session_affinity: svc.session_affinity,
        source_ranges: source_ranges(svc, kind, family),
        error,
        unsupported: is_unsupported,
        host_port_refusal: None,
    }
}

/// Why the datapath cannot serve this port, if it cannot (see the module).
fn unservable(port: &ServicePort) -> Option<String> {
    (port.protocol == Protocol::Sctp)
        .then(|| "SCTP ports are not balanced (the datapath balances TCP and UDP)".into())
}

/// The client prefixes a frontend admits: for a load balancer ingress frontend of a service
/// with `loadBalancerSourceRanges`, those of its family (truncated, without duplicates);
/// `None` for every other frontend, and without ranges (an empty list restricts nothing).
fn source_ranges(svc: &Service, kind: FrontendKind, family: IpFamily) -> Option<Vec<IpNet>> {
    if kind != FrontendKind::LoadBalancer || svc.load_balancer_source_ranges.is_empty() {
        return None;
    }
    let mut ranges: Vec<IpNet> = svc
        .load_balancer_source_ranges
        .iter()
        .filter(|n| IpFamily::of(n.addr()) == family)
        .map(IpNet::trunc)
        .collect();
    ranges.sort_unstable();
    ranges.dedup();
    Some(ranges)
}

/// Which endpoints topology-aware routing prefers, for a node of a known zone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Topology {
    /// Those whose hints name this zone.
    Hints(String),
    /// Those in this zone (`trafficDistribution: PreferClose` without hints).
    Zone(String),
}

impl Topology {
    fn prefers(&self, ep: &SliceEndpoint) -> bool {
        match self {
            Topology::Hints(zone) => ep.for_zones.contains(zone),
            Topology::Zone(zone) => ep.zone.as_ref() == Some(zone),
        }
    }
}

/// Whether and how `svc` prefers endpoints of `zone`: by hints when every ready endpoint of
/// its slices has some (as kube-proxy), by zone with `trafficDistribution: PreferClose`.
fn topology(svc: &Service, slices: &[&EndpointSlice], zone: Option<&str>) -> Option<Topology> {
    let zone = zone?.to_string();
    let mut ready = slices.iter().flat_map(|s| &s.endpoints).filter(|e| e.ready);
    let hinted = ready.clone().next().is_some() && ready.all(|e| !e.for_zones.is_empty());
    if hinted {
        Some(Topology::Hints(zone))
    } else if svc.traffic_distribution.as_deref() == Some("PreferClose") {
        Some(Topology::Zone(zone))
    } else {
        None
    }
}

/// The slices labelled with the service's name that belong to it: all of them, whoever
/// manages them (the endpointslice controller, another controller or a person, as kube-proxy
/// merges every slice of a service), except those whose owner reference names a Service of
/// this name with another uid. Those were written for a service deleted since (the garbage
/// collector deletes them), and serve nothing until they go.
fn own_slices<'a>(
    svc: &Service,
    labelled: Option<&Vec<&'a EndpointSlice>>,
) -> Vec<&'a EndpointSlice> {
    labelled
        .into_iter()
        .flatten()
        .filter(|s| !s.owned_by_another(&svc.name, svc.uid.as_deref()))
        .copied()
        .collect()
}

/// The backends of a frontend from its service's slices, and those draining (see the module).
/// `local`: only the endpoints of this node (named `Some(name)`, or unknown: `None`) count.
fn from_slices(
    slices: &[&EndpointSlice],
    family: IpFamily,
    port: &ServicePort,
    local: Option<Option<&str>>,
    zone: Option<&Topology>,
) -> (Vec<PlannedBackend>, Vec<PlannedBackend>) {
    let here = |ep: &SliceEndpoint| match local {
        None => true,
        Some(node) => node.is_some() && ep.node_name.as_deref() == node,
    };
    let (mut near, mut ready, mut terminating, mut rest) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for slice in slices.iter().filter(|s| s.address_type == family) {
        let source = format!("EndpointSlice {}", slice.key());
        let numbers = slice
            .ports
            .iter()
            .filter(|p| p.name == port.name && p.protocol == port.protocol)
            .filter_map(|p| p.port);
        for number in numbers {
            for ep in slice.endpoints.iter().filter(|ep| here(ep)) {
                let planned = PlannedBackend {
                    backend: Backend {
                        addr: ep.address(),
                        port: number,
                        protocol: datapath_protocol(port.protocol),
                    },
                    source: source.clone(),
                };
                if ep.ready && zone.is_some_and(|z| z.prefers(ep)) {
                    near.push(planned);
                } else if ep.ready {
                    ready.push(planned);
                } else if ep.serving && ep.terminating {
                    terminating.push(planned);
                } else {
                    rest.push(planned);
                }
            }
        }
    }
    if !near.is_empty() {
        rest.extend(ready);
        rest.extend(terminating);
        (near, rest)
    } else if ready.is_empty() {
        (terminating, rest)
    } else {
        rest.extend(terminating);
        (ready, rest)
    }
}

fn from_selector(
    svc: &Service,
    family: IpFamily,
    port: &ServicePort,
    inputs: &Inputs,
) -> Vec<PlannedBackend> {
    let mut out = Vec::new();
    for ep in inputs.endpoints.iter().filter(|e| e.ready) {
        let Some(pod_key) = &ep.pod else { continue };
        if pod_key.namespace != svc.namespace {
            continue;
        }
        let Some(pod) = inputs.pods.get(pod_key) else {
            continue;
        };
        if !svc.selects(&pod.labels) {
            continue;
        }
        let number = match &port.target_port {
            PortRef::Number(n) => *n,
            PortRef::Name(name) => match pod
                .ports
                .iter()
                .find(|p| &p.name == name && p.protocol == port.protocol)
            {
                Some(p) => p.port,
                None => continue,
            },
        };
        for addr in ep.addresses.iter().filter(|a| IpFamily::of(**a) == family) {
            out.push(PlannedBackend {
                backend: Backend {
                    addr: *addr,
                    port: number,
                    protocol: datapath_protocol(port.protocol),
                },
                source: ep.name.clone(),
            });
        }
    }
    out
}

/// Backends ordered by address and port; the first source of a duplicate is kept.
fn dedup_sorted(mut backends: Vec<PlannedBackend>) -> Vec<PlannedBackend> {
    let mut seen = HashSet::new();
    backends.retain(|b| seen.insert(b.backend));
    backends.sort_by_key(|b| (b.backend.addr, b.backend.port));
    backends
}

/// The datapath's protocol for a Kubernetes one.
pub fn datapath_protocol(p: Protocol) -> cellium_datapath_bpf::Protocol {
    match p {
        Protocol::Tcp => cellium_datapath_bpf::Protocol::Tcp,
        Protocol::Udp => cellium_datapath_bpf::Protocol::Udp,
        Protocol::Sctp => cellium_datapath_bpf::Protocol::Sctp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop }
---
apiVersion: v1
kind: Pod
metadata: { name: web-0, namespace: shop, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 8080 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web-1, namespace: shop, labels: { app: web, canary: "yes" } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 8081 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: db, namespace: shop, labels: { app: db } }
spec: { containers: [ { name: c } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web-x, namespace: default, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 8080 } ] } ] }
"#;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, last))
    }

    fn endpoint(id: u16, ns: &str, pod: &str, last: u8, ready: bool) -> LocalEndpoint {
        LocalEndpoint {
            name: format!("endpoint {id} ({ns}/{pod})"),
            pod: Some(ObjectKey::namespaced(ns, pod)),
            addresses: vec![ip(last)],
            ready,
            port_mappings: Vec::new(),
        }
    }

    fn setup(services: &str) -> Inputs {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        r.apply("svc.yaml", services).unwrap();
        let mut inputs = Inputs::read(&r, &[], Some("node-1"));
        inputs.endpoints = vec![
            endpoint(1, "shop", "web-0", 10, true),
            endpoint(2, "shop", "web-1", 11, true),
            endpoint(3, "shop", "db", 12, true),
            endpoint(4, "default", "web-x", 13, true),
            endpoint(5, "shop", "web-2", 14, true),
            LocalEndpoint {
                name: "endpoint 6 (container 3f2a)".into(),
                pod: None,
                addresses: vec![ip(15)],
                ready: true,
                port_mappings: Vec::new(),
            },
        ];
        inputs
    }

    fn backends(plan: &Plan) -> Vec<String> {
        plan.backends
            .iter()
            .map(|b| format!("{}:{} {}", b.backend.addr, b.backend.port, b.source))
            .collect()
    }

    #[test]
    fn a_selector_picks_the_nodes_matching_endpoints_at_the_target_port() {
        let inputs = setup(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.20\n  selector: {app: web}\n  ports: [{name: http, port: 80, targetPort: http}, {name: admin, port: 9000, targetPort: 9001}, {name: dns, port: 53, targetPort: http, protocol: UDP}]\n",
        );
        let plans = plans(&inputs);
        assert_eq!(plans.len(), 3);
        let http = &plans[0];
        assert_eq!(http.describe(), "shop/web http (10.96.0.20:80/TCP)");
        assert_eq!(http.from, BackendsFrom::Selector);
        // Same namespace only; web-2 has no Pod object; the endpoint without a pod is nobody's.
        assert_eq!(
            backends(http),
            vec![
                "10.244.0.10:8080 endpoint 1 (shop/web-0)",
                "10.244.0.11:8081 endpoint 2 (shop/web-1)"
            ]
        );
        assert_eq!(
            backends(&plans[1]),
            vec![
                "10.244.0.10:9001 endpoint 1 (shop/web-0)",
                "10.244.0.11:9001 endpoint 2 (shop/web-1)"
            ]
        );
        // The named port exists only for TCP: no UDP backend resolves it.
        assert!(plans[2].backends.is_empty());
        assert_eq!(
            plans[2].frontend.protocol,
            cellium_datapath_bpf::Protocol::Udp
        );
        assert!(plans.iter().all(|p| p.error.is_none()));
    }

    #[test]
    fn endpoints_not_ready_are_no_backends() {
        let mut inputs = setup(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.0.20, selector: {app: web, canary: 'yes'}, ports: [{port: 80}]}\n",
        );
        assert_eq!(
            backends(&plans(&inputs)[0]),
            vec!["10.244.0.11:80 endpoint 2 (shop/web-1)"]
        );
        inputs.endpoints[1].ready = false;
        assert!(plans(&inputs)[0].backends.is_empty());
    }

    #[test]
    fn terminating_and_unready_endpoints_drain_and_serve_only_when_nothing_is_ready() {
        let slice = |ready_one: &str| {
            format!(
                r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec: {{ clusterIP: 10.96.0.20, ports: [ {{ name: http, port: 80 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-a, namespace: shop, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
endpoints:
- {{ addresses: [ 10.1.0.1 ], conditions: {{ ready: {ready_one} }} }}
- {{ addresses: [ 10.1.0.2 ], conditions: {{ ready: false, serving: true, terminating: true }} }}
- {{ addresses: [ 10.1.0.3 ], conditions: {{ ready: false, serving: false, terminating: true }} }}
- {{ addresses: [ 10.1.0.4 ], conditions: {{ ready: false }} }}
ports: [ {{ name: http, port: 8080 }} ]
"#
            )
        };
        let drained = |p: &Plan| -> Vec<String> {
            p.draining
                .iter()
                .map(|b| SocketAddr::new(b.backend.addr, b.backend.port).to_string())
                .collect()
        };
        // One is ready: it alone takes new connections; the rest keep theirs.
        let plan = &plans(&setup(&slice("true")))[0];
        assert_eq!(
            backends(plan),
            vec!["10.1.0.1:8080 EndpointSlice shop/web-a"]
        );
        assert_eq!(
            drained(plan),
            ["10.1.0.2:8080", "10.1.0.3:8080", "10.1.0.4:8080"]
        );
        // None is ready: the one still serving while terminating takes them (kube-proxy's
        // fallback).
        let plan = &plans(&setup(&slice("false")))[0];
        assert_eq!(
            backends(plan),
            vec!["10.1.0.2:8080 EndpointSlice shop/web-a"]
        );
        assert_eq!(
            drained(plan),
            ["10.1.0.1:8080", "10.1.0.3:8080", "10.1.0.4:8080"]
        );
    }

    #[test]
    fn slices_win_over_the_selector_and_match_ports_by_name_and_protocol() {
        let inputs = setup(
            r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: shop }
spec: { clusterIP: 10.96.0.20, selector: { app: web }, ports: [ { name: http, port: 80 }, { name: dns, port: 53, protocol: UDP } ] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: web-a, namespace: shop, labels: { kubernetes.io/service-name: web } }
addressType: IPv4
endpoints:
- { addresses: [ 10.1.0.2 ] }
- { addresses: [ 10.1.0.1, 10.1.0.9 ], conditions: { ready: true } }
- { addresses: [ 10.1.0.3 ], conditions: { ready: false } }
ports: [ { name: http, port: 8080 }, { name: dns, port: 5353 }, { name: other, port: 1 } ]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: web-b, namespace: shop, labels: { kubernetes.io/service-name: web } }
addressType: IPv4
endpoints: [ { addresses: [ 10.1.0.2 ] }, { addresses: [ 10.1.0.4 ] } ]
ports: [ { name: http, port: 8080 }, { name: dns, port: 5353, protocol: UDP } ]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: elsewhere, namespace: default, labels: { kubernetes.io/service-name: web } }
addressType: IPv4
endpoints: [ { addresses: [ 10.9.9.9 ] } ]
ports: [ { name: http, port: 8080 } ]
"#,
        );
        let plans = plans(&inputs);
        assert_eq!(plans[0].from, BackendsFrom::EndpointSlices);
        // Ready endpoints of both slices, first address only, duplicates once, sorted.
        assert_eq!(
            backends(&plans[0]),
            vec![
                "10.1.0.1:8080 EndpointSlice shop/web-a",
                "10.1.0.2:8080 EndpointSlice shop/web-a",
                "10.1.0.4:8080 EndpointSlice shop/web-b"
            ]
        );
        // web-a's "dns" port is TCP (the default): only web-b serves the UDP port.
        assert_eq!(
            backends(&plans[1]),
            vec![
                "10.1.0.2:5353 EndpointSlice shop/web-b",
                "10.1.0.4:5353 EndpointSlice shop/web-b"
            ]
        );
    }

    #[test]
    fn unnamed_ports_match_unnamed_slice_ports() {
        let inputs = setup(
            "apiVersion: v1\nkind: Service\nmetadata: {name: ext, namespace: shop}\nspec: {clusterIP: 10.96.0.30, ports: [{port: 80}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ext-1, namespace: shop, labels: {kubernetes.io/service-name: ext}}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.7]}]\nports: [{port: 8443}, {name: x, port: 1}]\n",
        );
        assert_eq!(
            backends(&plans(&inputs)[0]),
            vec!["10.1.0.7:8443 EndpointSlice shop/ext-1"]
        );
    }

    #[test]
    fn a_dual_stack_service_has_a_frontend_per_family_with_backends_of_its_family() {
        let cidrs: Vec<cellium_datapath_bpf::IpNet> = vec![
            "10.96.0.0/24".parse().unwrap(),
            "fd00:96::/120".parse().unwrap(),
        ];
        let r = Resources::with_service_cidr(&cidrs).unwrap();
        r.apply("app.yaml", APP).unwrap();
        r.apply(
            "svc.yaml",
            r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: shop }
spec: { ipFamilyPolicy: PreferDualStack, selector: { app: web }, ports: [ { name: http, port: 80, targetPort: http } ] }
---
apiVersion: v1
kind: Service
metadata: { name: ext, namespace: shop }
spec: { ipFamilies: [ IPv6, IPv4 ], ports: [ { port: 53, protocol: UDP } ] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: ext-6, namespace: shop, labels: { kubernetes.io/service-name: ext } }
addressType: IPv6
endpoints: [ { addresses: [ "fd00:1::7" ] } ]
ports: [ { port: 5353, protocol: UDP } ]
"#,
        )
        .unwrap();
        let mut inputs = Inputs::read(&r, &[], Some("node-1"));
        let v6 = |last: u16| {
            IpAddr::V6(std::net::Ipv6Addr::new(
                0xfd00, 0x10, 0x244, 0, 0, 0, 0, last,
            ))
        };
        inputs.endpoints = vec![LocalEndpoint {
            name: "endpoint 1 (shop/web-0)".into(),
            pod: Some(ObjectKey::namespaced("shop", "web-0")),
            addresses: vec![ip(10), v6(10)],
            ready: true,
            port_mappings: Vec::new(),
        }];
        let plans = plans(&inputs);
        let described: Vec<(String, Vec<String>)> =
            plans.iter().map(|p| (p.describe(), backends(p))).collect();
        assert_eq!(
            described,
            vec![
                // ext: its IPv6 frontend first, from its IPv6 slice; no IPv4 slice, none.
                (
                    "shop/ext ([fd00:96::12]:53/UDP)".into(),
                    vec!["fd00:1::7:5353 EndpointSlice shop/ext-6".into()]
                ),
                ("shop/ext (10.96.0.18:53/UDP)".into(), vec![]),
                (
                    "shop/web http (10.96.0.17:80/TCP)".into(),
                    vec!["10.244.0.10:8080 endpoint 1 (shop/web-0)".into()]
                ),
                (
                    "shop/web http ([fd00:96::11]:80/TCP)".into(),
                    vec!["fd00:10:244::a:8080 endpoint 1 (shop/web-0)".into()]
                ),
            ]
        );
    }

    #[test]
    fn headless_services_have_no_frontend_and_no_source_means_no_backends() {
        let inputs = setup(
            "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec: {clusterIP: None, selector: {app: db}, ports: [{port: 5432}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: manual, namespace: shop}\nspec: {ports: [{port: 80}]}\n",
        );
        let plans = plans(&inputs);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].service, ObjectKey::namespaced("shop", "manual"));
        assert_eq!(plans[0].from, BackendsFrom::None);
        assert!(plans[0].backends.is_empty());
        assert_eq!(plans[0].from.to_string(), "none");
    }

    /// A slice of service `web` in `shop` named `name`, with extra metadata `meta`, serving
    /// `addr` on the http port.
    fn web_slice(name: &str, meta: &str, addr: &str) -> String {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: {name}, namespace: shop{meta} }}\naddressType: IPv4\nendpoints: [ {{ addresses: [ {addr} ] }} ]\nports: [ {{ name: http, port: 8080 }} ]\n"
        )
    }

    const WEB_LABEL: &str = "kubernetes.io/service-name: web";

    #[test]
    fn slices_of_every_manager_merge_and_those_of_a_deleted_service_are_left_out() {
        let owner = |uid: &str| {
            format!(
                ", ownerReferences: [ {{ apiVersion: v1, kind: Service, name: web, uid: {uid}, controller: true }} ]"
            )
        };
        let controller = format!(
            ", labels: {{ {WEB_LABEL}, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io }}"
        );
        let yaml = [
            "apiVersion: v1\nkind: Service\nmetadata: { name: web, namespace: shop, uid: web-2 }\nspec: { clusterIP: 10.96.0.20, selector: { app: web }, ports: [ { name: http, port: 80 } ] }\n".to_string(),
            web_slice("web-ctrl", &format!("{controller}{}", owner("web-2")), "10.1.0.1"),
            web_slice(
                "web-manual",
                &format!(", labels: {{ {WEB_LABEL}, endpointslice.kubernetes.io/managed-by: staff }}"),
                "10.1.0.2",
            ),
            web_slice("web-bare", &format!(", labels: {{ {WEB_LABEL} }}"), "10.1.0.3"),
            // Written for the web service deleted before this one was created.
            web_slice("web-old", &format!("{controller}{}", owner("web-1")), "10.1.0.9"),
        ]
        .concat();
        let plan = &plans(&setup(&yaml))[0];
        assert_eq!(plan.from, BackendsFrom::EndpointSlices);
        assert_eq!(
            backends(plan),
            vec![
                "10.1.0.1:8080 EndpointSlice shop/web-ctrl",
                "10.1.0.2:8080 EndpointSlice shop/web-manual",
                "10.1.0.3:8080 EndpointSlice shop/web-bare"
            ]
        );
        // Its endpoint is not even draining: the slice is not the service's.
        assert!(plan.draining.is_empty(), "{:?}", plan.draining);
    }

    #[test]
    fn a_service_whose_slices_are_all_stale_falls_back_to_its_selector_one_without_uid_keeps_them()
    {
        let stale = format!(
            ", labels: {{ {WEB_LABEL} }}, ownerReferences: [ {{ apiVersion: v1, kind: Service, name: web, uid: web-1 }} ]"
        );
        let service = |uid: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{ name: web, namespace: shop{uid} }}\nspec: {{ clusterIP: 10.96.0.20, selector: {{ app: web, canary: 'yes' }}, ports: [ {{ name: http, port: 80, targetPort: http }} ] }}\n"
            )
        };
        // Re-created (a new uid): as if no slice named it, so the selector gives its backends.
        let yaml = [
            service(", uid: web-2"),
            web_slice("web-old", &stale, "10.1.0.9"),
        ]
        .concat();
        let plan = &plans(&setup(&yaml))[0];
        assert_eq!(plan.from, BackendsFrom::Selector);
        assert_eq!(
            backends(plan),
            vec!["10.244.0.11:8081 endpoint 2 (shop/web-1)"]
        );
        // Applied without a uid: nothing tells the slice is stale.
        let yaml = [service(""), web_slice("web-old", &stale, "10.1.0.9")].concat();
        let plan = &plans(&setup(&yaml))[0];
        assert_eq!(
            backends(plan),
            vec!["10.1.0.9:8080 EndpointSlice shop/web-old"]
        );
    }

    #[test]
    fn internal_traffic_policy_local_keeps_only_this_nodes_endpoints() {
        let yaml = |policy: &str, selector: &str| {
            format!(
                r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec: {{ clusterIP: 10.96.0.20, internalTrafficPolicy: {policy}, ports: [ {{ name: http, port: 80 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-a, namespace: shop, labels: {{ {WEB_LABEL} }} }}
addressType: IPv4
endpoints:
- {{ addresses: [ 10.1.0.1 ], nodeName: node-1 }}
- {{ addresses: [ 10.1.0.2 ], nodeName: node-2 }}
- {{ addresses: [ 10.1.0.3 ] }}
- {{ addresses: [ 10.1.0.4 ], nodeName: node-1, conditions: {{ ready: false }} }}
- {{ addresses: [ 10.1.0.5 ], nodeName: node-2, conditions: {{ ready: false }} }}
ports: [ {{ name: http, port: 8080 }} ]
---
apiVersion: v1
kind: Service
metadata: {{ name: sel, namespace: shop }}
spec: {{ clusterIP: 10.96.0.21, internalTrafficPolicy: {policy}, selector: {{ {selector} }}, ports: [ {{ port: 80 }} ] }}
"#
            )
        };
        let addrs = |b: &[PlannedBackend]| -> Vec<String> {
            b.iter().map(|b| b.backend.addr.to_string()).collect()
        };
        // Cluster: every ready endpoint, wherever it runs.
        let plans_cluster = plans(&setup(&yaml("Cluster", "app: web")));
        assert_eq!(
            addrs(&plans_cluster[1].backends),
            ["10.1.0.1", "10.1.0.2", "10.1.0.3"]
        );
        // Local: this node's only; the others are not even draining (they never were ours).
        let mut inputs = setup(&yaml("Local", "app: web"));
        let local = plans(&inputs);
        assert_eq!(local[1].describe(), "shop/web http (10.96.0.20:80/TCP)");
        assert_eq!(addrs(&local[1].backends), ["10.1.0.1"]);
        assert_eq!(addrs(&local[1].draining), ["10.1.0.4"]);
        // The selector's backends are this node's endpoints already.
        assert_eq!(addrs(&local[0].backends), ["10.244.0.10", "10.244.0.11"]);
        // Another node's name: nothing here, so no backends at all (connections are refused).
        inputs.node_name = Some("node-3".into());
        let elsewhere = plans(&inputs);
        assert!(elsewhere[1].backends.is_empty() && elsewhere[1].draining.is_empty());
        // No node name known: no endpoint of a slice can be told local.
        inputs.node_name = None;
        assert!(plans(&inputs)[1].backends.is_empty());
        // A selector matching nothing local: none either.
        let none = plans(&setup(&yaml("Local", "app: nothing")));
        assert!(none[0].backends.is_empty());
    }

    #[test]
    fn the_annotation_overrides_the_agents_algorithm() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: shop, annotations: {service.cilium.io/lb-algorithm: random}}\nspec: {clusterIP: 10.96.0.20, selector: {app: web}, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: shop}\nspec: {clusterIP: 10.96.0.21, selector: {app: web}, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: c, namespace: shop, annotations: {service.cilium.io/lb-algorithm: maglev}}\nspec: {clusterIP: 10.96.0.22, selector: {app: web}, ports: [{port: 80}]}\n";
        let mut inputs = setup(yaml);
        let algorithms = |inputs: &Inputs| -> Vec<LbAlgorithm> {
            plans(inputs).iter().map(|p| p.algorithm).collect()
        };
        use LbAlgorithm::{Maglev, Random};
        assert_eq!(algorithms(&inputs), [Random, Random, Maglev]);
        inputs.lb_algorithm = Maglev;
        assert_eq!(algorithms(&inputs), [Random, Maglev, Maglev]);
    }

    #[test]
    fn session_affinity_comes_from_the_service() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: shop}\nspec: {clusterIP: 10.96.0.20, sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}, selector: {app: web}, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: shop}\nspec: {clusterIP: 10.96.0.21, sessionAffinity: ClientIP, selector: {app: web}, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: c, namespace: shop}\nspec: {clusterIP: 10.96.0.22, selector: {app: web}, ports: [{port: 80}]}\n";
        let affinity: Vec<Option<u32>> = plans(&setup(yaml))
            .iter()
            .map(|p| p.session_affinity)
            .collect();
        assert_eq!(affinity, [Some(60), Some(10800), None]);
    }

    #[test]
    fn node_ports_external_and_ingress_ips_get_frontends_and_local_keeps_this_nodes_backends() {
        let mut inputs = setup(
            r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: shop }
spec: { type: LoadBalancer, clusterIP: 10.96.0.20, externalTrafficPolicy: Local, externalIPs: [ 192.0.2.1, "2001:db8::1" ], ports: [ { name: http, port: 80, nodePort: 30080 } ] }
status: { loadBalancer: { ingress: [ { ip: 192.0.2.9 } ] } }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: web-a, namespace: shop, labels: { kubernetes.io/service-name: web } }
addressType: IPv4
endpoints: [ { addresses: [ 10.244.0.10 ] }, { addresses: [ 10.1.0.1 ] } ]
ports: [ { name: http, port: 8080 } ]
"#,
        );
        inputs.node_addresses = vec!["10.98.0.1".parse().unwrap(), "fd00:98::1".parse().unwrap()];
        let plans = plans(&inputs);
        let described: Vec<(String, FrontendKind, bool, usize)> = plans
            .iter()
            .map(|p| (p.describe(), p.kind, p.local, p.backends.len()))
            .collect();
        // No IPv6 cluster IP: no IPv6 node port or external IP frontend. Outside frontends
        // keep this node's backend only (10.244.0.10 is endpoint 1's); the cluster IP both.
        assert_eq!(
            described,
            vec![
                (
                    "shop/web http (10.96.0.20:80/TCP)".into(),
                    FrontendKind::ClusterIp,
                    false,
                    2
                ),
                (
                    "shop/web http (10.98.0.1:30080/TCP)".into(),
                    FrontendKind::NodePort,
                    true,
                    1
                ),
                (
                    "shop/web http (192.0.2.1:80/TCP)".into(),
                    FrontendKind::ExternalIp,
                    true,
                    1
                ),
                (
                    "shop/web http (192.0.2.9:80/TCP)".into(),
                    FrontendKind::LoadBalancer,
                    true,
                    1
                ),
            ]
        );
        assert_eq!(plans[0].flags(), 0);
        assert_eq!(
            plans[1].flags(),
            cellium_datapath_bpf::SERVICE_EXTERNAL | cellium_datapath_bpf::SERVICE_LOCAL
        );
    }

    #[test]
    fn an_external_ip_two_services_name_is_programmed_for_the_first_only() {
        let two = |name: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{selector: {{app: web}}, externalIPs: [192.0.2.1], ports: [{{port: 80}}]}}\n---\n"
            )
        };
        let plans = plans(&setup(&(two("b") + &two("a"))));
        let external: Vec<(String, Option<String>)> = plans
            .iter()
            .filter(|p| p.kind == FrontendKind::ExternalIp)
            .map(|p| (p.service.to_string(), p.error.clone()))
            .collect();
        assert_eq!(
            external,
            vec![
                ("shop/a".into(), None),
                (
                    "shop/b".into(),
                    Some("the frontend is service shop/a's".into())
                )
            ]
        );
    }

    const LB_WITH_FIELDS: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: shop }
spec: { type: LoadBalancer, clusterIP: 10.96.0.20, SPEC ports: [ { name: http, port: 80, nodePort: 30080 }, { name: sig, port: 3868, protocol: SCTP, nodePort: 30086 } ] }
status: { loadBalancer: { ingress: [ { ip: 192.0.2.9 } ] } }
"#;

    fn described(plans: &[Plan]) -> Vec<(String, Option<String>)> {
        plans
            .iter()
            .map(|p| (p.describe(), p.error.clone()))
            .collect()
    }

    #[test]
    fn sctp_ports_leave_out_only_their_frontends_and_source_ranges_restrict_the_lb_ip() {
        let mut inputs = setup(&LB_WITH_FIELDS.replace(
            "SPEC",
            "loadBalancerSourceRanges: [ 198.51.100.7/24, 2001:db8::/32 ], trafficDistribution: PreferClose,",
        ));
        inputs.node_addresses = vec!["10.98.0.1".parse().unwrap()];
        let plans = plans(&inputs);
        let sctp = Some("SCTP ports are not balanced (the datapath balances TCP and UDP)".into());
        assert_eq!(
            described(&plans),
            vec![
                ("shop/web http (10.96.0.20:80/TCP)".into(), None),
                ("shop/web sig (10.96.0.20:3868/SCTP)".into(), sctp.clone()),
                ("shop/web http (10.98.0.1:30080/TCP)".into(), None),
                ("shop/web http (192.0.2.9:80/TCP)".into(), None),
                ("shop/web sig (10.98.0.1:30086/SCTP)".into(), sctp.clone()),
                ("shop/web sig (192.0.2.9:3868/SCTP)".into(), sctp),
            ]
        );
        let ranges: Vec<(String, Option<Vec<IpNet>>, bool)> = plans
            .iter()
            .filter(|p| p.error.is_none())
            .map(|p| {
                let flagged = p.flags() & cellium_datapath_bpf::SERVICE_SOURCE_RANGE != 0;
                (p.describe(), p.source_ranges.clone(), flagged)
            })
            .collect();
        // Only the load balancer IP is restricted, to the ranges of its family, truncated.
        assert_eq!(
            ranges,
            vec![
                ("shop/web http (10.96.0.20:80/TCP)".into(), None, false),
                ("shop/web http (10.98.0.1:30080/TCP)".into(), None, false),
                (
                    "shop/web http (192.0.2.9:80/TCP)".into(),
                    Some(vec!["198.51.100.0/24".parse().unwrap()]),
                    true
                ),
            ]
        );
    }

    #[test]
    fn a_zero_range_admits_all_and_no_ranges_restrict_nothing() {
        let lb_ranges = |spec: &str| -> Vec<Option<Vec<IpNet>>> {
            plans(&setup(&LB_WITH_FIELDS.replace("SPEC", spec)))
                .iter()
                .filter(|p| p.kind == FrontendKind::LoadBalancer && p.error.is_none())
                .map(|p| p.source_ranges.clone())
                .collect()
        };
        assert_eq!(
            lb_ranges("loadBalancerSourceRanges: [ 0.0.0.0/0 ],"),
            vec![Some(vec!["0.0.0.0/0".parse().unwrap()])]
        );
        assert_eq!(lb_ranges("loadBalancerSourceRanges: [],"), vec![None]);
        assert_eq!(lb_ranges(""), vec![None]);
        // Ranges of the other family only: the frontend admits no client of its own.
        assert_eq!(
            lb_ranges("loadBalancerSourceRanges: [ 2001:db8::/32 ],"),
            vec![Some(vec![])]
        );
    }

    #[test]
    fn another_load_balancer_class_keeps_its_ingress_ips_and_external_names_have_no_frontend() {
        let mut inputs = setup(&format!(
            "{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{type: ExternalName, externalName: db.example.com, ports: [{{port: 5432}}]}}\n",
            LB_WITH_FIELDS.replace("SPEC", "loadBalancerClass: example.com/lb,")
        ));
        inputs.node_addresses = vec!["10.98.0.1".parse().unwrap()];
        let plans = plans(&inputs);
        let frontends: Vec<String> = plans
            .iter()
            .filter(|p| p.frontend.protocol == cellium_datapath_bpf::Protocol::Tcp)
            .map(Plan::describe)
            .collect();
        assert_eq!(
            frontends,
            [
                "shop/web http (10.96.0.20:80/TCP)",
                "shop/web http (10.98.0.1:30080/TCP)"
            ]
        );
    }

    fn zoned(distribution: &str, hints: [&str; 3]) -> String {
        let hint = |zone: &str| {
            if zone.is_empty() {
                String::new()
            } else {
                format!(", hints: {{ forZones: [ {{ name: {zone} }} ] }}")
            }
        };
        format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec: {{ clusterIP: 10.96.0.20, {distribution} ports: [ {{ name: http, port: 80 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-a, namespace: shop, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
endpoints:
- {{ addresses: [ 10.1.0.1 ], zone: a{} }}
- {{ addresses: [ 10.1.0.2 ], zone: b{} }}
- {{ addresses: [ 10.1.0.3 ], zone: b{} }}
ports: [ {{ name: http, port: 8080 }} ]
"#,
            hint(hints[0]),
            hint(hints[1]),
            hint(hints[2]),
        )
    }

    #[test]
    fn prefer_close_and_zone_hints_prefer_the_nodes_zone_and_fall_back_to_all() {
        let addrs = |inputs: &Inputs| -> Vec<String> {
            plans(inputs)[0]
                .backends
                .iter()
                .map(|b| b.backend.addr.to_string())
                .collect()
        };
        let all = ["10.1.0.1", "10.1.0.2", "10.1.0.3"];
        let in_zone = |doc: String, zone: Option<&str>| {
            let mut inputs = setup(&doc);
            inputs.node_zone = zone.map(str::to_string);
            addrs(&inputs)
        };
        let close = "trafficDistribution: PreferClose,";
        assert_eq!(
            in_zone(zoned(close, ["", "", ""]), Some("b")),
            ["10.1.0.2", "10.1.0.3"]
        );
        assert_eq!(in_zone(zoned(close, ["", "", ""]), Some("a")), ["10.1.0.1"]);
        // No endpoint in the zone, or the zone unknown: all of them.
        assert_eq!(in_zone(zoned(close, ["", "", ""]), Some("c")), all);
        assert_eq!(in_zone(zoned(close, ["", "", ""]), None), all);
        // Without the preference nor hints, zones do not matter.
        assert_eq!(in_zone(zoned("", ["", "", ""]), Some("a")), all);
        // Hints on every endpoint win, with or without the field.
        assert_eq!(
            in_zone(zoned("", ["a", "a", "b"]), Some("a")),
            ["10.1.0.1", "10.1.0.2"]
        );
        // Hints on some only are ignored (as kube-proxy).
        assert_eq!(in_zone(zoned("", ["a", "", "b"]), Some("a")), all);
        // The others keep their connections.
        let mut inputs = setup(&zoned(close, ["", "", ""]));
        inputs.node_zone = Some("a".into());
        let draining: Vec<String> = plans(&inputs)[0]
            .draining
            .iter()
            .map(|b| b.backend.addr.to_string())
            .collect();
        assert_eq!(draining, ["10.1.0.2", "10.1.0.3"]);
    }
}

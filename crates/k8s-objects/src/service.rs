//! `v1 Service`: ClusterIP, NodePort, LoadBalancer and headless services, single-stack or
//! dual-stack, checked and defaulted as the API server does.
//!
//! NodePort and LoadBalancer services, external IPs and the external traffic policy are read
//! by [`service_exposure`](crate::service_exposure). Fields a cluster commonly holds never
//! refuse the whole service: an ExternalName service is stored and not load-balanced (as
//! kube-proxy), and `loadBalancerClass`, `loadBalancerSourceRanges`, `trafficDistribution`
//! and SCTP ports are stored for the load balancer to honour, or to leave out and report,
//! frontend by frontend. `spec.loadBalancerIP` is still refused. The cluster IPs and the families (`ipFamilies`,
//! `ipFamilyPolicy`) are decided by `cellium_resources::Resources` (allocated from the
//! `service-cidr` ranges, or checked there, and defaulted from what the cluster has), since
//! they depend on the configuration and on the other services.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::Protocol;
use crate::key::{Object, ObjectKey};
use crate::pod::port_name;
use crate::policy_port::{PortRef, number};
use crate::service_exposure::{Exposure, ServiceType, TrafficPolicy, exposure};
use crate::validate::{self, FieldError};

/// A service's virtual address (`spec.clusterIP`: of its first family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClusterIp {
    /// A ClusterIP service's address of its first family.
    Address(IpAddr),
    /// `clusterIP: None`: a headless service, which has no address and is not load-balanced.
    Headless,
}

/// An IP family, as `spec.ipFamilies` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    /// `IPv4`.
    Ipv4,
    /// `IPv6`.
    Ipv6,
}

impl IpFamily {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::Ipv4,
            IpAddr::V6(_) => IpFamily::Ipv6,
        }
    }

    /// The other family.
    pub fn other(self) -> IpFamily {
        match self {
            IpFamily::Ipv4 => IpFamily::Ipv6,
            IpFamily::Ipv6 => IpFamily::Ipv4,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::Ipv4 => "IPv4",
            IpFamily::Ipv6 => "IPv6",
        })
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamilyPolicy {
    /// One family.
    SingleStack,
    /// Both families when the cluster has both, one otherwise.
    PreferDualStack,
    /// Both families; refused by a single-stack cluster.
    RequireDualStack,
}

impl fmt::Display for IpFamilyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamilyPolicy::SingleStack => "SingleStack",
            IpFamilyPolicy::PreferDualStack => "PreferDualStack",
            IpFamilyPolicy::RequireDualStack => "RequireDualStack",
        })
    }
}

impl fmt::Display for ClusterIp {
    /// The address, or `None` as the API writes a headless service's.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterIp::Address(ip) => write!(f, "{ip}"),
            ClusterIp::Headless => f.write_str("None"),
        }
    }
}

/// How a frontend chooses the backend of a new connection (Cilium's `bpf-lb-algorithm` values,
/// and those of the annotation [`LB_ALGORITHM_ANNOTATION`]).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum LbAlgorithm {
    /// A backend at random.
    #[default]
    Random,
    /// The backend the frontend's maglev table gives the connection's 5-tuple: the same on
    /// every node, and few connections move when a backend comes or goes.
    Maglev,
}

impl fmt::Display for LbAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LbAlgorithm::Random => "random",
            LbAlgorithm::Maglev => "maglev",
        })
    }
}

/// The annotation that chooses a service's [`LbAlgorithm`] (Cilium's name).
pub const LB_ALGORITHM_ANNOTATION: &str = "service.cilium.io/lb-algorithm";

/// The service's own [`LbAlgorithm`], if its annotation names one.
fn lb_algorithm(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<LbAlgorithm>, FieldError> {
    let Some(value) = annotations.and_then(|a| a.get(LB_ALGORITHM_ANNOTATION)) else {
        return Ok(None);
    };
    match value.as_str() {
        "random" => Ok(Some(LbAlgorithm::Random)),
        "maglev" => Ok(Some(LbAlgorithm::Maglev)),
        other => Err(FieldError::new(
            format!("metadata.annotations[{LB_ALGORITHM_ANNOTATION}]"),
            format!("unsupported value {other:?} (expected random or maglev)"),
        )),
    }
}

/// One port of a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePort {
    /// The port's name; empty only when it is the service's single port.
    pub name: String,
    /// The port clients connect to on the cluster IP.
    pub port: u16,
    /// The backends' port: a number, or the name of a container port of each backend pod.
    /// Defaulted to `port`, as the API server does.
    pub target_port: PortRef,
    /// TCP or UDP (defaulted to TCP).
    pub protocol: Protocol,
    /// The port every node serves it on (`nodePort`), for NodePort and LoadBalancer services;
    /// allocated in standalone mode when not given, set by the API server in Kubernetes mode.
    pub node_port: Option<u16>,
}

impl fmt::Display for ServicePort {
    /// `http 80/TCP -> 8080`, or `80/TCP -> 8080` for an unnamed port.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.name.is_empty() {
            write!(f, "{} ", self.name)?;
        }
        write!(f, "{}/{} -> {}", self.port, self.protocol, self.target_port)
    }
}

/// A service as the API server stores it, with what load balancing reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The namespace (defaulted to `default`).
    pub namespace: String,
    /// The name (a DNS-1035 label).
    pub name: String,
    /// `metadata.uid`: who this service is, as against a deleted one of the same name (its
    /// EndpointSlices name it as their owner). The API server sets it; a document applied
    /// without one has none.
    pub uid: Option<String>,
    /// Its address of its first family, or headless. Immutable once set.
    pub cluster_ip: ClusterIp,
    /// Its addresses, one per family of `ip_families`, `cluster_ip` first (`spec.clusterIPs`);
    /// empty for a headless service.
    pub cluster_ips: Vec<IpAddr>,
    /// Its families, as the API server defaults them: the first is `cluster_ip`'s.
    pub ip_families: Vec<IpFamily>,
    /// Its family policy, as the API server defaults it.
    pub ip_family_policy: IpFamilyPolicy,
    /// Its ports (none only for a headless service).
    pub ports: Vec<ServicePort>,
    /// The labels of the pods (of its namespace) that back it; empty = no selector, so its
    /// backends come from EndpointSlices alone.
    pub selector: BTreeMap<String, String>,
    /// `metadata.labels` (what a policy's `toServices.k8sServiceSelector` selects by).
    pub labels: BTreeMap<String, String>,
    /// `spec.internalTrafficPolicy`: which endpoints serve connections from this node's pods
    /// (`Local`: only this node's; none there, no backend: refused, never sent elsewhere).
    pub internal_traffic_policy: TrafficPolicy,
    /// The annotation `service.cilium.io/lb-algorithm`: how its frontends choose backends,
    /// instead of the agent's `bpf-lb-algorithm`.
    pub lb_algorithm: Option<LbAlgorithm>,
    /// `sessionAffinity: ClientIP`: a client's new connections go to the backend its last one
    /// chose if that was at most this many seconds ago
    /// (`sessionAffinityConfig.clientIP.timeoutSeconds`); `None` without affinity.
    pub session_affinity: Option<u32>,
    /// Its type, external IPs and external traffic policy.
    pub exposure: Exposure,
    /// `spec.externalName` of a `type: ExternalName` service: a DNS alias, which has no
    /// address and is not load-balanced (as kube-proxy).
    pub external_name: Option<String>,
    /// `spec.loadBalancerClass`: another load balancer implementation's service, whose
    /// ingress IPs are left to it.
    pub load_balancer_class: Option<String>,
    /// `spec.loadBalancerSourceRanges`: the clients its load balancer IPs admit.
    pub load_balancer_source_ranges: Vec<ipnet::IpNet>,
    /// `spec.trafficDistribution` (`PreferClose`: endpoints of the node's zone first).
    pub traffic_distribution: Option<String>,
}

impl Object for Service {
    const KIND: &'static str = "Service";
    fn key(&self) -> ObjectKey {
        ObjectKey::namespaced(&self.namespace, &self.name)
    }
}

impl Service {
    /// The address of its first family; `None` for a headless service.
    pub fn vip(&self) -> Option<IpAddr> {
        match self.cluster_ip {
            ClusterIp::Address(ip) => Some(ip),
            ClusterIp::Headless => None,
        }
    }

    /// Every address frontends listen on, one per family, the first family's first; none for
    /// a headless service.
    pub fn vips(&self) -> &[IpAddr] {
        &self.cluster_ips
    }

    /// Whether the service has a selector and a pod with `labels` matches it (every
    /// selector label present with its value), as the endpoints controller decides.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.selector.is_empty()
            && self
                .selector
                .iter()
                .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
    }

    /// Decodes a document's service; the address it asks for is decided by the caller.
    pub fn from_k8s(svc: k8s::Service) -> Result<ServiceDraft, FieldError> {
        let meta = svc.metadata;
        let name = meta
            .name
            .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
        dns1035_label("metadata.name", &name)?;
        let namespace = meta.namespace.unwrap_or_else(|| "default".to_string());
        validate::dns1123_label("metadata.namespace", &namespace)?;
        let labels = meta.labels.clone().unwrap_or_default();
        validate::labels("metadata.labels", &labels)?;
        let lb_algorithm = lb_algorithm(meta.annotations.as_ref())?;
        let uid = meta.uid.filter(|u| !u.is_empty());
        let spec = svc.spec.unwrap_or_default();
        let external_name = external_name(&spec)?;
        let exposure = exposure(&spec, svc.status.as_ref())?;
        check_type_dependent_fields(&spec)?;
        let load_balancer_source_ranges = source_ranges(&spec, exposure.type_)?;
        let internal_traffic_policy = internal_traffic_policy(&spec)?;
        let session_affinity = session_affinity(&spec)?;
        let (families, policy) = families(&spec)?;
        let requested = match external_name {
            // The API server gives an ExternalName service no cluster IP.
            Some(_) => RequestedIp::Headless,
            None => requested_ips(&spec)?,
        };
        if requested == RequestedIp::Headless && exposure.type_ != ServiceType::ClusterIp {
            return Err(FieldError::new(
                "spec.clusterIP",
                format!("may not be \"None\" for {} services", exposure.type_),
            ));
        }
        let ports = ports(spec.ports.unwrap_or_default())?;
        check_node_ports(&exposure, &ports)?;
        if ports.is_empty() && requested != RequestedIp::Headless {
            return Err(FieldError::new(
                "spec.ports",
                "at least one port is required (only a headless service may have none)",
            ));
        }
        let selector = spec.selector.unwrap_or_default();
        validate::labels("spec.selector", &selector)?;
        Ok(ServiceDraft {
            // The addresses and families are decided by `Resources` before it is stored.
            service: Service {
                namespace,
                name,
                uid,
                cluster_ip: ClusterIp::Headless,
                cluster_ips: Vec::new(),
                ip_families: Vec::new(),
                ip_family_policy: IpFamilyPolicy::SingleStack,
                ports,
                selector,
                labels,
                internal_traffic_policy,
                lb_algorithm,
                session_affinity,
                exposure,
                external_name,
                load_balancer_class: spec.load_balancer_class.filter(|c| !c.is_empty()),
                load_balancer_source_ranges,
                traffic_distribution: spec.traffic_distribution.filter(|t| !t.is_empty()),
            },
            requested,
            families,
            policy,
        })
    }
}

/// What a document asks for as the service's addresses (`clusterIP` and `clusterIPs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestedIp {
    /// Nothing: keep the current ones, or allocate them.
    Unset,
    /// `None`: headless.
    Headless,
    /// These addresses, one or two, of different families.
    Addresses(Vec<IpAddr>),
}

/// A decoded service whose addresses and families are not decided yet: `service.cluster_ip`,
/// `cluster_ips`, `ip_families` and `ip_family_policy` are meaningful only once
/// `cellium_resources::Resources` has settled `requested`, `families` and `policy`.
#[derive(Debug, Clone)]
pub struct ServiceDraft {
    /// The service, its addresses not decided yet.
    pub service: Service,
    /// The cluster IPs the document asks for.
    pub requested: RequestedIp,
    /// `spec.ipFamilies` as written (checked: known values, at most two, no repeat).
    pub families: Vec<IpFamily>,
    /// `spec.ipFamilyPolicy` as written.
    pub policy: Option<IpFamilyPolicy>,
}

fn not_supported(field: &str, what: &str) -> FieldError {
    FieldError::new(field, format!("not supported: {what}"))
}

/// `spec.externalName`: required for, and only for, `type: ExternalName`.
fn external_name(spec: &k8s::ServiceSpec) -> Result<Option<String>, FieldError> {
    let name = spec.external_name.clone().filter(|n| !n.is_empty());
    match (spec.type_.as_deref() == Some("ExternalName"), name) {
        (true, Some(name)) => {
            validate::dns1123_subdomain("spec.externalName", name.trim_end_matches('.'))?;
            Ok(Some(name))
        }
        (true, None) => Err(FieldError::new(
            "spec.externalName",
            "is required for ExternalName services",
        )),
        (false, Some(_)) => Err(FieldError::new(
            "spec.externalName",
            "may only be set when `type` is 'ExternalName'",
        )),
        (false, None) => Ok(None),
    }
}

/// The fields this node does not implement.
fn check_type_dependent_fields(spec: &k8s::ServiceSpec) -> Result<(), FieldError> {
    if spec
        .load_balancer_ip
        .as_deref()
        .is_some_and(|ip| !ip.is_empty())
    {
        return Err(not_supported(
            "spec.loadBalancerIP",
            "the node serves a load balancer's ingress IPs, but does not choose them",
        ));
    }
    Ok(())
}

/// `spec.loadBalancerSourceRanges`, each a CIDR (spaces trimmed, as the API server does).
fn source_ranges(
    spec: &k8s::ServiceSpec,
    type_: ServiceType,
) -> Result<Vec<ipnet::IpNet>, FieldError> {
    let ranges = spec.load_balancer_source_ranges.clone().unwrap_or_default();
    if !ranges.is_empty() && type_ != ServiceType::LoadBalancer {
        return Err(FieldError::new(
            "spec.loadBalancerSourceRanges",
            "may only be used when `type` is 'LoadBalancer'",
        ));
    }
    let mut out = Vec::with_capacity(ranges.len());
    for (i, range) in ranges.iter().enumerate() {
        let field = format!("spec.loadBalancerSourceRanges[{i}]");
        out.push(crate::policy_port::parse_cidr(&field, range.trim(), false)?);
    }
    Ok(out)
}

/// The longest `sessionAffinityConfig.clientIP.timeoutSeconds` the API server accepts (a day).
pub const MAX_AFFINITY_TIMEOUT: u32 = 86400;
/// Its default (3 hours), as the API server sets it.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

/// `spec.sessionAffinity` and `spec.sessionAffinityConfig`, checked as the API server does:
/// `Some(timeout in seconds)` for `ClientIP`, `None` for `None` (the default).
fn session_affinity(spec: &k8s::ServiceSpec) -> Result<Option<u32>, FieldError> {
    let config = spec.session_affinity_config.as_ref();
    match spec.session_affinity.as_deref() {
        None | Some("None") => match config {
            None => Ok(None),
            Some(_) => Err(FieldError::new(
                "spec.sessionAffinityConfig",
                "must not be set when sessionAffinity is None",
            )),
        },
        Some("ClientIP") => {
            let timeout = config
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let Some(t) = timeout else {
                return Ok(Some(DEFAULT_AFFINITY_TIMEOUT));
            };
            match u32::try_from(t) {
                Ok(t) if (1..=MAX_AFFINITY_TIMEOUT).contains(&t) => Ok(Some(t)),
                _ => Err(FieldError::new(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!("{t} is not between 1 and {MAX_AFFINITY_TIMEOUT}"),
                )),
            }
        }
        Some(other) => Err(FieldError::new(
            "spec.sessionAffinity",
            format!("unsupported value {other:?} (expected None or ClientIP)"),
        )),
    }
}

/// `spec.internalTrafficPolicy` (default `Cluster`).
fn internal_traffic_policy(spec: &k8s::ServiceSpec) -> Result<TrafficPolicy, FieldError> {
    match spec.internal_traffic_policy.as_deref() {
        None | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(FieldError::new(
            "spec.internalTrafficPolicy",
            format!("unsupported value {other:?} (expected Cluster or Local)"),
        )),
    }
}

/// `ipFamilies` and `ipFamilyPolicy` as written: known values, at most two families, none
/// twice. Their defaulting, which depends on the cluster's ranges, is `Resources`'.
fn families(
    spec: &k8s::ServiceSpec,
) -> Result<(Vec<IpFamily>, Option<IpFamilyPolicy>), FieldError> {
    let written = spec.ip_families.as_deref().unwrap_or_default();
    if written.len() > 2 {
        return Err(FieldError::new(
            "spec.ipFamilies",
            "at most two families may be given",
        ));
    }
    let mut families = Vec::with_capacity(written.len());
    for (i, family) in written.iter().enumerate() {
        let field = format!("spec.ipFamilies[{i}]");
        let family = match family.as_str() {
            "IPv4" => IpFamily::Ipv4,
            "IPv6" => IpFamily::Ipv6,
            other => {
                return Err(FieldError::new(
                    field,
                    format!("unsupported value {other:?} (expected IPv4 or IPv6)"),
                ));
            }
        };
        if families.contains(&family) {
            return Err(FieldError::new(
                field,
                format!("duplicate value \"{family}\""),
            ));
        }
        families.push(family);
    }
    let policy = match spec.ip_family_policy.as_deref() {
        None => None,
        Some("SingleStack") => Some(IpFamilyPolicy::SingleStack),
        Some("PreferDualStack") => Some(IpFamilyPolicy::PreferDualStack),
        Some("RequireDualStack") => Some(IpFamilyPolicy::RequireDualStack),
        Some(other) => {
            return Err(FieldError::new(
                "spec.ipFamilyPolicy",
                format!(
                    "unsupported value {other:?} (expected SingleStack, PreferDualStack or RequireDualStack)"
                ),
            ));
        }
    };
    Ok((families, policy))
}

/// `clusterIP` and `clusterIPs`, which must agree: `clusterIPs[0]` is `clusterIP`, a second
/// entry is of the other family, `None` stands alone.
fn requested_ips(spec: &k8s::ServiceSpec) -> Result<RequestedIp, FieldError> {
    let single = match spec.cluster_ip.as_deref() {
        None | Some("") => None,
        Some(text) => Some(parse_ip("spec.clusterIP", text)?),
    };
    let list = spec.cluster_ips.as_deref().unwrap_or_default();
    if list.len() > 2 {
        return Err(FieldError::new(
            "spec.clusterIPs",
            "at most two addresses may be given, one per family",
        ));
    }
    let listed = list
        .iter()
        .enumerate()
        .map(|(i, text)| parse_ip(&format!("spec.clusterIPs[{i}]"), text))
        .collect::<Result<Vec<_>, _>>()?;
    match (single, listed.first()) {
        (Some(a), Some(b)) if a != *b => {
            return Err(FieldError::new(
                "spec.clusterIPs[0]",
                format!("must be the same as spec.clusterIP ({})", ip_text(a)),
            ));
        }
        _ => {}
    }
    match listed.as_slice() {
        [Some(a), Some(b)] if IpFamily::of(*a) == IpFamily::of(*b) => {
            return Err(FieldError::new(
                "spec.clusterIPs[1]",
                format!("{b} is of the family of clusterIPs[0] ({a}): one address per family"),
            ));
        }
        [_, None] | [None, _] => {
            return Err(FieldError::new(
                "spec.clusterIPs",
                "\"None\" must be the only entry of a headless service",
            ));
        }
        _ => {}
    }
    Ok(match (single, listed.as_slice()) {
        (Some(None), _) | (_, [None]) => RequestedIp::Headless,
        (None, []) => RequestedIp::Unset,
        (Some(Some(ip)), []) => RequestedIp::Addresses(vec![ip]),
        (_, _) => RequestedIp::Addresses(listed.into_iter().flatten().collect()),
    })
}

fn ip_text(ip: Option<IpAddr>) -> String {
    ip.map_or_else(|| "None".into(), |a| a.to_string())
}

/// An address, or `None` for "None" (headless).
fn parse_ip(field: &str, text: &str) -> Result<Option<IpAddr>, FieldError> {
    if text == "None" {
        return Ok(None);
    }
    text.parse::<IpAddr>()
        .map(Some)
        .map_err(|_| FieldError::new(field, format!("{text:?} is not an IP address or \"None\"")))
}

fn ports(list: Vec<k8s::ServicePort>) -> Result<Vec<ServicePort>, FieldError> {
    let several = list.len() > 1;
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, p) in list.into_iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        let name = p.name.unwrap_or_default();
        if name.is_empty() && several {
            return Err(FieldError::new(
                format!("{field}.name"),
                "is required when a service has more than one port",
            ));
        }
        if !name.is_empty() {
            validate::dns1123_label(&format!("{field}.name"), &name)?;
            if !names.insert(name.clone()) {
                return Err(FieldError::new(
                    format!("{field}.name"),
                    format!("duplicate port name {name:?}"),
                ));
            }
        }
        let port = number(&format!("{field}.port"), i64::from(p.port))?;
        let protocol = match p.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(text) => text
                .parse()
                .map_err(|e| FieldError::new(format!("{field}.protocol"), e))?,
        };
        if !numbers.insert((port, protocol)) {
            return Err(FieldError::new(
                field,
                format!("duplicate port {port}/{protocol}"),
            ));
        }
        // The API server defaults an absent, zero or empty target port to the port.
        let target_port = match p.target_port {
            None => PortRef::Number(port),
            Some(IntOrString::Int(0)) => PortRef::Number(port),
            Some(IntOrString::String(s)) if s.is_empty() => PortRef::Number(port),
            Some(IntOrString::Int(n)) => {
                PortRef::Number(number(&format!("{field}.targetPort"), i64::from(n))?)
            }
            Some(IntOrString::String(s)) => {
                port_name(&format!("{field}.targetPort"), &s)?;
                PortRef::Name(s)
            }
        };
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => Some(number(&format!("{field}.nodePort"), i64::from(n))?),
        };
        out.push(ServicePort {
            name,
            port,
            target_port,
            protocol,
            node_port,
        });
    }
    Ok(out)
}

/// Node ports only where the type has them, and no number twice for one protocol.
fn check_node_ports(exposure: &Exposure, ports: &[ServicePort]) -> Result<(), FieldError> {
    let mut seen = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let Some(n) = p.node_port else { continue };
        let field = format!("spec.ports[{i}].nodePort");
        if exposure.type_ == ServiceType::ClusterIp {
            return Err(FieldError::new(
                field,
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
        if !seen.insert((n, p.protocol)) {
            return Err(FieldError::new(
                field,
                format!("duplicate value {n}/{}", p.protocol),
            ));
        }
    }
    Ok(())
}

/// A DNS-1035 label, as service names must be: a DNS-1123 label that starts with a letter
/// (a service name becomes a DNS name and an environment variable prefix).
fn dns1035_label(field: &str, value: &str) -> Result<(), FieldError> {
    let starts_with_letter = value.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if validate::dns1123_label(field, value).is_err() || !starts_with_letter {
        return Err(FieldError::new(
            field,
            format!(
                "{value:?} is not a DNS-1035 label (at most 63 characters: a-z, 0-9 and '-', starting with a letter and ending with a letter or digit)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<ServiceDraft, FieldError> {
        let yaml = format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {spec}");
        Service::from_k8s(serde_yaml::from_str(&yaml).unwrap())
    }

    fn err(spec: &str) -> FieldError {
        parse(spec).unwrap_err()
    }

    #[test]
    fn defaults_as_the_api_server() {
        let d = parse("{selector: {app: web}, ports: [{port: 80}]}").unwrap();
        assert_eq!(d.requested, RequestedIp::Unset);
        let s = d.service;
        assert_eq!(s.namespace, "default");
        assert_eq!(
            s.ports,
            vec![ServicePort {
                name: String::new(),
                port: 80,
                target_port: PortRef::Number(80),
                protocol: Protocol::Tcp,
                node_port: None,
            }]
        );
        assert!(s.selects(&BTreeMap::from([
            ("app".into(), "web".into()),
            ("tier".into(), "x".into())
        ])));
        assert!(!s.selects(&BTreeMap::from([("app".into(), "db".into())])));
        let d = parse("{ports: [{port: 53, targetPort: 0, protocol: UDP}]}").unwrap();
        assert_eq!(d.service.ports[0].target_port, PortRef::Number(53));
        assert!(
            !d.service.selects(&BTreeMap::new()),
            "no selector selects nothing"
        );
    }

    #[test]
    fn the_uid_is_kept_when_given() {
        assert_eq!(parse("{ports: [{port: 80}]}").unwrap().service.uid, None);
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: web, uid: 0b7e-1}\nspec: {ports: [{port: 80}]}";
        let d = Service::from_k8s(serde_yaml::from_str(yaml).unwrap()).unwrap();
        assert_eq!(d.service.uid.as_deref(), Some("0b7e-1"));
    }

    #[test]
    fn target_ports_by_number_or_name() {
        let d = parse(
            "{ports: [{name: http, port: 80, targetPort: web}, {name: metrics, port: 9090, targetPort: 9100}]}",
        )
        .unwrap();
        let targets: Vec<String> = d.service.ports.iter().map(ToString::to_string).collect();
        assert_eq!(
            targets,
            vec!["http 80/TCP -> web", "metrics 9090/TCP -> 9100"]
        );
        let e = err("{ports: [{port: 80, targetPort: Web_1}]}");
        assert_eq!(e.field, "spec.ports[0].targetPort");
        let e = err("{ports: [{port: 80, targetPort: 70000}]}");
        assert_eq!(e.field, "spec.ports[0].targetPort");
    }

    #[test]
    fn cluster_ips_given_or_headless() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let d = parse("{clusterIP: 10.96.0.10, ports: [{port: 53}]}").unwrap();
        assert_eq!(d.requested, RequestedIp::Addresses(vec![ip("10.96.0.10")]));
        let d = parse("{clusterIPs: [10.96.0.11], ports: [{port: 53}]}").unwrap();
        assert_eq!(d.requested, RequestedIp::Addresses(vec![ip("10.96.0.11")]));
        let d = parse(
            "{clusterIPs: ['fd00:96::a', 10.96.0.11], ipFamilies: [IPv6, IPv4], ipFamilyPolicy: PreferDualStack, ports: [{port: 53}]}",
        )
        .unwrap();
        assert_eq!(
            d.requested,
            RequestedIp::Addresses(vec![ip("fd00:96::a"), ip("10.96.0.11")])
        );
        assert_eq!(d.families, vec![IpFamily::Ipv6, IpFamily::Ipv4]);
        assert_eq!(d.policy, Some(IpFamilyPolicy::PreferDualStack));
        for headless in [
            "{clusterIP: None, selector: {app: db}}",
            "{clusterIPs: [None], selector: {app: db}}",
        ] {
            let d = parse(headless).unwrap();
            assert_eq!(d.requested, RequestedIp::Headless, "{headless}");
        }
        assert_eq!(ClusterIp::Headless.to_string(), "None");
        let cases = [
            (
                "{clusterIP: 10.96.0.10, clusterIPs: [10.96.0.11], ports: [{port: 1}]}",
                "spec.clusterIPs[0]",
                "must be the same as spec.clusterIP (10.96.0.10)",
            ),
            (
                "{clusterIPs: [10.96.0.10, 10.96.0.11], ports: [{port: 1}]}",
                "spec.clusterIPs[1]",
                "one address per family",
            ),
            (
                "{clusterIPs: [None, 'fd00::1'], ports: [{port: 1}]}",
                "spec.clusterIPs",
                "must be the only entry",
            ),
            (
                "{clusterIPs: [10.0.0.1, 'fd00::1', 10.0.0.2], ports: [{port: 1}]}",
                "spec.clusterIPs",
                "at most two",
            ),
            (
                "{clusterIP: 10.96.0.300, ports: [{port: 1}]}",
                "spec.clusterIP",
                "is not an IP address",
            ),
            (
                "{ipFamilies: [IPv4, IPv4], ports: [{port: 1}]}",
                "spec.ipFamilies[1]",
                "duplicate value",
            ),
            (
                "{ipFamilies: [IPv5], ports: [{port: 1}]}",
                "spec.ipFamilies[0]",
                "unsupported value",
            ),
            (
                "{ipFamilyPolicy: DualStack, ports: [{port: 1}]}",
                "spec.ipFamilyPolicy",
                "unsupported value",
            ),
        ];
        for (spec, field, reason) in cases {
            let e = err(spec);
            assert_eq!(e.field, field, "{spec}: {e:?}");
            assert!(e.reason.contains(reason), "{spec}: {e:?}");
        }
    }

    #[test]
    fn node_ports_external_ips_and_traffic_policies_are_read_and_checked_as_the_api_server_does() {
        let d = parse(
            "{type: LoadBalancer, externalTrafficPolicy: Local, externalIPs: [192.0.2.1, '2001:db8::1'], ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 53, protocol: UDP}]}",
        )
        .unwrap();
        let e = &d.service.exposure;
        assert_eq!(e.type_, ServiceType::LoadBalancer);
        assert_eq!(e.external_traffic_policy, crate::TrafficPolicy::Local);
        assert!(e.wants_health_check() && e.allocates_node_ports());
        assert_eq!(e.external_ips.len(), 2);
        assert_eq!(d.service.ports[0].node_port, Some(30080));
        assert_eq!(d.service.ports[1].node_port, None);
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {type: LoadBalancer, allocateLoadBalancerNodePorts: false, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 192.0.2.9}, {hostname: lb.example}]}}";
        let d = Service::from_k8s(serde_yaml::from_str(yaml).unwrap()).unwrap();
        assert!(!d.service.exposure.allocates_node_ports());
        assert_eq!(
            d.service.exposure.load_balancer_ingress,
            vec!["192.0.2.9".parse::<IpAddr>().unwrap()]
        );
        // A ClusterIP service with external IPs takes a traffic policy, not node ports.
        let d =
            parse("{externalIPs: [192.0.2.1], externalTrafficPolicy: Local, ports: [{port: 80}]}")
                .unwrap();
        assert_eq!(d.service.exposure.type_, ServiceType::ClusterIp);
        let cases = [
            (
                "{ports: [{port: 80, nodePort: 30080}]}",
                "spec.ports[0].nodePort",
                "may not be used when `type` is 'ClusterIP'",
            ),
            (
                "{externalTrafficPolicy: Local, ports: [{port: 80}]}",
                "spec.externalTrafficPolicy",
                "externally-accessible",
            ),
            (
                "{type: NodePort, externalTrafficPolicy: Nearby, ports: [{port: 80}]}",
                "spec.externalTrafficPolicy",
                "unsupported value",
            ),
            (
                "{type: NodePort, externalTrafficPolicy: Local, healthCheckNodePort: 30100, ports: [{port: 80}]}",
                "spec.healthCheckNodePort",
                "may only be set",
            ),
            (
                "{type: NodePort, allocateLoadBalancerNodePorts: true, ports: [{port: 80}]}",
                "spec.allocateLoadBalancerNodePorts",
                "LoadBalancer",
            ),
            (
                "{type: NodePort, clusterIP: None, ports: [{port: 80}]}",
                "spec.clusterIP",
                "None",
            ),
            (
                "{type: NodePort, ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30080}]}",
                "spec.ports[1].nodePort",
                "duplicate",
            ),
            (
                "{type: NodePort, ports: [{port: 80, nodePort: 70000}]}",
                "spec.ports[0].nodePort",
                "",
            ),
            (
                "{externalIPs: [127.0.0.1], ports: [{port: 80}]}",
                "spec.externalIPs[0]",
                "loopback",
            ),
            (
                "{externalIPs: [a.example], ports: [{port: 80}]}",
                "spec.externalIPs[0]",
                "not an IP address",
            ),
            (
                "{type: Bridge, ports: [{port: 80}]}",
                "spec.type",
                "unsupported value",
            ),
        ];
        for (spec, field, reason) in cases {
            let e = err(spec);
            assert_eq!(e.field, field, "{spec}: {e:?}");
            assert!(e.reason.contains(reason), "{spec}: {e:?}");
        }
        // The same number may serve both protocols of one service.
        parse("{type: NodePort, ports: [{name: a, port: 53, nodePort: 30053}, {name: b, port: 53, protocol: UDP, nodePort: 30053}]}")
            .unwrap();
    }

    #[test]
    fn what_the_node_cannot_do_is_not_supported_and_named() {
        let e = err("{loadBalancerIP: 192.0.2.1, ports: [{port: 80}]}");
        assert_eq!(e.field, "spec.loadBalancerIP", "{e:?}");
        assert!(e.reason.starts_with("not supported: "), "{e:?}");
        // What is merely the default is accepted.
        parse("{type: ClusterIP, sessionAffinity: None, ipFamilies: [IPv4], ipFamilyPolicy: PreferDualStack, internalTrafficPolicy: Cluster, publishNotReadyAddresses: true, ports: [{port: 80, appProtocol: http}]}").unwrap();
    }

    #[test]
    fn fields_real_clusters_hold_keep_the_service() {
        let svc = parse(
            "{type: LoadBalancer, loadBalancerClass: example.com/lb, loadBalancerSourceRanges: [' 192.0.2.0/24', '2001:db8::/32'], trafficDistribution: PreferClose, ports: [{name: a, port: 80}, {name: b, port: 9000, protocol: SCTP}]}",
        )
        .unwrap()
        .service;
        assert_eq!(svc.load_balancer_class.as_deref(), Some("example.com/lb"));
        let ranges: Vec<String> = svc
            .load_balancer_source_ranges
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(ranges, ["192.0.2.0/24", "2001:db8::/32"]);
        assert_eq!(svc.traffic_distribution.as_deref(), Some("PreferClose"));
        assert_eq!(svc.ports[1].protocol, Protocol::Sctp);

        let draft = parse("{type: ExternalName, externalName: db.example.com.}").unwrap();
        assert_eq!(draft.requested, RequestedIp::Headless);
        assert_eq!(
            draft.service.external_name.as_deref(),
            Some("db.example.com.")
        );

        let cases = [
            ("{type: ExternalName}", "spec.externalName", "required"),
            (
                "{externalName: a.example, ports: [{port: 80}]}",
                "spec.externalName",
                "ExternalName",
            ),
            (
                "{type: ExternalName, externalName: 'not a name'}",
                "spec.externalName",
                "",
            ),
            (
                "{loadBalancerSourceRanges: [10.0.0.0/8], ports: [{port: 80}]}",
                "spec.loadBalancerSourceRanges",
                "LoadBalancer",
            ),
            (
                "{type: LoadBalancer, loadBalancerSourceRanges: [nowhere], ports: [{port: 80}]}",
                "spec.loadBalancerSourceRanges[0]",
                "CIDR",
            ),
        ];
        for (spec, field, reason) in cases {
            let e = err(spec);
            assert_eq!(e.field, field, "{spec}: {e:?}");
            assert!(e.reason.contains(reason), "{spec}: {e:?}");
        }
    }

    #[test]
    fn internal_traffic_policy_is_read_and_checked() {
        let policy = |spec: &str| parse(spec).unwrap().service.internal_traffic_policy;
        assert_eq!(policy("{ports: [{port: 80}]}"), TrafficPolicy::Cluster);
        assert_eq!(
            policy("{internalTrafficPolicy: Cluster, ports: [{port: 80}]}"),
            TrafficPolicy::Cluster
        );
        assert_eq!(
            policy("{internalTrafficPolicy: Local, ports: [{port: 80}]}"),
            TrafficPolicy::Local
        );
        let e = err("{internalTrafficPolicy: Node, ports: [{port: 80}]}");
        assert_eq!(e.field, "spec.internalTrafficPolicy");
        assert!(e.reason.contains("expected Cluster or Local"), "{e:?}");
    }

    #[test]
    fn the_lb_algorithm_annotation_is_read_and_checked() {
        let doc = |value: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: web, annotations: {{service.cilium.io/lb-algorithm: {value}}}}}\nspec: {{ports: [{{port: 80}}]}}"
            )
        };
        let decode = |yaml: &str| Service::from_k8s(serde_yaml::from_str(yaml).unwrap());
        assert_eq!(
            decode(&doc("maglev")).unwrap().service.lb_algorithm,
            Some(LbAlgorithm::Maglev)
        );
        assert_eq!(
            decode(&doc("random")).unwrap().service.lb_algorithm,
            Some(LbAlgorithm::Random)
        );
        assert_eq!(
            parse("{ports: [{port: 80}]}").unwrap().service.lb_algorithm,
            None
        );
        let e = decode(&doc("roundrobin")).unwrap_err();
        assert_eq!(
            e.field,
            "metadata.annotations[service.cilium.io/lb-algorithm]"
        );
        assert!(e.reason.contains("random or maglev"), "{e:?}");
    }

    #[test]
    fn session_affinity_is_read_and_checked_as_the_api_server_does() {
        let affinity = |spec: &str| parse(spec).unwrap().service.session_affinity;
        assert_eq!(affinity("{ports: [{port: 80}]}"), None);
        assert_eq!(
            affinity("{sessionAffinity: None, ports: [{port: 80}]}"),
            None
        );
        assert_eq!(
            affinity("{sessionAffinity: ClientIP, ports: [{port: 80}]}"),
            Some(10800)
        );
        assert_eq!(
            affinity(
                "{sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 86400}}, ports: [{port: 80}]}"
            ),
            Some(86400)
        );
        assert_eq!(
            affinity(
                "{sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {}}, ports: [{port: 80}]}"
            ),
            Some(10800)
        );
        for t in [0, -1, 86401] {
            let e = err(&format!(
                "{{sessionAffinity: ClientIP, sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {t}}}}}, ports: [{{port: 80}}]}}"
            ));
            assert_eq!(
                e.field,
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
            );
            assert!(e.reason.contains("between 1 and 86400"), "{e:?}");
        }
        let e =
            err("{sessionAffinityConfig: {clientIP: {timeoutSeconds: 10}}, ports: [{port: 80}]}");
        assert_eq!(e.field, "spec.sessionAffinityConfig");
        let e = err("{sessionAffinity: Sticky, ports: [{port: 80}]}");
        assert_eq!(e.field, "spec.sessionAffinity");
    }

    #[test]
    fn ports_are_checked() {
        let e = err("{ports: []}");
        assert_eq!(e.field, "spec.ports");
        let e = err("{ports: [{port: 80}, {name: b, port: 81}]}");
        assert_eq!(
            (e.field.as_str(), e.reason.as_str()),
            (
                "spec.ports[0].name",
                "is required when a service has more than one port"
            )
        );
        let e = err("{ports: [{name: a, port: 80}, {name: a, port: 81}]}");
        assert_eq!(e.field, "spec.ports[1].name");
        let e = err("{ports: [{name: a, port: 80}, {name: b, port: 80}]}");
        assert_eq!(
            (e.field.as_str(), e.reason.as_str()),
            ("spec.ports[1]", "duplicate port 80/TCP")
        );
        parse("{ports: [{name: a, port: 53}, {name: b, port: 53, protocol: UDP}]}").unwrap();
        let e = err("{ports: [{port: 0}]}");
        assert_eq!(e.field, "spec.ports[0].port");
        let e = err("{ports: [{port: 80, protocol: ICMP}]}");
        assert_eq!(e.field, "spec.ports[0].protocol");
        let e = err("{type: Cluster, ports: [{port: 80}]}");
        assert!(e.reason.starts_with("unsupported value"), "{e:?}");
    }

    #[test]
    fn names_are_dns_1035_labels() {
        let yaml =
            "apiVersion: v1\nkind: Service\nmetadata: {name: 1web}\nspec: {ports: [{port: 80}]}";
        let e = Service::from_k8s(serde_yaml::from_str(yaml).unwrap()).unwrap_err();
        assert_eq!(e.field, "metadata.name");
        assert!(e.reason.contains("DNS-1035"), "{}", e.reason);
        let e = err("{selector: {'bad key!': x}, ports: [{port: 80}]}");
        assert_eq!(e.field, "spec.selector[bad key!]");
    }
}

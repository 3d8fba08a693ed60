//! How a service is reached from outside the cluster: its type (NodePort and LoadBalancer
//! services have node ports), its external IPs, its load balancer's ingress IPs and its
//! external traffic policy, checked as the API server checks them. The node ports themselves
//! are per port ([`ServicePort::node_port`](crate::ServicePort)); in standalone mode
//! `cellium_resources::Resources` allocates those not given.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as k8s;

use crate::policy_port::number;
use crate::validate::FieldError;

/// `spec.type`, of the types the node serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceType {
    /// Reached at its cluster IPs (and external IPs) only.
    #[default]
    ClusterIp,
    /// Also at every node address, on each port's node port.
    NodePort,
    /// A NodePort service whose load balancer's ingress IPs are served too.
    LoadBalancer,
}

impl fmt::Display for ServiceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServiceType::ClusterIp => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        })
    }
}

/// `spec.externalTrafficPolicy` and `spec.internalTrafficPolicy`: which endpoints serve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrafficPolicy {
    /// Any ready endpoint (from outside, the client's source is translated to the node's
    /// address).
    #[default]
    Cluster,
    /// This node's endpoints only (from outside, the client's address is kept).
    Local,
}

impl fmt::Display for TrafficPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        })
    }
}

/// What makes a service reachable from outside, as the API server stores it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exposure {
    /// `spec.type`.
    pub type_: ServiceType,
    /// `spec.externalTrafficPolicy`, defaulted to `Cluster` (meaningless, and `Cluster`, for a
    /// service reachable from inside only).
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort`: a LoadBalancer service with `externalTrafficPolicy: Local`
    /// has one (allocated when not given, unless in Kubernetes mode).
    pub health_check_node_port: Option<u16>,
    /// `spec.allocateLoadBalancerNodePorts` (LoadBalancer services; default true).
    pub allocate_load_balancer_node_ports: bool,
    /// `spec.externalIPs`: served like the cluster IP, at the service's ports.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of a LoadBalancer service: served likewise.
    pub load_balancer_ingress: Vec<IpAddr>,
}

impl Exposure {
    /// Whether the service's ports get node ports allocated when they have none.
    pub fn allocates_node_ports(&self) -> bool {
        match self.type_ {
            ServiceType::ClusterIp => false,
            ServiceType::NodePort => true,
            ServiceType::LoadBalancer => self.allocate_load_balancer_node_ports,
        }
    }

    /// Whether anything outside the cluster may reach it (the API server's
    /// `ExternallyAccessible`): node ports, or external IPs.
    pub fn externally_accessible(&self) -> bool {
        self.type_ != ServiceType::ClusterIp || !self.external_ips.is_empty()
    }

    /// Whether it wants a health check node port: LoadBalancer with a Local policy.
    pub fn wants_health_check(&self) -> bool {
        self.type_ == ServiceType::LoadBalancer
            && self.external_traffic_policy == TrafficPolicy::Local
    }
}

/// Reads and checks the fields of `spec` (and `status`) that make a service reachable from
/// outside. The load balancer fields the node cannot honour are the caller's to refuse.
pub fn exposure(
    spec: &k8s::ServiceSpec,
    status: Option<&k8s::ServiceStatus>,
) -> Result<Exposure, FieldError> {
    let type_ = match spec.type_.as_deref() {
        // An ExternalName service is reached by its DNS alias only: headless, as the caller
        // decodes it.
        None | Some("ClusterIP") | Some("ExternalName") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some(other) => {
            return Err(FieldError::new(
                "spec.type",
                format!(
                    "unsupported value {other:?} (expected ClusterIP, NodePort, LoadBalancer or ExternalName)"
                ),
            ));
        }
    };
    let external_ips = addresses(
        "spec.externalIPs",
        spec.external_ips.iter().flatten().map(String::as_str),
    )?;
    let mut out = Exposure {
        type_,
        external_ips,
        allocate_load_balancer_node_ports: true,
        ..Exposure::default()
    };
    if let Some(allocate) = spec.allocate_load_balancer_node_ports {
        if type_ != ServiceType::LoadBalancer {
            return Err(FieldError::new(
                "spec.allocateLoadBalancerNodePorts",
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }
        out.allocate_load_balancer_node_ports = allocate;
    }
    out.external_traffic_policy = match spec.external_traffic_policy.as_deref() {
        None | Some("") => TrafficPolicy::Cluster,
        Some(_) if !out.externally_accessible() => {
            return Err(FieldError::new(
                "spec.externalTrafficPolicy",
                "may only be set for externally-accessible services (NodePort, LoadBalancer, or with externalIPs)",
            ));
        }
        Some("Cluster") => TrafficPolicy::Cluster,
        Some("Local") => TrafficPolicy::Local,
        Some(other) => {
            return Err(FieldError::new(
                "spec.externalTrafficPolicy",
                format!("unsupported value {other:?} (expected Cluster or Local)"),
            ));
        }
    };
    if let Some(port) = spec.health_check_node_port.filter(|p| *p != 0) {
        if !out.wants_health_check() {
            return Err(FieldError::new(
                "spec.healthCheckNodePort",
                "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
            ));
        }
        out.health_check_node_port = Some(number("spec.healthCheckNodePort", i64::from(port))?);
    }
    if type_ == ServiceType::LoadBalancer {
        let ingress = status
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        out.load_balancer_ingress = ingress_ips(ingress.map(Vec::as_slice).unwrap_or_default())?;
    }
    Ok(out)
}

/// The addresses of a list of texts, each a unicast address a client can send to.
fn addresses<'a>(
    field: &str,
    texts: impl Iterator<Item = &'a str>,
) -> Result<Vec<IpAddr>, FieldError> {
    let mut out = Vec::new();
    for (i, text) in texts.enumerate() {
        let field = format!("{field}[{i}]");
        let ip: IpAddr = text
            .parse()
            .map_err(|_| FieldError::new(&field, format!("{text:?} is not an IP address")))?;
        if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || link_local(ip) {
            return Err(FieldError::new(
                &field,
                format!("{ip} may not be unspecified, loopback, multicast or link-local"),
            ));
        }
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

fn ingress_ips(ingress: &[k8s::LoadBalancerIngress]) -> Result<Vec<IpAddr>, FieldError> {
    let mut out = Vec::new();
    for (i, entry) in ingress.iter().enumerate() {
        // An ingress known by hostname only has nothing the node could serve.
        if let Some(text) = entry.ip.as_deref().filter(|t| !t.is_empty()) {
            let field = format!("status.loadBalancer.ingress[{i}].ip");
            let found = addresses(&field, std::iter::once(text))
                .map_err(|e| FieldError::new(&field, e.reason))?;
            for ip in found {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
    }
    Ok(out)
}

fn link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

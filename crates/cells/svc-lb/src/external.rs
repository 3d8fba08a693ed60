//! The frontends a service has besides its cluster IPs, reached from outside the cluster as
//! well as from pods:
//!
//! - **NodePort**: each port's node port on every address of this node (of the service's
//!   families), as Cilium keys NodePort frontends by node address. One entry per address,
//!   rather than a wildcard "any node address" key, keeps the datapath's lookup the same
//!   exact-match lookup as for cluster IPs, and makes a node port on an address the node
//!   does not hold simply absent.
//! - **ExternalIP**: each of `spec.externalIPs` at each port of its family.
//! - **LoadBalancer**: each `status.loadBalancer.ingress[].ip` at each port of its family.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use cellium_datapath_bpf::Frontend;
use cellium_resources::{IpFamily, Service, ServicePort, ServiceType};

use crate::desired::{Plan, datapath_protocol};

/// What kind of frontend a plan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    /// A cluster IP.
    ClusterIp,
    /// A node address and node port.
    NodePort,
    /// An address of `spec.externalIPs`.
    ExternalIp,
    /// An ingress IP of a LoadBalancer service.
    LoadBalancer,
    /// A node address and a pod's host port ([`crate::host_ports`]).
    HostPort,
}

impl fmt::Display for FrontendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrontendKind::ClusterIp => "ClusterIP",
            FrontendKind::NodePort => "NodePort",
            FrontendKind::ExternalIp => "ExternalIP",
            FrontendKind::LoadBalancer => "LoadBalancer",
            FrontendKind::HostPort => "HostPort",
        })
    }
}

/// The frontends of `svc` besides its cluster IPs, with the port each serves; none for a
/// headless service.
pub fn frontends<'a>(
    svc: &'a Service,
    node_addresses: &[IpAddr],
) -> Vec<(FrontendKind, Frontend, &'a ServicePort)> {
    let families: Vec<IpFamily> = svc.vips().iter().map(|ip| IpFamily::of(*ip)).collect();
    let served = |ip: &&IpAddr| families.contains(&IpFamily::of(**ip));
    let mut out = Vec::new();
    let at = |kind, ip: IpAddr, number: u16, port: &'a ServicePort| {
        (
            kind,
            Frontend {
                vip: ip,
                port: number,
                protocol: datapath_protocol(port.protocol),
            },
            port,
        )
    };
    for port in &svc.ports {
        if let Some(node_port) = port.node_port {
            for ip in node_addresses.iter().filter(served) {
                out.push(at(FrontendKind::NodePort, *ip, node_port, port));
            }
        }
        for ip in svc.exposure.external_ips.iter().filter(served) {
            out.push(at(FrontendKind::ExternalIp, *ip, port.port, port));
        }
        // A service of another load balancer implementation (`loadBalancerClass`) leaves
        // its ingress IPs to it.
        if svc.exposure.type_ == ServiceType::LoadBalancer && svc.load_balancer_class.is_none() {
            for ip in svc.exposure.load_balancer_ingress.iter().filter(served) {
                out.push(at(FrontendKind::LoadBalancer, *ip, port.port, port));
            }
        }
    }
    out
}

/// One frontend, one owner: an external or ingress IP and port that two services both name
/// (or one that is also a cluster IP or node address and port) is programmed for the first
/// plan only, cluster IPs first, then services' other frontends, then pods' host ports (a
/// pod never takes a service's address and port, whatever their names), by name within
/// each; the others carry an error naming the owner, and are reported as not programmed,
/// rather than overwriting each other at every pass. A host port refused so is the pod's
/// matter, not the node's: reported, not Degraded.
pub(crate) fn refuse_shared(plans: &mut [Plan]) {
    let mut owner: BTreeMap<Frontend, (u8, String)> = BTreeMap::new();
    for p in plans.iter() {
        let claim = (rank(p.kind), holder(p));
        owner
            .entry(p.frontend)
            .and_modify(|held| *held = held.clone().min(claim.clone()))
            .or_insert(claim);
    }
    for p in plans.iter_mut() {
        let (rank_of_first, first) = &owner[&p.frontend];
        if *first != holder(p) && p.error.is_none() {
            p.error = Some(format!("the frontend is {first}'s"));
            if p.kind == FrontendKind::HostPort {
                p.unsupported = true;
                p.host_port_refusal = Some(if *rank_of_first < rank(FrontendKind::HostPort) {
                    crate::host_ports::Refusal::TakenByService
                } else {
                    crate::host_ports::Refusal::TakenByPod
                });
            }
        }
    }
}

/// Which plans take a shared frontend first (the lowest).
fn rank(kind: FrontendKind) -> u8 {
    match kind {
        FrontendKind::ClusterIp => 0,
        FrontendKind::HostPort => 2,
        _ => 1,
    }
}

/// `service shop/web`, `pod shop/web-0`, or `endpoint 7 (container 3f2a9c1b0d4e)` (the host
/// ports of a runtime that names no pod), as the error names the owner.
fn holder(p: &Plan) -> String {
    if p.kind != FrontendKind::HostPort {
        format!("service {}", p.service)
    } else if p.service.namespace.is_empty() {
        p.service.name.clone()
    } else {
        format!("pod {}", p.service)
    }
}

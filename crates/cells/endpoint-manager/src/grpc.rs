//! The `cellium.v1.Endpoints` service: what the CNI plugin and `cellium endpoint` call.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use cellium_api::v1::endpoints_server::{Endpoints as EndpointsApi, EndpointsServer};
use cellium_api::v1::{
    self, CheckEndpointRequest, CheckEndpointResponse, CreateEndpointRequest,
    DeleteEndpointRequest, DeleteEndpointResponse, EndpointPeer, EndpointState, GcRequest,
    GcResponse, GetEndpointRequest, IpConfig, ListEndpointsRequest, ListEndpointsResponse,
    PortMapping, Route,
};
use cellium_api::{ApiService, Peer, Reason, refusal};
use cellium_resources::{HostPort, Protocol};
use tonic::{Request, Response, Status};

use crate::endpoint::{Endpoint, PodRef, State, mac_text};
use crate::error::{Error, chain};
use crate::manager::EndpointManager;
use crate::plumbing::PodNetns;
use crate::request::CreateRequest;

/// Serves the endpoint manager over gRPC.
#[derive(Debug, Clone)]
pub struct EndpointService(Arc<EndpointManager>);

impl EndpointService {
    /// The service as the API server mounts it.
    pub fn api(manager: Arc<EndpointManager>) -> Arc<ApiService> {
        Arc::new(ApiService::new(EndpointsServer::new(EndpointService(
            manager,
        ))))
    }
}

#[tonic::async_trait]
impl EndpointsApi for EndpointService {
    async fn create(
        &self,
        req: Request<CreateEndpointRequest>,
    ) -> Result<Response<v1::Endpoint>, Status> {
        let passed = passed_netns(&req);
        let req = create_request(req.into_inner(), passed)?;
        let ep = self.0.create(req).await.map_err(status)?;
        Ok(Response::new(view(&self.0, &ep, false)))
    }

    async fn delete(
        &self,
        req: Request<DeleteEndpointRequest>,
    ) -> Result<Response<DeleteEndpointResponse>, Status> {
        let req = req.into_inner();
        let existed = self
            .0
            .delete(&req.container_id, &req.ifname)
            .await
            .map_err(status)?;
        Ok(Response::new(DeleteEndpointResponse { existed }))
    }

    async fn check(
        &self,
        req: Request<CheckEndpointRequest>,
    ) -> Result<Response<CheckEndpointResponse>, Status> {
        let passed = passed_netns(&req);
        let req = req.into_inner();
        let netns = pod_netns(&req.container_id, &req.netns, passed).map_err(status)?;
        let ep = self
            .0
            .check(&req.container_id, &req.ifname, &netns)
            .await
            .map_err(status)?;
        Ok(Response::new(CheckEndpointResponse {
            endpoint: Some(view(&self.0, &ep, false)),
        }))
    }

    async fn get(
        &self,
        req: Request<GetEndpointRequest>,
    ) -> Result<Response<v1::Endpoint>, Status> {
        let id = req.into_inner().id;
        u16::try_from(id)
            .ok()
            .and_then(|id| self.0.get(id))
            .map(|ep| Response::new(view(&self.0, &ep, true)))
            .ok_or_else(|| refusal(Reason::EndpointNotFound, format!("no endpoint {id}")))
    }

    async fn list(
        &self,
        _: Request<ListEndpointsRequest>,
    ) -> Result<Response<ListEndpointsResponse>, Status> {
        let endpoints = self
            .0
            .snapshot()
            .iter()
            .map(|ep| view(&self.0, ep, false))
            .collect();
        Ok(Response::new(ListEndpointsResponse { endpoints }))
    }

    async fn gc(&self, req: Request<GcRequest>) -> Result<Response<GcResponse>, Status> {
        let req = req.into_inner();
        let valid: HashSet<(String, String)> = req
            .valid
            .into_iter()
            .map(|a| (a.container_id, a.ifname))
            .collect();
        let removed = self.0.gc(&req.network, &valid).await.map_err(status)?;
        Ok(Response::new(GcResponse {
            removed: removed.into_iter().map(u32::from).collect(),
        }))
    }
}

/// The network namespace the caller passed when it connected, if it did.
fn passed_netns<T>(req: &Request<T>) -> Option<Arc<OwnedFd>> {
    Peer::of(req).and_then(|p| p.netns.clone())
}

/// The pod's namespace of a request that names `path`: the one passed, once checked.
fn pod_netns(
    container_id: &str,
    path: &str,
    passed: Option<Arc<OwnedFd>>,
) -> Result<PodNetns, Error> {
    if path.is_empty() {
        return Err(Error::Invalid {
            field: "netns",
            reason: "is empty: name the pod's network namespace (CNI_NETNS)".into(),
        });
    }
    let fd = passed.ok_or_else(|| Error::NetnsNotPassed(PathBuf::from(path)))?;
    PodNetns::new(PathBuf::from(path), fd).map_err(|source| Error::Netns {
        container_id: container_id.to_string(),
        source,
    })
}

fn create_request(
    req: CreateEndpointRequest,
    passed: Option<Arc<OwnedFd>>,
) -> Result<CreateRequest, Status> {
    let requested_ips = req
        .requested_ips
        .iter()
        .map(|s| {
            // The runtime may send an address with its prefix (the `ips` capability does).
            let ip = s.split('/').next().unwrap_or_default();
            ip.parse::<IpAddr>().map_err(|_| {
                refusal(
                    Reason::InvalidRequest,
                    format!("invalid requested_ips: {s:?} is not an IP address"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Runtimes that name only the pod (podman) mean the default namespace.
    let pod = (!req.pod_name.is_empty()).then(|| PodRef {
        namespace: if req.pod_namespace.is_empty() {
            "default".into()
        } else {
            req.pod_namespace.clone()
        },
        name: req.pod_name.clone(),
    });
    let port_mappings = req
        .port_mappings
        .iter()
        .enumerate()
        .map(|(i, m)| port_mapping(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let netns = pod_netns(&req.container_id, &req.netns, passed).map_err(status)?;
    Ok(CreateRequest {
        container_id: req.container_id,
        netns,
        ifname: req.ifname,
        pod,
        requested_ips,
        network: req.network,
        mtu: (req.mtu != 0).then_some(req.mtu),
        port_mappings,
    })
}

/// The `i`th port mapping of a Create, checked as the plugin checks `portMappings` (the API
/// has other clients): ports 1-65535, TCP, UDP or SCTP in any case (empty: TCP), `host_ip`
/// empty or an address (unspecified: every node address).
fn port_mapping(i: usize, m: &PortMapping) -> Result<HostPort, Status> {
    let invalid = |what: String| {
        refusal(
            Reason::InvalidRequest,
            format!("invalid port_mappings[{i}]: {what}"),
        )
    };
    let port = |name: &str, n: u32| {
        u16::try_from(n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(format!("{name} {n} is not a port number (1-65535)")))
    };
    let protocol = match m.protocol.to_ascii_uppercase().as_str() {
        "" => Protocol::Tcp,
        p => p.parse::<Protocol>().map_err(invalid)?,
    };
    let host_ip = match m.host_ip.as_str() {
        "" => None,
        ip => {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| invalid(format!("host_ip {ip:?} is not an IP address")))?;
            (!ip.is_unspecified()).then_some(ip)
        }
    };
    Ok(HostPort {
        host_ip,
        host_port: port("host_port", m.host_port)?,
        container_port: port("container_port", m.container_port)?,
        protocol,
    })
}

/// A published port as the API sends it.
fn port_mapping_proto(m: &HostPort) -> PortMapping {
    PortMapping {
        host_port: u32::from(m.host_port),
        container_port: u32::from(m.container_port),
        protocol: m.protocol.to_string(),
        host_ip: m.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
    }
}

/// The refusal the API's contract gives `e`: its reason (which sets the gRPC code) and the
/// whole chain as the message.
fn status(e: Error) -> Status {
    refusal(e.reason(), chain(&e))
}

/// The endpoint as the API returns it, with what its policy allows and denies when
/// `with_peers` (the peers' labels cost a lookup each, so only `Get` asks for them).
pub fn view(manager: &EndpointManager, ep: &Endpoint, with_peers: bool) -> v1::Endpoint {
    let mut out = to_proto(ep);
    let Some(enforced) = manager.enforced_of(ep.id) else {
        return out;
    };
    out.ingress_enforced = enforced.enforcement.ingress;
    out.egress_enforced = enforced.enforcement.egress;
    if let Some(overflow) = enforced.overflow {
        out.status_message = overflow.to_string();
    }
    let Some(policy) = &enforced.policy else {
        return out;
    };
    out.policy_revision = policy.revision;
    if with_peers {
        out.peers = policy
            .peers()
            .iter()
            .map(|p| EndpointPeer {
                direction: p.direction.to_string(),
                verdict: match p.verdict {
                    cellium_datapath_bpf::Verdict::Allow => "allow",
                    cellium_datapath_bpf::Verdict::Deny => "deny",
                    cellium_datapath_bpf::Verdict::AuditDeny => "audit-deny",
                }
                .to_string(),
                identity: p.identity,
                labels: manager.identity_labels(p.identity),
                ports: p.ports.clone(),
            })
            .collect();
    }
    out
}

/// The endpoint's record as the API returns it (no policy state).
pub fn to_proto(ep: &Endpoint) -> v1::Endpoint {
    let addresses = ep
        .addresses
        .iter()
        .map(|a| IpConfig {
            address: format!("{}/{}", a.ip, if a.ip.is_ipv4() { 32 } else { 128 }),
            gateway: a.gateway.to_string(),
        })
        .collect();
    let routes = ep
        .addresses
        .iter()
        .map(|a| Route {
            dst: if a.ip.is_ipv4() { "0.0.0.0/0" } else { "::/0" }.into(),
            gateway: a.gateway.to_string(),
        })
        .collect();
    let (state, message) = match ep.state {
        State::Creating => (EndpointState::Pending, "being created"),
        State::Ready => (EndpointState::Ready, ""),
        State::Deleting => (EndpointState::Deleting, "being deleted"),
    };
    v1::Endpoint {
        id: u32::from(ep.id),
        container_id: ep.container_id.clone(),
        ifname: ep.ifname.clone(),
        netns: ep.netns.display().to_string(),
        pod_namespace: ep
            .pod
            .as_ref()
            .map(|p| p.namespace.clone())
            .unwrap_or_default(),
        pod_name: ep.pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
        network: ep.network.clone(),
        addresses,
        routes,
        host_ifname: ep.host_ifname.clone(),
        host_mac: mac_text(&ep.host_mac),
        pod_mac: mac_text(&ep.pod_mac),
        mtu: ep.mtu,
        state: state as i32,
        status_message: message.into(),
        identity: ep.identity,
        labels: ep
            .labels
            .iter()
            .map(|l| (format!("{}:{}", l.source, l.key), l.value.clone()))
            .collect(),
        policy_revision: 0,
        created_unix_ms: ep.created_unix_ms,
        ingress_enforced: false,
        egress_enforced: false,
        peers: Vec::new(),
        port_mappings: ep.port_mappings.iter().map(port_mapping_proto).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(host_port: u32, container_port: u32, protocol: &str, host_ip: &str) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            protocol: protocol.into(),
            host_ip: host_ip.into(),
        }
    }

    #[test]
    fn port_mappings_are_checked_and_normalised() {
        let m = port_mapping(0, &mapping(8080, 80, "", "")).unwrap();
        assert_eq!(
            (m.host_port, m.container_port, m.protocol, m.host_ip),
            (8080, 80, Protocol::Tcp, None)
        );
        let m = port_mapping(0, &mapping(53, 53, "udp", "192.168.1.10")).unwrap();
        assert_eq!(m.protocol, Protocol::Udp);
        assert_eq!(m.host_ip, Some("192.168.1.10".parse().unwrap()));
        assert_eq!(
            port_mapping(0, &mapping(1, 1, "Sctp", "::"))
                .unwrap()
                .host_ip,
            None
        );
        assert_eq!(
            port_mapping_proto(&m),
            mapping(53, 53, "UDP", "192.168.1.10")
        );
        for (bad, needle) in [
            (mapping(0, 80, "tcp", ""), "host_port 0"),
            (mapping(8080, 70000, "tcp", ""), "container_port 70000"),
            (mapping(8080, 80, "icmp", ""), "ICMP"),
            (
                mapping(8080, 80, "tcp", "node-1"),
                "\"node-1\" is not an IP address",
            ),
        ] {
            let err = port_mapping(2, &bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
            assert!(err.message().contains("port_mappings[2]"), "{err:?}");
            assert!(err.message().contains(needle), "{needle}: {err:?}");
        }
    }
}

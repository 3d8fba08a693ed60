//! Host ports served by the datapath, as Cilium's `enable-host-port` serves pods' `hostPort`s:
//! each is a frontend reached from outside like a node port (kind `HostPort`), with the
//! endpoint as its only backend, so that no `portmap` plugin is needed.
//!
//! Where an endpoint's host ports come from, one source per endpoint, never both:
//! - the `portMappings` its runtime passed with the CNI ADD (podman's `-p`, nerdctl's `-p`,
//!   and the kubelet's hostPorts through containerd or CRI-O), kept on the endpoint's record,
//!   when it passed any ([`BackendsFrom::PortMappings`]);
//! - else the `hostPort`s of its Pod object, when the agent knows one
//!   ([`BackendsFrom::Pod`]).
//!
//! In Kubernetes a runtime's mappings *are* the Pod's hostPorts (the kubelet derives them from
//! the same container ports), so taking both would double every frontend. The runtime's win:
//! they are what the sandbox was set up with, they need no Pod object (a runtime outside
//! Kubernetes has none), and they survive a restart with the endpoint's record. The Pod's
//! remain the source for endpoints whose runtime passed none (a conflist without the
//! capability, endpoints made before mappings were recorded, `cellium apply` of Pods
//! standalone).
//!
//! - Only this node's endpoints, once `Ready`: the frontend exists while the datapath serves
//!   the endpoint, and goes with it (CNI DEL).
//! - Without `hostIP` (or with `0.0.0.0` / `::`), on every address of this node of the
//!   endpoint's families; with one, on that address only, which must be this node's: a pod
//!   must not take another host's address and port (a `hostIP` of `8.8.8.8` and port 53 would
//!   otherwise capture every pod's DNS to it on this node), so such a port is left out and
//!   reported. `portmap` likewise matches only the node's local addresses.
//! - The client's address is kept (the backend is local, as `externalTrafficPolicy: Local`),
//!   so the pod's ingress policy judges the real client.
//! - A service's frontend always keeps its address and port against a host port; of two
//!   endpoints naming one, the first by name keeps it; the others are reported, not Degraded
//!   ([`crate::external::refuse_shared`]). Every refusal carries a [`Refusal`], which
//!   `cellium_host_ports_refused` counts.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use cellium_datapath_bpf::{Backend, Frontend};
use cellium_resources::{HostPort, IpFamily, ObjectKey, PortRef, Protocol, ServicePort};

use crate::desired::{
    BackendsFrom, Inputs, LocalEndpoint, Plan, PlannedBackend, datapath_protocol,
};
use crate::external::FrontendKind;

/// Why a host port frontend is not served: the label `reason` of
/// `cellium_host_ports_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// Its `hostIP` is not an address of this node.
    ForeignHostIp,
    /// A service's frontend (cluster IP, node port, external or LB IP) has that address and
    /// port.
    TakenByService,
    /// Another endpoint's host port, first by name, has it.
    TakenByPod,
    /// Another host port of the same endpoint has it already (a wildcard and a `hostIP`
    /// mapping of one port, say).
    Duplicate,
    /// SCTP: the datapath balances TCP and UDP.
    Protocol,
    /// The endpoint has no address of the `hostIP`'s family.
    Family,
}

impl Refusal {
    /// Every reason, in the order the metric lists them.
    pub const ALL: [Refusal; 6] = [
        Refusal::ForeignHostIp,
        Refusal::TakenByService,
        Refusal::TakenByPod,
        Refusal::Duplicate,
        Refusal::Protocol,
        Refusal::Family,
    ];

    /// The metric's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ForeignHostIp => "foreign-host-ip",
            Refusal::TakenByService => "taken-by-service",
            Refusal::TakenByPod => "taken-by-pod",
            Refusal::Duplicate => "duplicate",
            Refusal::Protocol => "unsupported-protocol",
            Refusal::Family => "no-address-of-family",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many host port plans are refused, by reason (every reason listed, zeros included).
pub fn refused(plans: &[Plan]) -> Vec<(Refusal, usize)> {
    Refusal::ALL
        .iter()
        .map(|r| {
            let n = plans
                .iter()
                .filter(|p| p.host_port_refusal == Some(*r))
                .count();
            (*r, n)
        })
        .collect()
}

/// Where an endpoint's host ports come from (see the module): its owner's key, the source and
/// the ports; `None` when it publishes none.
fn source<'a>(
    ep: &'a LocalEndpoint,
    inputs: &'a Inputs,
) -> Option<(ObjectKey, BackendsFrom, &'a [HostPort])> {
    if !ep.port_mappings.is_empty() {
        // A runtime that names no pod (nerdctl, a bare CNI call): the endpoint names itself.
        let owner = ep
            .pod
            .clone()
            .unwrap_or_else(|| ObjectKey::cluster(&ep.name));
        return Some((owner, BackendsFrom::PortMappings, &ep.port_mappings));
    }
    let key = ep.pod.as_ref()?;
    let pod = inputs.pods.get(key)?;
    Some((key.clone(), BackendsFrom::Pod, &pod.host_ports))
}

/// The host port frontends of this node's ready endpoints, ordered by endpoint, port and
/// address.
pub fn plans(inputs: &Inputs) -> Vec<Plan> {
    let mut out = Vec::new();
    if !inputs.host_ports {
        return out;
    }
    for ep in inputs.endpoints.iter().filter(|e| e.ready) {
        let Some((owner, from, host_ports)) = source(ep, inputs) else {
            continue;
        };
        let mut taken = BTreeSet::new();
        for host in host_ports {
            for vip in addresses(host, ep, &inputs.node_addresses) {
                let mut plan = plan(&owner, from, ep, host, vip, inputs);
                if !taken.insert(plan.frontend) && plan.error.is_none() {
                    plan.error = Some(
                        "another host port of the same endpoint publishes this address and port"
                            .into(),
                    );
                    plan.unsupported = true;
                    plan.host_port_refusal = Some(Refusal::Duplicate);
                }
                out.push(plan);
            }
        }
    }
    out
}

/// The addresses a host port listens on: its `hostIP`, else each node address of a family
/// the endpoint has an address of.
fn addresses(host: &HostPort, ep: &LocalEndpoint, node_addresses: &[IpAddr]) -> Vec<IpAddr> {
    match host.host_ip.filter(|ip| !ip.is_unspecified()) {
        Some(ip) => vec![ip],
        None => node_addresses
            .iter()
            .filter(|n| {
                ep.addresses
                    .iter()
                    .any(|a| IpFamily::of(*a) == IpFamily::of(**n))
            })
            .copied()
            .collect(),
    }
}

fn plan(
    owner: &ObjectKey,
    from: BackendsFrom,
    ep: &LocalEndpoint,
    host: &HostPort,
    vip: IpAddr,
    inputs: &Inputs,
) -> Plan {
    let protocol = datapath_protocol(host.protocol);
    let backends: Vec<PlannedBackend> = ep
        .addresses
        .iter()
        .filter(|a| IpFamily::of(**a) == IpFamily::of(vip))
        .take(1)
        .map(|addr| PlannedBackend {
            backend: Backend {
                addr: *addr,
                port: host.container_port,
                protocol,
            },
            source: ep.name.clone(),
        })
        .collect();
    let refusal = if !inputs.node_addresses.contains(&vip) {
        Some((
            Refusal::ForeignHostIp,
            format!("hostIP {vip} is not an address of this node"),
        ))
    } else if host.protocol == Protocol::Sctp {
        Some((
            Refusal::Protocol,
            "SCTP ports are not balanced (the datapath balances TCP and UDP)".to_string(),
        ))
    } else if backends.is_empty() {
        Some((
            Refusal::Family,
            format!("the pod has no address of {vip}'s family"),
        ))
    } else {
        None
    };
    let (host_port_refusal, error) = refusal.unzip();
    Plan {
        service: owner.clone(),
        port: ServicePort {
            name: String::new(),
            port: host.host_port,
            target_port: PortRef::Number(host.container_port),
            protocol: host.protocol,
            node_port: None,
        },
        frontend: Frontend {
            vip,
            port: host.host_port,
            protocol,
        },
        kind: FrontendKind::HostPort,
        local: true,
        from,
        backends,
        draining: Vec::new(),
        algorithm: inputs.lb_algorithm,
        session_affinity: None,
        source_ranges: None,
        // The pod asked for what this node does not serve: reported, not a fault of the node.
        unsupported: error.is_some(),
        error,
        host_port_refusal,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use cellium_resources::{Object, Pod, Resources};

    use super::*;

    fn pod(ports: &str) -> Arc<Pod> {
        let yaml = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{ name: shop }}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{ name: web, namespace: shop }}\nspec: {{ containers: [ {{ name: c, ports: {ports} }} ] }}"
        );
        let resources = Resources::new();
        resources.apply("pod.yaml", &yaml).unwrap();
        resources.pods.list().pop().unwrap()
    }

    fn inputs(pod: Arc<Pod>, addresses: &[&str], ready: bool) -> Inputs {
        Inputs {
            pods: BTreeMap::from([(pod.key(), pod)]),
            endpoints: vec![LocalEndpoint {
                name: "endpoint 7 (shop/web)".into(),
                pod: Some(ObjectKey::namespaced("shop", "web")),
                addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
                ready,
                port_mappings: Vec::new(),
            }],
            node_addresses: vec!["192.168.1.10".parse().unwrap(), "fd00::10".parse().unwrap()],
            host_ports: true,
            ..Inputs::default()
        }
    }

    fn described(plans: &[Plan]) -> Vec<String> {
        plans
            .iter()
            .map(|p| {
                let backends: Vec<String> = p
                    .backends
                    .iter()
                    .map(|b| {
                        format!(
                            "{}",
                            std::net::SocketAddr::new(b.backend.addr, b.backend.port)
                        )
                    })
                    .collect();
                format!(
                    "{} {} -> {} {}",
                    p.kind,
                    p.describe(),
                    backends.join(","),
                    p.error.as_deref().unwrap_or("ok")
                )
            })
            .collect()
    }

    #[test]
    fn a_host_port_listens_on_every_node_address_of_the_pods_families() {
        let web = pod(
            "[ { containerPort: 80, hostPort: 8080 }, { containerPort: 53, hostPort: 5353, protocol: UDP } ]",
        );
        let got = plans(&inputs(web.clone(), &["10.244.0.7"], true));
        assert_eq!(
            described(&got),
            [
                "HostPort shop/web (192.168.1.10:8080/TCP) -> 10.244.0.7:80 ok",
                "HostPort shop/web (192.168.1.10:5353/UDP) -> 10.244.0.7:53 ok",
            ]
        );
        assert!(got.iter().all(|p| p.local && !p.unsupported));
        let both = plans_of(web.clone(), &["10.244.0.7", "fd00:244::7"]);
        assert_eq!(both.len(), 4, "{both:?}");
        let not_ready = inputs(
            pod("[ { containerPort: 80, hostPort: 8080 } ]"),
            &["10.244.0.7"],
            false,
        );
        assert!(plans(&not_ready).is_empty());
        let off = Inputs {
            host_ports: false,
            ..inputs(web, &["10.244.0.7"], true)
        };
        assert!(plans(&off).is_empty());
    }

    fn plans_of(pod: Arc<Pod>, addresses: &[&str]) -> Vec<String> {
        described(&plans(&inputs(pod, addresses, true)))
    }

    #[test]
    fn a_host_ip_must_be_the_nodes_and_of_the_pods_family() {
        assert_eq!(
            plans_of(
                pod("[ { containerPort: 80, hostPort: 8080, hostIP: 192.168.1.10 } ]"),
                &["10.244.0.7"]
            ),
            ["HostPort shop/web (192.168.1.10:8080/TCP) -> 10.244.0.7:80 ok"]
        );
        assert_eq!(
            plans_of(
                pod("[ { containerPort: 53, hostPort: 53, hostIP: 8.8.8.8 } ]"),
                &["10.244.0.7"]
            ),
            [
                "HostPort shop/web (8.8.8.8:53/TCP) -> 10.244.0.7:53 hostIP 8.8.8.8 is not an address of this node"
            ]
        );
        assert_eq!(
            plans_of(
                pod("[ { containerPort: 80, hostPort: 80, hostIP: 'fd00::10' } ]"),
                &["10.244.0.7"]
            ),
            [
                "HostPort shop/web ([fd00::10]:80/TCP) ->  the pod has no address of fd00::10's family"
            ]
        );
        let unspecified = plans_of(
            pod("[ { containerPort: 80, hostPort: 80, hostIP: 0.0.0.0 } ]"),
            &["10.244.0.7"],
        );
        assert_eq!(
            unspecified,
            ["HostPort shop/web (192.168.1.10:80/TCP) -> 10.244.0.7:80 ok"]
        );
    }

    #[test]
    fn a_pod_never_takes_a_services_node_port_and_is_reported_not_degraded() {
        // "a" sorts before "shop": by name alone the pod would win.
        let resources = Resources::new();
        resources
            .apply(
                "objects.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: { name: a }\n---\napiVersion: v1\nkind: Namespace\nmetadata: { name: shop }\n---\napiVersion: v1\nkind: Pod\nmetadata: { name: a, namespace: a }\nspec: { containers: [ { name: c, ports: [ { containerPort: 80, hostPort: 30080 } ] } ] }\n---\napiVersion: v1\nkind: Service\nmetadata: { name: web, namespace: shop }\nspec: { type: NodePort, clusterIP: 10.96.0.20, ports: [ { port: 80, nodePort: 30080 } ] }\n",
            )
            .unwrap();
        let mut inputs = Inputs::read(&resources, &[], None);
        inputs.endpoints = vec![LocalEndpoint {
            name: "endpoint 9 (a/a)".into(),
            pod: Some(ObjectKey::namespaced("a", "a")),
            addresses: vec!["10.244.0.9".parse().unwrap()],
            ready: true,
            port_mappings: Vec::new(),
        }];
        inputs.node_addresses = vec!["192.168.1.10".parse().unwrap()];
        inputs.host_ports = true;
        let all = crate::desired::plans(&inputs);
        let at = |kind: FrontendKind| {
            all.iter()
                .find(|p| p.kind == kind && p.frontend.port == 30080)
                .unwrap_or_else(|| panic!("no {kind} plan: {all:?}"))
        };
        assert_eq!(at(FrontendKind::NodePort).error, None);
        let host = at(FrontendKind::HostPort);
        assert_eq!(
            host.error.as_deref(),
            Some("the frontend is service shop/web's")
        );
        assert!(host.unsupported, "a pod's clash must not degrade the node");
        assert_eq!(host.host_port_refusal, Some(Refusal::TakenByService));
    }

    fn mapping(host_port: u16, container_port: u16, host_ip: Option<&str>) -> HostPort {
        HostPort {
            host_ip: host_ip.map(|ip| ip.parse().unwrap()),
            host_port,
            container_port,
            protocol: Protocol::Tcp,
        }
    }

    #[test]
    fn the_runtimes_mappings_win_over_the_pods_host_ports_never_both() {
        // In Kubernetes the kubelet passes the Pod's hostPorts as the mappings: the same ports.
        let web = pod("[ { containerPort: 80, hostPort: 8080 } ]");
        let mut both = inputs(web.clone(), &["10.244.0.7"], true);
        both.endpoints[0].port_mappings = vec![mapping(8080, 80, None)];
        let got = plans(&both);
        assert_eq!(
            described(&got),
            ["HostPort shop/web (192.168.1.10:8080/TCP) -> 10.244.0.7:80 ok"]
        );
        assert_eq!(got[0].from, BackendsFrom::PortMappings);
        // Mappings that differ from the Pod's (a runtime's own): they alone are published.
        both.endpoints[0].port_mappings = vec![mapping(9090, 90, None)];
        assert_eq!(
            plans_of_inputs(&both),
            ["HostPort shop/web (192.168.1.10:9090/TCP) -> 10.244.0.7:90 ok"]
        );
        // Without mappings, the Pod's.
        let pods_only = plans(&inputs(web, &["10.244.0.7"], true));
        assert_eq!(pods_only[0].from, BackendsFrom::Pod);
    }

    fn plans_of_inputs(inputs: &Inputs) -> Vec<String> {
        described(&plans(inputs))
    }

    fn container(id: u16, last: u8, mappings: Vec<HostPort>) -> LocalEndpoint {
        LocalEndpoint {
            name: format!("endpoint {id} (container 3f2a9c1b0d{id:02})"),
            pod: None,
            addresses: vec![format!("10.244.0.{last}").parse().unwrap()],
            ready: true,
            port_mappings: mappings,
        }
    }

    #[test]
    fn an_endpoint_without_a_pod_publishes_its_mappings_under_its_own_name() {
        let mut inputs = Inputs {
            endpoints: vec![container(6, 15, vec![mapping(8080, 80, None)])],
            node_addresses: vec!["192.168.1.10".parse().unwrap()],
            host_ports: true,
            ..Inputs::default()
        };
        let got = plans(&inputs);
        assert_eq!(
            described(&got),
            [
                "HostPort endpoint 6 (container 3f2a9c1b0d06) (192.168.1.10:8080/TCP) -> 10.244.0.15:80 ok"
            ]
        );
        assert!(got[0].service.namespace.is_empty());
        // Only while it is ready: a DEL (Deleting, then gone) takes the frontend away.
        inputs.endpoints[0].ready = false;
        assert!(plans(&inputs).is_empty());
        inputs.endpoints.clear();
        assert!(plans(&inputs).is_empty());
    }

    #[test]
    fn every_refusal_has_its_reason_and_is_counted() {
        let inputs = Inputs {
            endpoints: vec![
                container(
                    1,
                    11,
                    vec![
                        mapping(8080, 80, None),
                        // The same address and port again, through its hostIP.
                        mapping(8080, 81, Some("192.168.1.10")),
                        mapping(53, 53, Some("8.8.8.8")),
                        HostPort {
                            protocol: Protocol::Sctp,
                            ..mapping(9000, 9000, None)
                        },
                    ],
                ),
                // Another endpoint on the first one's port.
                container(2, 12, vec![mapping(8080, 80, None)]),
            ],
            node_addresses: vec!["192.168.1.10".parse().unwrap()],
            host_ports: true,
            ..Inputs::default()
        };
        let all = crate::desired::plans(&inputs);
        let reasons: Vec<(String, Option<Refusal>)> = all
            .iter()
            .map(|p| (p.describe(), p.host_port_refusal))
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    "endpoint 1 (container 3f2a9c1b0d01) (192.168.1.10:8080/TCP)".to_string(),
                    None
                ),
                (
                    "endpoint 1 (container 3f2a9c1b0d01) (192.168.1.10:8080/TCP)".to_string(),
                    Some(Refusal::Duplicate)
                ),
                (
                    "endpoint 1 (container 3f2a9c1b0d01) (8.8.8.8:53/TCP)".to_string(),
                    Some(Refusal::ForeignHostIp)
                ),
                (
                    "endpoint 1 (container 3f2a9c1b0d01) (192.168.1.10:9000/SCTP)".to_string(),
                    Some(Refusal::Protocol)
                ),
                (
                    "endpoint 2 (container 3f2a9c1b0d02) (192.168.1.10:8080/TCP)".to_string(),
                    Some(Refusal::TakenByPod)
                ),
            ]
        );
        assert_eq!(
            all[4].error.as_deref(),
            Some("the frontend is endpoint 1 (container 3f2a9c1b0d01)'s")
        );
        assert!(all.iter().skip(1).all(|p| p.unsupported));
        let counted: Vec<(&str, usize)> = refused(&all)
            .into_iter()
            .map(|(r, n)| (r.as_str(), n))
            .collect();
        assert_eq!(
            counted,
            [
                ("foreign-host-ip", 1),
                ("taken-by-service", 0),
                ("taken-by-pod", 1),
                ("duplicate", 1),
                ("unsupported-protocol", 1),
                ("no-address-of-family", 0),
            ]
        );
    }
}

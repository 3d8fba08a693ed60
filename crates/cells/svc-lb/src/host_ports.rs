//! Pods' host ports (`hostPort` of a container port) served by the datapath, as Cilium's
//! `enable-host-port` serves them: each is a frontend reached from outside like a node port
//! (kind `HostPort`), with the pod as its only backend, so that no `portmap` plugin is needed.
//!
//! - Only this node's pods, once their endpoint is `Ready`: the frontend exists while the
//!   datapath serves the pod.
//! - Without `hostIP` (or with `0.0.0.0` / `::`), on every address of this node of the pod's
//!   families; with one, on that address only, which must be this node's: a pod must not take
//!   another host's address and port (a `hostIP` of `8.8.8.8` and port 53 would otherwise
//!   capture every pod's DNS to it on this node), so such a port is left out and reported.
//!   `portmap` likewise matches only the node's local addresses.
//! - The client's address is kept (the backend is local, as `externalTrafficPolicy: Local`),
//!   so the pod's ingress policy judges the real client.
//! - A service's frontend always keeps its address and port against a host port; of two pods
//!   naming one, the first by name keeps it; the others are reported, not Degraded
//!   ([`crate::external::refuse_shared`]).

use std::net::IpAddr;

use cellium_datapath_bpf::{Backend, Frontend};
use cellium_resources::{HostPort, IpFamily, ObjectKey, PortRef, Protocol, ServicePort};

use crate::desired::{
    BackendsFrom, Inputs, LocalEndpoint, Plan, PlannedBackend, datapath_protocol,
};
use crate::external::FrontendKind;

/// The host port frontends of this node's ready pods, ordered by endpoint, port and address.
pub fn plans(inputs: &Inputs) -> Vec<Plan> {
    let mut out = Vec::new();
    if !inputs.host_ports {
        return out;
    }
    for ep in inputs.endpoints.iter().filter(|e| e.ready) {
        let Some((key, pod)) = ep
            .pod
            .as_ref()
            .and_then(|key| Some((key, inputs.pods.get(key)?)))
        else {
            continue;
        };
        for host in &pod.host_ports {
            for vip in addresses(host, ep, &inputs.node_addresses) {
                out.push(plan(key, ep, host, vip, inputs));
            }
        }
    }
    out
}

/// The addresses a host port listens on: its `hostIP`, else each node address of a family
/// the pod has an address of.
fn addresses(host: &HostPort, ep: &LocalEndpoint, node_addresses: &[IpAddr]) -> Vec<IpAddr> {
    match host.host_ip {
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
    pod: &ObjectKey,
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
    let error = if !inputs.node_addresses.contains(&vip) {
        Some(format!("hostIP {vip} is not an address of this node"))
    } else if host.protocol == Protocol::Sctp {
        Some("SCTP ports are not balanced (the datapath balances TCP and UDP)".to_string())
    } else if backends.is_empty() {
        Some(format!("the pod has no address of {vip}'s family"))
    } else {
        None
    };
    Plan {
        service: pod.clone(),
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
        from: BackendsFrom::Pod,
        backends,
        draining: Vec::new(),
        algorithm: inputs.lb_algorithm,
        session_affinity: None,
        source_ranges: None,
        // The pod asked for what this node does not serve: reported, not a fault of the node.
        unsupported: error.is_some(),
        error,
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
    }
}

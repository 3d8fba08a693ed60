//! Clusters in network namespaces ([`Cluster`]): node namespaces on an underlay bridge, the test
//! API server served on every node's loopback, real agents in Kubernetes mode, real
//! `cellium-operator`s, pods through the real `cellium-cni` on each node.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test cluster -- --test-threads=1`.
//!
//! Every test that depends on how nodes route to each other takes the routing mode as its
//! parameter and is listed in [`every_mode!`]: a mode is one more line there.
//!
//! Every test makes its own namespaces, agents, operators and API server and removes them
//! through guards (also on failure); traffic goes only to addresses inside the namespaces it
//! made.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use cellium_datapath_bpf::abi::{EndpointInfo, EndpointKey, Plain};
use cellium_integration::NetNs;
use cellium_integration::cluster::{Cluster, ClusterOptions, Ipam, RoutingMode, UNDERLAY_IF};
use cellium_integration::frame::{self, Ipv4Packet};
use cellium_integration::lab::{OpenFlow, Stream, fixture, table};
use cellium_integration::probe::{PeerServer, TcpServer, UdpServer, seen_from};
use cellium_integration::reach::Probe::{self, Icmp, Tcp, Udp};
use cellium_integration::reach::{Outcome, probe};
use cellium_integration::serial;
use cellium_integration::shop::{self, PORT};
use cellium_integration::wait::FLOWING_ROUNDS;
use libbpf_rs::{MapCore, MapFlags, MapHandle};

/// The tests that run in every routing mode, one module per mode.
macro_rules! every_mode {
    ($($test:ident),* $(,)?) => {
        mod native {
            $( #[test] fn $test() { super::$test(super::RoutingMode::Native) } )*
        }
        mod tunnel {
            $( #[test] fn $test() { super::$test(super::RoutingMode::Tunnel) } )*
        }
    };
}

every_mode!(
    pods_reach_pods_of_another_node_and_policy_selects_them_by_identity,
    the_operator_gives_each_node_its_pod_cidr_and_pods_reach_across,
    policy_truth_tables_hold_with_client_and_server_on_different_nodes,
    an_agent_restarted_keeps_its_cross_node_flows,
    a_node_removed_and_re_added_takes_its_routes_and_entries_with_it,
    the_leader_operator_killed_the_other_takes_over_and_no_cidr_is_handed_out_twice,
    a_node_port_reached_on_one_node_serves_a_backend_on_the_other,
    a_node_port_client_is_judged_as_remote_node_by_another_nodes_backend,
    an_error_from_another_nodes_pod_about_a_connection_it_is_no_party_of_is_denied,
    a_packet_off_the_underlay_with_the_nodes_own_address_is_not_the_host,
    a_pod_inside_an_ipblock_keeps_its_labels_on_the_other_node,
    dsr_a_node_port_client_keeps_its_address_at_another_nodes_backend,
    hybrid_tcp_keeps_the_client_address_and_udp_is_source_translated,
);

/// Native routing past both nodes' stacks: node 1's `cel_from_container` routes a pod's
/// packet for node 2's pod through the FIB straight to the underlay device (past node 1's
/// netfilter), and node 2's `cel_from_netdev` hands it straight to the pod with its ingress
/// policy (past node 2's routing). Shown with node 1's netfilter dropping everything it would
/// forward to node 2's pods and node 2's routing refusing everything the underlay brings for
/// them: the allowed client still reaches web, the other pod is still denied by the policy;
/// each node's refusal bites once its agent and programs are gone.
#[test]
fn native_traffic_between_nodes_passes_past_both_nodes_stacks() {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions::default()).expect("cluster");
    shop::add_to(&mut cluster).expect("the shop pods");
    let _server = shop::serve_web(&cluster).expect("server");
    let n2_pods = Cluster::node_pod_cidr(1);
    let refuse_on_n2 = ["iif", "und0", "to", n2_pods.as_str(), "prohibit"];
    let rule = |verb: &'static str| [&["rule", verb][..], &refuse_on_n2[..]].concat();
    cluster
        .agent(1)
        .node()
        .ip(&rule("add"))
        .expect("node 2 refuses to route the underlay's traffic to its pods");
    cluster
        .agent(0)
        .node()
        .exec("iptables", &["-I", "FORWARD", "-d", &n2_pods, "-j", "DROP"])
        .expect("node 1's netfilter drops what it would forward to node 2's pods");
    eventually(&cluster, "client reaches web past both stacks", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    cluster
        .apply_policy(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: web, namespace: shop }\n\
             spec: { podSelector: { matchLabels: { app: web } }, ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ] } ] }\n",
        )
        .expect("policy");
    eventually(&cluster, "other is denied", || {
        !cluster.reaches("shop/other", "shop/web", Tcp(PORT))
    });
    assert!(cluster.reaches("shop/client", "shop/web", Tcp(PORT)));

    // Node 2 without its agent: its routing's refusal bites. Without the refusal, its stack
    // delivers again (node 1 still routes past its own netfilter).
    cluster.agent_mut(1).kill_and_unpin().expect("agent 2 gone");
    assert!(
        !cluster.reaches("shop/client", "shop/web", Tcp(PORT)),
        "without cel_from_netdev, node 2's routing refuses it"
    );
    cluster
        .agent(1)
        .node()
        .ip(&rule("del"))
        .expect("rule removed");
    eventually(&cluster, "node 2's stack delivers", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    // Node 1 without its agent: its netfilter's drop bites.
    cluster.agent_mut(0).kill_and_unpin().expect("agent 1 gone");
    assert!(
        !cluster.reaches("shop/client", "shop/web", Tcp(PORT)),
        "without the FIB fast path, node 1's netfilter drops it"
    );
}

/// Panics with every log of the cluster unless `ok` comes to hold.
#[track_caller]
fn eventually(cluster: &Cluster, what: &str, ok: impl FnMut() -> bool) -> Duration {
    match cluster.eventually(what, ok) {
        Ok(took) => took,
        Err(e) => panic!("{e}\n{}", cluster.logs()),
    }
}

/// A cluster routed as `mode` with the [`shop`] pods: `client` and `other` on node 0, `web`
/// (port `http` 8080) on node 1.
fn shop_cluster(mode: RoutingMode) -> Cluster {
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: mode,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    shop::add_to(&mut cluster).expect("the shop pods");
    cluster
}

fn pods_reach_pods_of_another_node_and_policy_selects_them_by_identity(mode: RoutingMode) {
    let _serial = serial();
    let cluster = shop_cluster(mode);
    let (client, web) = (
        cluster.pod("shop/client").unwrap().ip,
        cluster.pod("shop/web").unwrap().ip,
    );
    assert_eq!(client.octets()[..3], [10, 245, 11]);
    assert_eq!(web.octets()[..3], [10, 245, 12]);
    let _server = shop::serve_web(&cluster).expect("server");

    if mode == RoutingMode::Native {
        eventually(&cluster, "node 1 routes to node 2's pods", || {
            cluster
                .routes(0)
                .is_ok_and(|r| r.contains("10.245.12.0/24 via 192.0.2.2"))
        });
    }
    eventually(&cluster, "client reaches web on the other node", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    assert!(
        cluster.reaches("shop/other", "shop/web", Tcp(PORT)),
        "no policy yet"
    );
    eventually(&cluster, "node 2 has node 1's pods in its ipcache", || {
        cluster.ipcache_has_remote(1, client.into())
    });

    // A policy on node 2 selects node 1's pods by their labels.
    cluster.apply_policy(shop::WEB_FROM_CLIENT).expect("policy");
    eventually(&cluster, "other is denied", || {
        !cluster.reaches("shop/other", "shop/web", Tcp(PORT))
    });
    assert!(
        cluster.reaches("shop/client", "shop/web", Tcp(PORT)),
        "client is still allowed"
    );

    // An egress rule of node 1's client naming a port: the number is the remote web pod's,
    // from its CiliumEndpoint's named ports (no pod on node 1 has them).
    cluster
        .apply_policy(shop::CLIENT_TO_WEB_HTTP)
        .expect("egress policy");
    eventually(&cluster, "client reaches web by its port's name", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });

    // A remote pod relabelled: its identity changes on its node, the other node follows.
    cluster
        .api()
        .label_pod("shop", "other", "app=client")
        .expect("kubectl label");
    eventually(&cluster, "relabelled other is allowed", || {
        cluster.reaches("shop/other", "shop/web", Tcp(PORT))
    });

    // A ClusterIP whose backend runs on the other node: translated on the client's node,
    // routed across, and the reply translated back.
    cluster
        .apply(&format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec: {{ ports: [ {{ name: http, port: 80, targetPort: {PORT} }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-1, namespace: shop, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
ports: [ {{ name: http, port: {PORT}, protocol: TCP }} ]
endpoints: [ {{ addresses: [ "{web}" ], conditions: {{ ready: true }}, nodeName: n2 }} ]
"#
        ))
        .expect("service with a remote backend");
    let vip: Ipv4Addr = cluster
        .api()
        .api()
        .get("v1", "Service", Some("shop"), "web")
        .expect("stored")["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let client_ns = &cluster.pod("shop/client").unwrap().netns;
    eventually(
        &cluster,
        "client reaches the remote backend through the ClusterIP",
        || {
            matches!(
                probe(client_ns, None, vip, Tcp(80), Duration::from_millis(700)),
                Ok(Outcome::Answered)
            )
        },
    );
}

#[test]
fn ipam_cluster_pool_registers_the_node_and_waits_for_the_operators_cidrs() {
    let _serial = serial();
    // One node, no operator: the test plays the operator.
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        ipam: Ipam::ClusterPool {
            cidr: "10.245.0.0/16".into(),
            mask_size: 24,
        },
        start_agents: false,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    cluster.namespace("shop", "").expect("namespace");
    cluster
        .apply(
            "apiVersion: v1\nkind: Pod\nmetadata: { name: client, namespace: shop, labels: { app: client } }\n\
             spec: { nodeName: n1, containers: [ { name: c, image: x } ] }\n",
        )
        .expect("pod");
    cluster.launch_agent(0).expect("agent");

    // The agent creates its CiliumNode with its addresses, and waits for pod CIDRs.
    eventually(&cluster, "the agent creates its CiliumNode", || {
        cluster
            .api()
            .api()
            .get("cilium.io/v2", "CiliumNode", None, "n1")
            .is_some()
    });
    let cn = cluster
        .api()
        .api()
        .get("cilium.io/v2", "CiliumNode", None, "n1")
        .unwrap();
    assert_eq!(cn["spec"]["addresses"][0]["ip"], "192.0.2.1", "{cn}");
    assert!(
        cluster.agent_mut(0).is_running(),
        "waits\n{}",
        cluster.logs()
    );
    assert!(
        cluster.agent(0).cli(&["status"]).is_err(),
        "not serving before the CIDRs"
    );

    // What the operator says when it has none to give is what the agent says.
    cluster
        .api()
        .kubectl(
            &[
                "patch",
                "ciliumnode",
                "n1",
                "--subresource=status",
                "--type",
                "merge",
                "-p",
                r#"{"status":{"ipam":{"operator-status":{"error":"all pools are exhausted"}}}}"#,
            ],
            "",
        )
        .expect("operator status");
    eventually(&cluster, "the operator's error is reported", || {
        cluster
            .agent(0)
            .log()
            .contains("the operator says: all pools are exhausted")
    });

    // The operator assigns a CIDR: the agent starts and hands out its addresses.
    cluster
        .api()
        .kubectl(
            &[
                "patch",
                "ciliumnode",
                "n1",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"ipam":{"podCIDRs":["10.245.20.0/24"]}}}"#,
            ],
            "",
        )
        .expect("operator assigns");
    cluster
        .agent_mut(0)
        .wait_ready()
        .expect("ready once assigned");
    let ip = cluster
        .create_pod_network(0, "shop/client")
        .expect("ADD")
        .ip;
    assert_eq!(ip.octets()[..3], [10, 245, 20], "{ip}");
    // The operator's field is left alone by the agent's upkeep.
    let cn = cluster
        .api()
        .api()
        .get("cilium.io/v2", "CiliumNode", None, "n1")
        .unwrap();
    assert_eq!(cn["spec"]["ipam"]["podCIDRs"][0], "10.245.20.0/24");
}

/// The pod CIDRs every CiliumNode holds, by node name.
fn cidrs(cluster: &Cluster) -> Vec<(String, Vec<String>)> {
    cluster
        .api()
        .api()
        .list("cilium.io/v2", "CiliumNode")
        .iter()
        .map(|cn| {
            let name = cn["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let cidrs = cn["spec"]["ipam"]["podCIDRs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (name, cidrs)
        })
        .collect()
}

/// Panics unless no CIDR is held by two CiliumNodes.
#[track_caller]
fn assert_no_cidr_twice(cluster: &Cluster) {
    let all = cidrs(cluster);
    let mut seen = std::collections::BTreeMap::new();
    for (node, cidrs) in &all {
        for cidr in cidrs {
            if let Some(other) = seen.insert(cidr.clone(), node.clone()) {
                panic!("{cidr} is held by {other} and {node}: {all:?}");
            }
        }
    }
}

fn the_operator_gives_each_node_its_pod_cidr_and_pods_reach_across(mode: RoutingMode) {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: mode,
        ipam: Ipam::ClusterPool {
            cidr: "10.246.0.0/16".into(),
            mask_size: 24,
        },
        operators: 1,
        ..ClusterOptions::default()
    })
    .expect("cluster with an operator");
    cluster.namespace("shop", "").expect("namespace");
    cluster
        .add_pod(0, "shop/client", "app=client", &[])
        .expect("ADD client");
    cluster
        .add_pod(1, "shop/web", "app=web", &[("http", PORT, "TCP")])
        .expect("ADD web");
    let (client, web) = (
        cluster.pod("shop/client").unwrap().ip,
        cluster.pod("shop/web").unwrap().ip,
    );
    assert_eq!(client.octets()[..2], [10, 246], "{client}");
    assert_eq!(web.octets()[..2], [10, 246], "{web}");
    assert_ne!(
        client.octets()[2],
        web.octets()[2],
        "each node has its own /24 of the pool"
    );
    assert_no_cidr_twice(&cluster);
    let _server = shop::serve_web(&cluster).expect("server");
    eventually(
        &cluster,
        "client reaches web over the operator's CIDRs",
        || cluster.reaches("shop/client", "shop/web", Tcp(PORT)),
    );
}

/// A pod of [`SPREAD`]: key, labels, named ports (name, port, protocol), node.
type SpreadPod = (
    &'static str,
    &'static str,
    &'static [(&'static str, u16, &'static str)],
    usize,
);

/// The policy lab's pods (`lab::fixture`), spread over two nodes so that every pod has a peer
/// on the other node in its own namespace and in another: (key, labels, named ports, node).
const SPREAD: [SpreadPod; 5] = [
    ("shop/web", "app=web", &[("http", 8080, "TCP")], 0),
    ("shop/db", "app=db", &[("sql", 5432, "TCP")], 1),
    ("dev/web", "app=web", &[("http", 80, "TCP")], 1),
    ("dev/tool", "app=tool", &[], 0),
    (
        "ops/dns",
        "app=dns",
        &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
        1,
    ),
];

const COMMON: [Probe; 4] = [Tcp(80), Tcp(5432), Udp(53), Icmp];

/// Servers on every pod for every probe, held until dropped.
enum Server {
    Tcp(#[allow(dead_code)] TcpServer),
    Udp(#[allow(dead_code)] UdpServer),
}

fn serve(cluster: &Cluster, probes: &[Probe]) -> Vec<Server> {
    let mut out = Vec::new();
    for pod in cluster.pods() {
        for p in probes {
            let at = |port| SocketAddr::new(IpAddr::V4(pod.ip), port);
            match *p {
                Tcp(port) => out.push(Server::Tcp(
                    TcpServer::start(&pod.netns, at(port), &pod.key).expect("tcp server"),
                )),
                Udp(port) => out.push(Server::Udp(
                    UdpServer::start(&pod.netns, at(port), &pod.key).expect("udp server"),
                )),
                Icmp => {}
            }
        }
    }
    out
}

/// Probes every flow between the cluster's pods and panics with the whole table unless each
/// behaved as `expect` says; returns how many flows crossed nodes.
#[track_caller]
fn check(cluster: &Cluster, scenario: &str, expect: impl Fn(&table::Flow<'_>) -> bool) -> usize {
    let places = cluster.places();
    let table = table::run(scenario, &places, &COMMON, expect);
    table.assert();
    let node_of = |name: &str| cluster.pod(name).map(|p| p.node).ok();
    table
        .rows
        .iter()
        .filter(|r| node_of(&r.from) != node_of(&r.to))
        .count()
}

fn policy_truth_tables_hold_with_client_and_server_on_different_nodes(mode: RoutingMode) {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: mode,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    for (ns, labels) in [
        ("shop", "team=a"),
        ("dev", "team=b"),
        ("ops", "team=a,tier=infra"),
    ] {
        cluster.namespace(ns, labels).expect("namespace");
    }
    for (key, labels, ports, node) in SPREAD {
        cluster.add_pod(node, key, labels, ports).expect("pod");
    }
    let _servers = serve(&cluster, &COMMON);
    for pod in cluster.pods() {
        for other in cluster.pods().iter().filter(|o| o.node != pod.node) {
            eventually(&cluster, "every node knows every remote pod", || {
                cluster.ipcache_has_remote(other.node, pod.ip.into())
            });
        }
    }

    let crossing = check(&cluster, "no policy", |_| true);
    // 5 pods, 3 on one node and 2 on the other: 12 of the 20 ordered pairs cross.
    assert_eq!(crossing, 12 * COMMON.len());

    // The scenarios of the single-node tables (tests/policy.rs), without the node and the
    // external places: the same verdicts, now decided on identities learnt from the other
    // node.
    cluster
        .apply_policy(fixture::DEFAULT_DENY_PER_DIRECTION)
        .expect("policy");
    check(&cluster, "default deny per direction", |f| {
        !f.to.is("shop/db") && !f.from.is("dev/tool")
    });
    cluster
        .api()
        .kubectl(&["delete", "networkpolicy", "--all", "-n", "shop"], "")
        .expect("delete");
    cluster
        .api()
        .kubectl(&["delete", "networkpolicy", "--all", "-n", "dev"], "")
        .expect("delete");

    cluster
        .apply_policy(fixture::NAMESPACE_ISOLATION)
        .expect("policy");
    check(&cluster, "namespace isolation", |f| {
        if f.from.in_ns("dev") && !f.to.in_ns("dev") {
            return false;
        }
        for ns in ["shop", "dev"] {
            if f.to.in_ns(ns) {
                return f.from.in_ns(ns);
            }
        }
        true
    });

    // Namespaces selected by their labels, pods by theirs, across nodes: team=a namespaces
    // may reach dev/web on its http port only.
    cluster
        .apply_policy(
            r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-team-a, namespace: dev }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { from: [ { namespaceSelector: { matchLabels: { team: a } } } ], ports: [ { port: http } ] } ]
"#,
        )
        .expect("policy");
    check(&cluster, "namespace selector and named port", |f| {
        if f.from.in_ns("dev") && !f.to.in_ns("dev") {
            return false;
        }
        if f.to.is("dev/web") {
            // isolate (dev to dev, any port) or web-from-team-a (shop, ops; http = 80).
            return f.from.in_ns("dev")
                || ((f.from.in_ns("shop") || f.from.in_ns("ops")) && f.probe == Tcp(80));
        }
        for ns in ["shop", "dev"] {
            if f.to.in_ns(ns) {
                return f.from.in_ns(ns);
            }
        }
        true
    });
}

fn an_agent_restarted_keeps_its_cross_node_flows(mode: RoutingMode) {
    let _serial = serial();
    let mut cluster = shop_cluster(mode);
    let web = cluster.pod_addr("shop/web", PORT).unwrap();
    let _server = shop::serve_web(&cluster).expect("server");
    // A policy, so that the flow is one policy allowed, not one no policy touches.
    cluster
        .apply_policy(
            r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-client, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ] } ]
"#,
        )
        .expect("policy");
    eventually(&cluster, "client reaches web on the other node", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    let flow = OpenFlow::tcp(&cluster.pod("shop/client").unwrap().netns, web).expect("open");
    let stream = Stream::start(flow);

    // The client's agent, then the server's, stopped and started again under the stream.
    let mut windows = Vec::new();
    for node in [0, 1] {
        stream.wait_rounds(FLOWING_ROUNDS);
        let stopped = Instant::now();
        cluster.agent_mut(node).stop().expect("stop");
        stream.wait_rounds(FLOWING_ROUNDS);
        cluster.start_agent(node).expect("start again");
        windows.push((node, stopped, Instant::now()));
    }
    stream.wait_rounds(FLOWING_ROUNDS);
    let log = stream.finish().expect("stream");
    assert!(
        log.failure.is_none(),
        "the open flow broke: {:?}\n{}",
        log.failure,
        cluster.logs()
    );
    let windows_end = *windows.last().expect("two restarts");
    for (node, from, to) in windows {
        assert!(
            log.rounds_between(from, to) > 0,
            "no round trip while node {node}'s agent was away (max gap {:?})",
            log.max_gap()
        );
    }
    let (_, _, last_started) = windows_end;
    assert!(
        log.rounds_between(last_started, Instant::now()) > 0,
        "the flow goes on after both restarts"
    );
    // New flows too, through the restarted agents, under the same policy.
    assert!(cluster.reaches("shop/client", "shop/web", Tcp(PORT)));
    assert!(!cluster.reaches("shop/other", "shop/web", Tcp(PORT)));
}

fn a_node_removed_and_re_added_takes_its_routes_and_entries_with_it(mode: RoutingMode) {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 3,
        routing_mode: mode,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    shop::add_to(&mut cluster).expect("the shop pods");
    let _server = shop::serve_web(&cluster).expect("server");
    let n2_ip: IpAddr = Cluster::node_ip(1).into();
    let n2_cidr = Cluster::node_pod_cidr(1);
    // What node i knows of n2: its route (native routing) and its address's ipcache entry.
    let of_n2 = |cluster: &Cluster, i: usize| {
        let routed = cluster
            .routes(i)
            .is_ok_and(|r| r.contains(&format!("{n2_cidr} via {n2_ip}")));
        (routed, cluster.ipcache_has_remote(i, n2_ip))
    };
    let knows_n2 = |cluster: &Cluster, i: usize| {
        let (routed, entry) = of_n2(cluster, i);
        (routed || mode != RoutingMode::Native) && entry
    };
    let forgot_n2 = |cluster: &Cluster, i: usize| of_n2(cluster, i) == (false, false);
    for i in [0, 2] {
        eventually(&cluster, "the others know n2", || knows_n2(&cluster, i));
    }
    eventually(&cluster, "client reaches web on n2", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });

    // n2 leaves: its Node and CiliumNode are deleted (as `kubectl delete node` and the
    // operator's GC would). The others drop its routes and entries, without a restart.
    let pids: Vec<_> = (0..3).map(|i| cluster.agent(i).pid()).collect();
    cluster
        .api()
        .kubectl(&["delete", "node", "n2"], "")
        .expect("delete node");
    cluster
        .api()
        .kubectl(&["delete", "ciliumnode", "n2", "--ignore-not-found"], "")
        .expect("delete ciliumnode");
    for i in [0, 2] {
        eventually(&cluster, "the others forget n2", || forgot_n2(&cluster, i));
    }
    if mode == RoutingMode::Native {
        assert!(
            !cluster.reaches("shop/client", "shop/web", Tcp(PORT)),
            "no route to a node that left"
        );
    }

    // n2 comes back: routes, entries and the pod behind them follow.
    cluster
        .apply(&cluster.node_yaml(1))
        .expect("the Node again");
    for i in [0, 2] {
        eventually(&cluster, "the others know n2 again", || {
            knows_n2(&cluster, i)
        });
    }
    eventually(&cluster, "client reaches web on n2 again", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    // n2's agent puts its CiliumNode back.
    eventually(&cluster, "n2's CiliumNode is back", || {
        cluster
            .api()
            .api()
            .get("cilium.io/v2", "CiliumNode", None, "n2")
            .is_some()
    });
    let after: Vec<_> = (0..3).map(|i| cluster.agent(i).pid()).collect();
    assert_eq!(pids, after, "no agent restarted");
}

fn the_leader_operator_killed_the_other_takes_over_and_no_cidr_is_handed_out_twice(
    mode: RoutingMode,
) {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 3,
        routing_mode: mode,
        ipam: Ipam::ClusterPool {
            cidr: "10.246.0.0/16".into(),
            mask_size: 24,
        },
        operators: 2,
        start_agents: false,
        ..ClusterOptions::default()
    })
    .expect("cluster with two operators");
    cluster.start_agent(0).expect("agent n1");
    cluster.start_agent(1).expect("agent n2");
    eventually(&cluster, "a leader", || cluster.lease_holder().is_some());
    let leader = cluster.lease_holder().unwrap();
    assert_no_cidr_twice(&cluster);

    // The leader dies without releasing its Lease; the other takes over once it expires.
    let dead = cluster
        .operators_mut()
        .iter_mut()
        .find(|o| o.id() == leader)
        .expect("the leader is one of ours");
    dead.kill();
    eventually(&cluster, "the other operator leads", || {
        cluster.lease_holder().is_some_and(|h| h != leader)
    });

    // A node that joins now gets its CIDR from the new leader: one nobody else holds.
    cluster
        .start_agent(2)
        .expect("agent n3, given a CIDR by the new leader");
    assert_no_cidr_twice(&cluster);
    let held = cidrs(&cluster);
    assert_eq!(
        held.iter().filter(|(_, c)| !c.is_empty()).count(),
        3,
        "{held:?}"
    );
    cluster.namespace("shop", "").expect("namespace");
    cluster
        .add_pod(2, "shop/client", "app=client", &[])
        .expect("client on n3");
    cluster
        .add_pod(0, "shop/web", "app=web", &[("http", PORT, "TCP")])
        .expect("web on n1");
    let _server = shop::serve_web(&cluster).expect("server");
    eventually(&cluster, "n3's client reaches n1's web", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
}

#[test]
fn an_exhausted_pool_is_reported_on_the_cilium_node_and_by_its_agent() {
    let _serial = serial();
    // A pool of one /24: the first node gets it, the second nothing.
    let mut cluster = Cluster::start(ClusterOptions {
        ipam: Ipam::ClusterPool {
            cidr: "10.246.0.0/24".into(),
            mask_size: 24,
        },
        operators: 1,
        start_agents: false,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    cluster
        .start_agent(0)
        .expect("agent n1 gets the pool's only CIDR");
    cluster.launch_agent(1).expect("agent n2");
    eventually(&cluster, "the operator reports n2's exhaustion", || {
        cluster
            .api()
            .api()
            .get("cilium.io/v2", "CiliumNode", None, "n2")
            .and_then(|cn| {
                cn["status"]["ipam"]["operator-status"]["error"]
                    .as_str()
                    .map(|e| !e.is_empty())
            })
            .unwrap_or(false)
    });
    let error = cluster
        .api()
        .api()
        .get("cilium.io/v2", "CiliumNode", None, "n2")
        .unwrap()["status"]["ipam"]["operator-status"]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    eventually(&cluster, "n2's agent says what the operator said", || {
        cluster
            .agent(1)
            .log()
            .contains(&format!("the operator says: {error}"))
    });
    // Fail closed: the agent that has no CIDR serves no pod.
    assert!(cluster.agent_mut(1).is_running());
    assert!(cluster.agent(1).cli(&["status"]).is_err());
    assert_eq!(
        cidrs(&cluster)
            .iter()
            .filter(|(_, c)| !c.is_empty())
            .count(),
        1
    );
}

/// A client outside the cluster on the underlay: a namespace with `192.0.2.100/24` on the
/// underlay bridge (removed with the namespace).
fn outside_client(cluster: &Cluster) -> NetNs {
    cluster
        .underlay_host("ext0", "192.0.2.100/24")
        .expect("the client on the underlay")
}

/// A NodePort service (externalTrafficPolicy Cluster) whose only backend runs on node 2,
/// reached from outside at node 1's address: node 1 translates it, source-translates the
/// client to its own address, routes it to node 2; the reply comes back to node 1, which
/// translates it back to the client. The backend sees node 1's address. In tunnel mode the
/// translated packet crosses in the tunnel, and so does the reply.
fn a_node_port_reached_on_one_node_serves_a_backend_on_the_other(mode: RoutingMode) {
    let _serial = serial();
    let np = NodePortServed::start(None, mode, &[HTTP, DNS, CLOSED]);
    let seen = np.seen_over_tcp("the outside client reaches node 1's node port");
    assert_eq!(seen, IpAddr::V4(Cluster::node_ip(0)));
    // Datagrams of several fragments, both ways: node 1 translates the later fragments as
    // their first, and the backend's fragmented answer back.
    let dns = NodePortServed::udp_port();
    for size in [1000, 3000, 8000] {
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let reply = cellium_integration::probe::udp_exchange(
            &np.client,
            dns,
            &payload,
            Duration::from_secs(3),
        )
        .unwrap_or_else(|e| panic!("{size} bytes to {dns}: {e}"));
        assert_eq!((reply.banner.as_str(), reply.from), ("web", dns));
    }
    // The backend's port unreachable, about a datagram node 1 translated both ways, comes
    // back to the client as from node 1's node port: its connected socket is refused.
    let closed = SocketAddr::new(IpAddr::V4(Cluster::node_ip(0)), CLOSED.node_port);
    assert_eq!(
        cellium_integration::probe::udp_error(&np.client, closed, Duration::from_secs(3))
            .expect("run in the client"),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
}

/// What `docs/services.md` ("Policy at another node's backend") says of SNAT: a client from
/// outside that reaches node 1's node port (externalTrafficPolicy Cluster) and is balanced to
/// web on node 2 is judged by node 2 on node 1's address, `remote-node`, not on its own: a
/// policy allowing only `remote-node` admits it, one allowing only the client's own address
/// denies it (counted as a policy drop on node 2).
fn a_node_port_client_is_judged_as_remote_node_by_another_nodes_backend(mode: RoutingMode) {
    let _serial = serial();
    let np = NodePortServed::start(None, mode, &[HTTP]);
    np.cluster
        .apply_policy(&web_policy(&["fromEntities: [ remote-node ]"]))
        .expect("web admits remote-node only");
    let seen = np.seen_over_tcp("the outside client passes web's remote-node-only policy");
    assert_eq!(seen, IpAddr::V4(Cluster::node_ip(0)));

    np.cluster
        .apply_policy(&web_policy(&["fromCIDR: [ 192.0.2.100/32 ]"]))
        .expect("web admits the outside client's address only");
    let before = np.node_2_drops("policy default deny");
    eventually(
        &np.cluster,
        "web's policy for the client's own address denies it through node 1",
        || {
            seen_from(&np.client, NodePortServed::tcp_port()).is_err()
                && np.node_2_drops("policy default deny") > before
        },
    );
}

/// A port of web's NodePort service: its service port, web's port and the node port.
struct NodePortSpec {
    name: &'static str,
    port: u16,
    target: u16,
    node_port: u16,
    protocol: &'static str,
}

const HTTP: NodePortSpec = NodePortSpec {
    name: "http",
    port: 80,
    target: PORT,
    node_port: 30080,
    protocol: "TCP",
};
const DNS: NodePortSpec = NodePortSpec {
    name: "dns",
    port: 53,
    target: 5353,
    node_port: 30053,
    protocol: "UDP",
};
/// A UDP port nothing in web listens on.
const CLOSED: NodePortSpec = NodePortSpec {
    name: "closed",
    port: 54,
    target: 5354,
    node_port: 30054,
    protocol: "UDP",
};

/// The cluster of the node-port tests, in `bpf-lb-mode` `mode` (the default where `None`),
/// routed as `routing`, with the `shop` pods and a NodePort service (externalTrafficPolicy
/// Cluster) of `ports`, whose only backend is web on node 2.
fn node_port_to_node_2(
    mode: Option<&str>,
    routing: RoutingMode,
    ports: &[NodePortSpec],
) -> Cluster {
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: routing,
        agent_env: mode
            .map(|m| ("CELLIUM_BPF_LB_MODE".into(), m.into()))
            .into_iter()
            .collect(),
        ..ClusterOptions::default()
    })
    .expect("cluster");
    shop::add_to(&mut cluster).expect("the shop pods");
    let web = cluster.pod("shop/web").unwrap().ip;
    let service_ports: String = ports
        .iter()
        .map(|p| {
            format!(
                "  - {{ name: {}, port: {}, targetPort: {}, nodePort: {}, protocol: {} }}\n",
                p.name, p.port, p.target, p.node_port, p.protocol
            )
        })
        .collect();
    let slice_ports: String = ports
        .iter()
        .map(|p| {
            format!(
                "- {{ name: {}, port: {}, protocol: {} }}\n",
                p.name, p.target, p.protocol
            )
        })
        .collect();
    cluster
        .apply(&format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec:
  type: NodePort
  ports:
{service_ports}---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-1, namespace: shop, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
ports:
{slice_ports}endpoints: [ {{ addresses: [ "{web}" ], conditions: {{ ready: true }}, nodeName: n2 }} ]
"#
        ))
        .expect("NodePort service with a remote backend");
    cluster
}

/// web's ingress policy (a CiliumNetworkPolicy) of `rules`.
fn web_policy(rules: &[&str]) -> String {
    let rules: Vec<String> = rules.iter().map(|r| format!("{{ {r} }}")).collect();
    format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\n\
         metadata: {{ name: web-ingress, namespace: shop }}\n\
         spec: {{ endpointSelector: {{ matchLabels: {{ app: web }} }}, ingress: [ {} ] }}\n",
        rules.join(", ")
    )
}

/// [`node_port_to_node_2`] with web serving (its peer's address on `PORT`, UDP on 5353) and the
/// outside client; the servers and the client go before the cluster.
struct NodePortServed {
    _tcp: PeerServer,
    _udp: UdpServer,
    client: NetNs,
    cluster: Cluster,
}

impl NodePortServed {
    fn start(mode: Option<&str>, routing: RoutingMode, ports: &[NodePortSpec]) -> Self {
        let cluster = node_port_to_node_2(mode, routing, ports);
        let web = cluster.pod("shop/web").unwrap();
        let _tcp = PeerServer::start(&web.netns, SocketAddr::new(IpAddr::V4(web.ip), PORT))
            .expect("server");
        let _udp = UdpServer::start(&web.netns, SocketAddr::new(IpAddr::V4(web.ip), 5353), "web")
            .expect("udp server");
        let client = outside_client(&cluster);
        NodePortServed {
            _tcp,
            _udp,
            client,
            cluster,
        }
    }

    /// Where the client reaches the TCP node port: node 1's.
    fn tcp_port() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Cluster::node_ip(0)), HTTP.node_port)
    }

    /// Where the client reaches the UDP node port: node 1's.
    fn udp_port() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Cluster::node_ip(0)), DNS.node_port)
    }

    /// The address web sees the client's TCP connection from, once one passes.
    fn seen_over_tcp(&self, what: &str) -> IpAddr {
        let mut seen = None;
        eventually(&self.cluster, what, || {
            seen = seen_from(&self.client, Self::tcp_port()).ok();
            seen.is_some()
        });
        seen.unwrap()
    }

    /// One datagram through the UDP node port: its answer comes from the node port.
    fn udp_answered(&self) -> bool {
        let dns = Self::udp_port();
        cellium_integration::probe::udp_exchange(&self.client, dns, b"hi", Duration::from_secs(1))
            .is_ok_and(|r| (r.banner.as_str(), r.from) == ("web", dns))
    }

    /// Node 2's count of ingress packets dropped for `reason`.
    fn node_2_drops(&self, reason: &str) -> u64 {
        self.cluster
            .agent(1)
            .datapath_packets("ingress", reason)
            .expect("node 2's metrics")
    }
}

/// `bpf-lb-mode: dsr` (docs/services.md, "Direct server return"): a client from outside that
/// reaches node 1's node port and is balanced to web on node 2 keeps its own address; node 2
/// judges it on that address (a policy allowing only the client's address admits it, one
/// allowing only `remote-node` denies it, counted on node 2), and web's replies, TCP and UDP,
/// reach the client from node 1's node port, leaving node 2 straight to the client. In tunnel
/// routing the client's packets cross in the tunnel, the replies do not.
fn dsr_a_node_port_client_keeps_its_address_at_another_nodes_backend(routing: RoutingMode) {
    let _serial = serial();
    let np = NodePortServed::start(Some("dsr"), routing, &[HTTP, DNS]);
    np.cluster
        .apply_policy(&web_policy(&["fromCIDR: [ 192.0.2.100/32 ]"]))
        .expect("web admits the outside client's address only");
    let seen = np.seen_over_tcp("the outside client passes web's policy for its own address");
    assert_eq!(seen, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 100)));
    eventually(&np.cluster, "a datagram through node 1's node port", || {
        np.udp_answered()
    });

    np.cluster
        .apply_policy(&web_policy(&["fromEntities: [ remote-node ]"]))
        .expect("web admits remote-node only");
    let before = np.node_2_drops("policy default deny");
    eventually(
        &np.cluster,
        "web's remote-node-only policy denies the client through node 1",
        || {
            seen_from(&np.client, NodePortServed::tcp_port()).is_err()
                && np.node_2_drops("policy default deny") > before
        },
    );
}

/// `bpf-lb-mode: hybrid`: DSR for TCP, SNAT for UDP. Under a policy that admits the client's own
/// address on TCP and `remote-node` (node 1, the source SNAT gives) on UDP only, both pass: the
/// TCP connection reaches web on node 2 from the client's address, the datagram as from node 1,
/// and both answers come back from node 1's node ports.
fn hybrid_tcp_keeps_the_client_address_and_udp_is_source_translated(routing: RoutingMode) {
    let _serial = serial();
    let np = NodePortServed::start(Some("hybrid"), routing, &[HTTP, DNS]);
    np.cluster
        .apply_policy(&web_policy(&[
            &format!(
                "fromCIDR: [ 192.0.2.100/32 ], toPorts: [ {{ ports: [ {{ port: \"{PORT}\", protocol: TCP }} ] }} ]"
            ),
            "fromEntities: [ remote-node ], toPorts: [ { ports: [ { port: \"5353\", protocol: UDP } ] } ]",
        ]))
        .expect("web admits the client on TCP, remote-node on UDP");
    let seen = np.seen_over_tcp("the outside client's TCP passes web's policy for its address");
    assert_eq!(seen, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 100)));
    eventually(&np.cluster, "a datagram passes as from node 1", || {
        np.udp_answered()
    });
}

/// A UDP socket in web on its port 5353, read with a short timeout: what reaches web.
fn web_sink(cluster: &Cluster) -> std::net::UdpSocket {
    let web = cluster.pod("shop/web").unwrap();
    let addr = SocketAddr::new(IpAddr::V4(web.ip), 5353);
    let sink = web
        .netns
        .run(move || std::net::UdpSocket::bind(addr))
        .expect("run in web")
        .expect("bind in web");
    sink.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    sink
}

/// A datagram from the outside client's address to web's port 5353 with Cilium's DSR option
/// (type 0x9a, length 8, port, address) naming node 1's node port 30053, framed from `src_mac`
/// to `dst_mac`: what only node 1 may send.
fn forged_dsr_datagram(cluster: &Cluster, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
    let datagram = Ipv4Packet {
        src: Ipv4Addr::new(192, 0, 2, 100),
        dst: cluster.pod("shop/web").unwrap().ip,
        protocol: 17,
        id: 9,
        offset: 0,
        more: false,
        payload: frame::udp(40000, 5353, b"forged"),
    }
    .frame(src_mac, dst_mac);
    let mut option = vec![0x9a, 8];
    option.extend_from_slice(&30053u16.to_be_bytes());
    option.extend_from_slice(&Cluster::node_ip(0).octets());
    frame::with_ipv4_option(&datagram, &option)
}

/// Sends `forged` from the outside client until node 2 counts a drop as from an unknown sender;
/// web must have received nothing.
fn dropped_as_unknown_sender(cluster: &Cluster, client: &NetNs, forged: Vec<u8>, what: &str) {
    let sink = web_sink(cluster);
    let unknown = || {
        cluster
            .agent(1)
            .datapath_packets("ingress", "unknown sender")
            .expect("node 2's metrics")
    };
    let before = unknown();
    eventually(cluster, &format!("node 2 drops {what}"), || {
        frame::send(client, "eth0", forged.clone()).expect("send");
        unknown() > before
    });
    let mut buf = [0u8; 64];
    assert!(sink.recv_from(&mut buf).is_err(), "{what} reached web");
}

/// The MAC address of `ifname` in `ns`.
fn mac_of(ns: &NetNs, ifname: &str) -> [u8; 6] {
    frame::mac_of(ns, ifname).expect("a MAC address")
}

/// `bpf-lb-mode: dsr`: node 2 believes a DSR option only from another node. A host of the
/// underlay that is no node forges one, naming node 1's node port, on a datagram for web: node
/// 2 drops it as from an unknown sender and counts it; web gets nothing.
#[test]
fn dsr_an_option_forged_off_the_underlay_is_dropped_and_counted() {
    let _serial = serial();
    let cluster = node_port_to_node_2(Some("dsr"), RoutingMode::Native, &[HTTP, DNS]);
    let client = outside_client(&cluster);
    let forged = forged_dsr_datagram(
        &cluster,
        mac_of(&client, "eth0"),
        mac_of(cluster.agent(1).node(), UNDERLAY_IF),
    );
    dropped_as_unknown_sender(&cluster, &client, forged, "the forged option");
}

/// `bpf-lb-mode: dsr` in tunnel routing: node 2 believes a DSR option only out of the tunnel,
/// from a node. A host of the underlay that is no node forges one, naming node 1's node port,
/// on a datagram for web, twice: in VXLAN with the world's VNI, what node 1 sends for a client
/// from outside (its outer source is no node's); bare, as in native routing, from node 1's own
/// link-layer address, which node 2 has resolved (no node sends an option outside the tunnel
/// in tunnel routing). Node 2 drops each as from an unknown sender and counts it; web gets
/// neither.
#[test]
fn dsr_tunnel_an_option_is_believed_only_out_of_the_tunnel_from_a_node() {
    let _serial = serial();
    let cluster = node_port_to_node_2(Some("dsr"), RoutingMode::Tunnel, &[HTTP, DNS]);
    let client = outside_client(&cluster);
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());
    let two_mac = mac_of(two, UNDERLAY_IF);
    let inner = forged_dsr_datagram(&cluster, [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let vxlan = Ipv4Packet {
        src: Ipv4Addr::new(192, 0, 2, 100),
        dst: Cluster::node_ip(1),
        protocol: 17,
        id: 10,
        offset: 0,
        more: false,
        payload: frame::udp(40000, 8472, &frame::vxlan(0x08, 2, &inner)),
    }
    .frame(mac_of(&client, "eth0"), two_mac);
    dropped_as_unknown_sender(&cluster, &client, vxlan, "the option in a stranger's VXLAN");

    // Node 2 resolves node 1's link-layer address, so that the frame would pass the check
    // native routing makes.
    assert!(
        cellium_integration::probe::ping(two, Cluster::node_ip(0), 1).expect("ping"),
        "node 2 reaches node 1"
    );
    let bare = forged_dsr_datagram(&cluster, mac_of(one, UNDERLAY_IF), two_mac);
    dropped_as_unknown_sender(&cluster, &client, bare, "the option outside the tunnel");
}

/// One datagram over `sock` and its answer: how the read failed, `None` if the answer came.
fn exchange(sock: &std::net::UdpSocket) -> Option<std::io::ErrorKind> {
    sock.send(b"hello").expect("send");
    sock.recv(&mut [0u8; 64]).err().map(|e| e.kind())
}

/// A pod of node 2 (`intruder`) forges a port unreachable about the live UDP connection
/// between two pods of node 1 (`client` to `other`), which node 2's conntrack does not know:
/// node 2 sends it on as a new flow, and node 1, which knows the connection, must not take it
/// for the connection's (the sender is a pod, by the tunnel's identity or the ipcache's, and
/// not the connection's peer): it meets the client's ingress policy, which denies everything,
/// and is counted there; the connection lives on. The error of `web` (node 2), the peer of
/// the client's connection to it, still reaches the client through the same policy.
fn an_error_from_another_nodes_pod_about_a_connection_it_is_no_party_of_is_denied(
    mode: RoutingMode,
) {
    let _serial = serial();
    let mut cluster = shop_cluster(mode);
    cluster
        .add_pod(1, "shop/intruder", "app=intruder", &[])
        .expect("intruder");
    let pod = |key: &str| cluster.pod(key).unwrap();
    let at = |key: &str| SocketAddr::new(IpAddr::V4(pod(key).ip), 5353);
    let (other, web, intruder) = (at("shop/other"), at("shop/web"), pod("shop/intruder").ip);
    let _other_server = UdpServer::start(&pod("shop/other").netns, other, "other").expect("other");
    let web_server = UdpServer::start(&pod("shop/web").netns, web, "web").expect("web");
    cluster
        .apply_policy(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: client, namespace: shop }\n\
             spec: { podSelector: { matchLabels: { app: client } }, policyTypes: [ Ingress ] }\n",
        )
        .expect("policy");
    eventually(&cluster, "the client's ingress denies everything", || {
        !cluster.reaches("shop/other", "shop/client", Icmp)
    });
    eventually(&cluster, "node 1 knows the intruder's identity", || {
        cluster.ipcache_has_remote(0, IpAddr::V4(intruder))
    });

    let timeout = Duration::from_secs(3);
    let client_ns = &pod("shop/client").netns;
    let to_other = cellium_integration::probe::udp_connect(client_ns, other, timeout)
        .expect("a connected UDP socket");
    let to_web = cellium_integration::probe::udp_connect(client_ns, web, timeout)
        .expect("a connected UDP socket");
    assert_eq!(exchange(&to_other), None, "a live connection to other");
    assert_eq!(exchange(&to_web), None, "a live connection to web");

    let client = to_other.local_addr().expect("the client's address");
    let link = cluster.agent(1).endpoint_link(IpAddr::V4(intruder));
    let denied = || {
        cluster
            .agent(0)
            .datapath_packets("ingress", "policy default deny")
            .expect("node 1's metrics")
    };
    let before = denied();
    let error = frame::port_unreachable(
        IpAddr::V4(intruder),
        client.ip(),
        (client, other),
        (link.pod_mac, link.host_mac),
    );
    frame::send(&pod("shop/intruder").netns, "eth0", error).expect("send the intruder's error");
    eventually(&cluster, "the intruder's error is denied on node 1", || {
        if let Some(e) = to_other.take_error().expect("SO_ERROR") {
            panic!("the intruder's error reached the client: {e}");
        }
        denied() > before
    });
    assert_eq!(exchange(&to_other), None, "the connection lives on");

    drop(web_server);
    assert_eq!(
        exchange(&to_web),
        Some(std::io::ErrorKind::ConnectionRefused),
        "web's own error"
    );
}

/// Nothing off the underlay is the node itself. With web's ingress denying everything but the
/// node (`allow-localhost`), node 1 sends node 2, on the underlay, a UDP datagram for web whose
/// source is node 2's own address: taken at its address it would pass as node 2; node 2's
/// `cel_from_netdev` takes it as the world, the policy drops it, the drop is counted and
/// reported with the world's identity, and web receives nothing. Node 2's own processes still
/// reach web.
fn a_packet_off_the_underlay_with_the_nodes_own_address_is_not_the_host(mode: RoutingMode) {
    let _serial = serial();
    let cluster = shop_cluster(mode);
    let web = cluster.pod("shop/web").unwrap().ip;
    let web_ns = &cluster.pod("shop/web").unwrap().netns;
    let _server = shop::serve_web(&cluster).expect("server");
    let to_web = SocketAddr::new(IpAddr::V4(web), 5353);
    let sink = web_ns
        .run(move || std::net::UdpSocket::bind(to_web))
        .expect("netns")
        .expect("bind in web");
    sink.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    eventually(&cluster, "client reaches web on the other node", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    cluster
        .apply_policy(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: web-no-ingress, namespace: shop }\nspec: { podSelector: { matchLabels: { app: web } }, policyTypes: [ Ingress ] }\n",
        )
        .expect("policy");
    eventually(&cluster, "client is denied", || {
        !cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());
    assert!(
        matches!(
            probe(two, None, web, Tcp(PORT), Duration::from_millis(700)),
            Ok(Outcome::Answered)
        ),
        "node 2 itself reaches web"
    );

    let mac = |ns: &NetNs| {
        let text = ns
            .exec("cat", &[&format!("/sys/class/net/{UNDERLAY_IF}/address")])
            .expect("address");
        let mut mac = [0u8; 6];
        for (b, part) in mac.iter_mut().zip(text.trim().split(':')) {
            *b = u8::from_str_radix(part, 16).expect("a MAC");
        }
        mac
    };
    let mut udp = 40000u16.to_be_bytes().to_vec();
    udp.extend_from_slice(&5353u16.to_be_bytes());
    udp.extend_from_slice(&[0, 15, 0, 0]);
    udp.extend_from_slice(b"spoofed");
    let spoofed = Ipv4Packet {
        src: Cluster::node_ip(1),
        dst: web,
        protocol: 17,
        id: 9,
        offset: 0,
        more: false,
        payload: udp,
    }
    .frame(mac(one), mac(two));
    let reason = "policy default deny";
    let denied = || {
        cluster
            .agent(1)
            .datapath_packets("ingress", reason)
            .expect("metrics")
    };
    let before = denied();
    eventually(&cluster, "denied as the world", || {
        frame::send(one, UNDERLAY_IF, spoofed.clone()).expect("send");
        denied() > before
    });
    let mut buf = [0u8; 64];
    assert!(
        sink.recv_from(&mut buf).is_err(),
        "a packet with node 2's address from the underlay reached web"
    );
    eventually(&cluster, "its flow, from the world", || {
        cluster.agent(1).dropped_flows().iter().any(|f| {
            f["flow"]["IP"]["source"] == Cluster::node_ip(1).to_string().as_str()
                && f["flow"]["source"]["identity"] == 2
                && f["flow"]["drop_reason_desc"] == "POLICY_DENIED"
        })
    });
}

/// A pod whose address an ipBlock covers (here a `0.0.0.0/0` egress rule of another
/// namespace's policy, which selects none of these pods) has a node-local identity on its own
/// node: its labels with the ipBlock's `cidr:` label. Its node publishes its cluster identity
/// (its CiliumEndpoint's), the other node gives the address its own local identity of those
/// labels, and policy there still decides on them: a podSelector admits the client, a deny
/// of its labels denies it, and an ipBlock of the receiving node's policy selects a remote
/// pod. In tunnel mode the VNI carries the cluster identity (a local number does not fit in
/// it), and nothing is dropped as `Encapsulation failed`.
fn a_pod_inside_an_ipblock_keeps_its_labels_on_the_other_node(mode: RoutingMode) {
    let _serial = serial();
    let cluster = shop_cluster(mode);
    cluster.namespace("elsewhere", "").expect("namespace");
    let (client, other) = (
        cluster.pod("shop/client").unwrap().ip,
        cluster.pod("shop/other").unwrap().ip,
    );
    let _server = shop::serve_web(&cluster).expect("server");
    cluster
        .apply_policy(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: wide, namespace: elsewhere }\n\
             spec: { podSelector: {}, policyTypes: [ Egress ], egress: [ { to: [ { ipBlock: { cidr: 0.0.0.0/0 } } ] } ] }\n\
             ---\n\
             apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: web, namespace: shop }\n\
             spec: { podSelector: { matchLabels: { app: web } }, ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ], ports: [ { port: http } ] } ] }\n",
        )
        .expect("policies");
    eventually(&cluster, "client reaches web on the other node", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    assert!(
        !cluster.reaches("shop/other", "shop/web", Tcp(PORT)),
        "other is denied"
    );
    let local = u64::from(cellium_identity::LOCAL_IDENTITY_FLAG);
    let published = cluster
        .api()
        .api()
        .get("cilium.io/v2", "CiliumEndpoint", Some("shop"), "client")
        .expect("client's CiliumEndpoint")["status"]["identity"]
        .clone();
    let id = published["id"].as_u64().expect("an identity");
    assert!((256..65536).contains(&id), "{published}");
    assert!(!published.to_string().contains("cidr:"), "{published}");
    let here = remote_identity(&cluster, 1, client).expect("node 2 has client");
    assert!(
        here >= local,
        "node 2's own local identity for client: {here}"
    );
    assert_eq!(refused(&cluster, 1, "not-cluster-identity"), 0);

    // An ipBlock of the receiving node's policy selects a remote pod by its address.
    cluster
        .apply_policy(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{ name: web-from-other, namespace: shop }}\n\
             spec: {{ podSelector: {{ matchLabels: {{ app: web }} }}, ingress: [ {{ from: [ {{ ipBlock: {{ cidr: {other}/32 }} }} ] }} ] }}\n"
        ))
        .expect("ipBlock policy");
    eventually(&cluster, "other reaches web by its address", || {
        cluster.reaches("shop/other", "shop/web", Tcp(PORT))
    });
    // A deny of the client's labels still finds them.
    cluster
        .apply_policy(
            "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: { name: no-client, namespace: shop }\n\
             spec: { endpointSelector: { matchLabels: { app: web } }, ingressDeny: [ { fromEndpoints: [ { matchLabels: { app: client } } ] } ] }\n",
        )
        .expect("deny policy");
    eventually(&cluster, "client is denied", || {
        !cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    assert!(
        cluster.reaches("shop/other", "shop/web", Tcp(PORT)),
        "other is still allowed"
    );
    if mode == RoutingMode::Tunnel {
        for i in 0..2 {
            let status = cluster.agent(i).cli(&["status", "-v"]).expect("status");
            assert!(
                status.contains("no packets dropped as Encapsulation failed"),
                "{status}"
            );
        }
    }
}

/// Tunnel mode: packets the datapath drops as `Encapsulation failed` show in the node's
/// health. The fault is injected as another process could: the client's endpoint entry given
/// a cluster identity beyond the VNI's 24 bits, so that its packets to the other node cannot
/// be encapsulated. `node-discovery.encapsulation` goes Degraded with the count, and OK again
/// at the first look after the entry is put back.
#[test]
fn tunnel_encapsulation_failures_show_in_health() {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: RoutingMode::Tunnel,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    shop::add_to(&mut cluster).expect("the shop pods");
    let client = cluster.pod("shop/client").unwrap().ip;
    let _server = shop::serve_web(&cluster).expect("server");
    eventually(&cluster, "client reaches web", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    let status = || cluster.agent(0).cli(&["status", "-v"]).unwrap_or_default();
    const OK: &str = "no packets dropped as Encapsulation failed";
    eventually(&cluster, "the first look is taken", || {
        status().contains(OK)
    });

    let endpoints =
        MapHandle::from_pinned_path(cluster.agent(0).bpf_root().join("maps/cel_endpoints"))
            .expect("the pinned endpoints map");
    let key = EndpointKey::new(IpAddr::V4(client)).encode();
    let raw = endpoints
        .lookup(&key, MapFlags::ANY)
        .expect("lookup")
        .expect("client's entry");
    let mut info = EndpointInfo::decode(&raw).expect("an endpoint_info");
    let good = info;
    info.cluster_identity = cellium_identity::LOCAL_IDENTITY_FLAG;
    endpoints
        .update(&key, &info.encode(), MapFlags::EXIST)
        .expect("entry forged");
    assert!(!cluster.reaches("shop/client", "shop/web", Tcp(PORT)));
    let degraded = cellium_integration::wait::poll_for(
        "node-discovery.encapsulation Degraded",
        Duration::from_secs(90),
        || {
            let s = status();
            s.contains("dropped as Encapsulation failed")
                .then_some(s)
                .filter(|s| !s.contains(OK))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", status()));
    assert!(degraded.contains("encapsulation"), "{degraded}");

    endpoints
        .update(&key, &good.encode(), MapFlags::EXIST)
        .expect("entry put back");
    eventually(&cluster, "client reaches web again", || {
        cluster.reaches("shop/client", "shop/web", Tcp(PORT))
    });
    cellium_integration::wait::poll_for("OK again", Duration::from_secs(90), || {
        status().contains(OK).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", status()));
}

/// The identity of `ip`'s entry in node `i`'s ipcache, if it has one from another node.
fn remote_identity(cluster: &Cluster, i: usize, ip: Ipv4Addr) -> Option<u64> {
    let list = cluster.agent(i).cli(&["ipcache", "list"]).ok()?;
    let line = list
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&format!("{ip}/32")))?;
    let mut columns = line.split_whitespace();
    let identity = columns.nth(1)?.parse().ok()?;
    (columns.next() == Some("remote")).then_some(identity)
}

/// The value of node `i`'s refusal counter for `reason`, 0 when absent.
fn refused(cluster: &Cluster, i: usize, reason: &str) -> u64 {
    let sample = format!("cellium_remote_claims_refused_total{{reason=\"{reason}\"}}");
    let text = cluster.agent(i).metrics().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(sample.as_str())?.trim().parse().ok())
        .unwrap_or(0)
}

/// A CiliumEndpoint as a node's agent would publish it.
fn cilium_endpoint(ns: &str, name: &str, ip: Ipv4Addr, identity: u64, node: &str) -> String {
    format!(
        "apiVersion: cilium.io/v2\nkind: CiliumEndpoint\nmetadata: {{ name: {name}, namespace: {ns} }}\n\
         status: {{ id: 1, identity: {{ id: {identity} }}, networking: {{ addressing: [ {{ ipv4: \"{ip}\" }} ], node: \"{node}\" }} }}\n---\n"
    )
}

/// Forged CiliumEndpoints: one in another namespace claiming a pod of node 1 with the
/// allowed pod's identity and node 1 as its node (its identity is of another namespace),
/// one claiming node 2's pod from a third node whose pod CIDRs do not hold it, one with the
/// host identity. None changes a pod's identity or the policy; each refusal is counted and
/// in `cellium status`.
#[test]
fn forged_cilium_endpoints_change_no_pods_identity() {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions::default()).expect("cluster");
    shop::add_to(&mut cluster).expect("the shop pods");
    cluster.namespace("evil", "").expect("namespace");
    // n9: a node with no agent, its pod CIDR 10.245.19.0/24.
    cluster
        .apply(
            "apiVersion: v1\nkind: Node\nmetadata: { name: n9 }\nspec: { podCIDRs: [ 10.245.19.0/24 ] }\n\
             status: { addresses: [ { type: InternalIP, address: 192.0.2.9 } ] }\n",
        )
        .expect("node n9");
    let (client, other, web) = (
        cluster.pod("shop/client").unwrap().ip,
        cluster.pod("shop/other").unwrap().ip,
        cluster.pod("shop/web").unwrap().ip,
    );
    let _server = shop::serve_web(&cluster).expect("server");
    eventually(&cluster, "each node knows the other's pods", || {
        [client, other]
            .iter()
            .all(|ip| remote_identity(&cluster, 1, *ip).is_some())
            && remote_identity(&cluster, 0, web).is_some()
    });
    let client_id = remote_identity(&cluster, 1, client).unwrap();
    let other_id = remote_identity(&cluster, 1, other).unwrap();
    let web_id = remote_identity(&cluster, 0, web).unwrap();
    cluster
        .apply_policy(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: web, namespace: shop }\n\
             spec: { podSelector: { matchLabels: { app: web } }, ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ] } ] }\n",
        )
        .expect("policy");
    eventually(&cluster, "other is denied", || {
        !cluster.reaches("shop/other", "shop/web", Tcp(PORT))
    });

    let mut forged = String::new();
    // Named to come first, on the victim's own node.
    forged += &cilium_endpoint("evil", "aaa", other, client_id, "192.0.2.1");
    forged += &cilium_endpoint("shop", "aaa", web, client_id, "192.0.2.9");
    forged += &cilium_endpoint("evil", "host", other, 1, "192.0.2.1");
    // n9's own pod, last: once both nodes have it, they have seen the rest.
    forged += &cilium_endpoint(
        "shop",
        "n9-pod",
        "10.245.19.5".parse().unwrap(),
        client_id,
        "192.0.2.9",
    );
    cluster
        .api()
        .api()
        .apply_yaml(&forged)
        .expect("forged CiliumEndpoints");
    eventually(&cluster, "both nodes take n9's pod", || {
        (0..2).all(|i| {
            remote_identity(&cluster, i, "10.245.19.5".parse().unwrap()) == Some(client_id)
        })
    });
    assert_eq!(
        remote_identity(&cluster, 1, other),
        Some(other_id),
        "other keeps its identity"
    );
    assert_eq!(
        remote_identity(&cluster, 0, web),
        Some(web_id),
        "web keeps its identity"
    );
    assert!(
        !cluster.reaches("shop/other", "shop/web", Tcp(PORT)),
        "other is still denied"
    );
    assert!(
        cluster.reaches("shop/client", "shop/web", Tcp(PORT)),
        "client is still allowed"
    );
    eventually(&cluster, "the refusals are counted", || {
        refused(&cluster, 1, "namespace-mismatch") == 1
            && refused(&cluster, 1, "reserved-identity") == 1
            && refused(&cluster, 1, "foreign-address") == 1
            && refused(&cluster, 0, "foreign-address") == 1
    });
    let status = cluster.agent(1).cli(&["status"]).expect("status");
    assert!(
        status.contains("3 remote claims refused")
            && status.contains("namespace-mismatch 1")
            && status.contains("reserved-identity 1"),
        "{status}"
    );
}

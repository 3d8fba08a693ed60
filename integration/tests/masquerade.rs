//! BPF masquerading (`enable-bpf-masquerade`): pods reach the world from their node's
//! address. The world is a namespace on the cluster's underlay ([`Cluster::underlay_host`]) with no
//! route to any pod CIDR: it can only answer a pod whose packets carry its node's address.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test masquerade -- --test-threads=1`.
//!
//! Every test makes its own namespaces, agents and API server and removes them through guards
//! (also on failure); traffic goes only to addresses inside the namespaces it made.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use cellium_integration::NetNs;
use cellium_integration::cluster::{Cluster, ClusterOptions, RoutingMode};
use cellium_integration::lab::{OpenFlow, Stream};
use cellium_integration::probe::{PeerServer, TcpServer, UdpServer, seen_from, udp_request};
use cellium_integration::reach::Probe::{self, Icmp, Tcp, Udp};
use cellium_integration::reach::{Outcome, probe};
use cellium_integration::serial;
use cellium_integration::wait::FLOWING_ROUNDS;
use libbpf_rs::{MapCore, MapHandle};

/// The world's address: on the underlay's network, no node's.
const WORLD: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 200);
/// The world's TCP server that answers with the peer address it sees.
const PEER_PORT: u16 = 8080;
/// The world's echoing TCP server (the long transfer).
const ECHO_PORT: u16 = 8081;
/// The world's UDP server.
const UDP_PORT: u16 = 5353;

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
    pods_of_every_node_reach_the_world_from_their_nodes_address,
    a_long_download_from_a_pod_survives_an_agent_restart,
);

/// The world and its servers (dropped with it).
struct World {
    _peer: PeerServer,
    _udp: UdpServer,
    _echo: TcpServer,
    ns: NetNs,
}

fn world(cluster: &Cluster) -> World {
    let ns = cluster
        .underlay_host("wld0", &format!("{WORLD}/24"))
        .expect("world netns");
    let at = |port| SocketAddr::new(IpAddr::V4(WORLD), port);
    World {
        _peer: PeerServer::start(&ns, at(PEER_PORT)).expect("peer server"),
        _udp: UdpServer::start(&ns, at(UDP_PORT), "world").expect("udp server"),
        _echo: TcpServer::start(&ns, at(ECHO_PORT), "world").expect("echo server"),
        ns,
    }
}

/// `town/a` on node 0, `town/b` on node 1.
fn town(cluster: &mut Cluster) {
    cluster.namespace("town", "").expect("namespace");
    cluster.add_pod(0, "town/a", "app=a", &[]).expect("a");
    cluster.add_pod(1, "town/b", "app=b", &[]).expect("b");
}

fn cluster_with(mode: RoutingMode, env: &[(&str, &str)]) -> Cluster {
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: mode,
        agent_env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ClusterOptions::default()
    })
    .expect("cluster");
    town(&mut cluster);
    cluster
}

fn eventually(cluster: &Cluster, what: &str, ok: impl FnMut() -> bool) -> Duration {
    match cluster.eventually(what, ok) {
        Ok(took) => took,
        Err(e) => panic!("{e}\n{}", cluster.logs()),
    }
}

fn netns<'a>(cluster: &'a Cluster, key: &str) -> &'a NetNs {
    &cluster.pod(key).expect("pod").netns
}

/// The address the world sees `key`'s TCP connection come from, if it answers.
fn seen(cluster: &Cluster, key: &str) -> Option<IpAddr> {
    seen_from(
        netns(cluster, key),
        SocketAddr::new(IpAddr::V4(WORLD), PEER_PORT),
    )
    .ok()
}

fn reaches(cluster: &Cluster, key: &str, what: Probe) -> Outcome {
    probe(
        netns(cluster, key),
        None,
        WORLD,
        what,
        Duration::from_millis(700),
    )
    .expect("probe")
}

/// Every pod reaches the world over TCP, UDP and ICMP echo, which sees its node's address;
/// the node's own sockets reach it too, from that same address, beside the pods'.
fn pods_of_every_node_reach_the_world_from_their_nodes_address(mode: RoutingMode) {
    let _serial = serial();
    let cluster = cluster_with(mode, &[]);
    let _world = world(&cluster);
    for (key, node) in [("town/a", 0), ("town/b", 1)] {
        let node_ip = IpAddr::V4(Cluster::node_ip(node));
        eventually(
            &cluster,
            &format!("{key} reaches the world as its node"),
            || seen(&cluster, key) == Some(node_ip),
        );
        let udp = udp_request(
            netns(&cluster, key),
            SocketAddr::new(IpAddr::V4(WORLD), UDP_PORT),
            Duration::from_secs(1),
        )
        .expect("udp answered");
        // The world has no route to pods: an answer came back to the node's address.
        assert_eq!(udp.banner, "world", "{udp:?}");
        assert_eq!(
            reaches(&cluster, key, Icmp),
            Outcome::Answered,
            "{key} ping"
        );
        let node_sees = seen_from(
            cluster.agent(node).node(),
            SocketAddr::new(IpAddr::V4(WORLD), PEER_PORT),
        )
        .expect("the node's own connection");
        assert_eq!(node_sees, node_ip);
    }
}

/// The same cluster with masquerading off: the world cannot answer (it has no route to pods),
/// so the test above can fail; and a destination inside `ipv4-native-routing-cidr` keeps the
/// pod's address with masquerading on: the world, given routes to the pod CIDRs, sees the pod.
#[test]
fn the_world_cannot_answer_without_masquerading_and_native_routing_cidrs_keep_the_pods_address() {
    let _serial = serial();
    {
        let cluster = cluster_with(
            RoutingMode::Native,
            &[("CELLIUM_ENABLE_BPF_MASQUERADE", "false")],
        );
        let _world = world(&cluster);
        // The pods reach each other: the cluster works, only the world is unanswered.
        let b = cluster.pod("town/b").unwrap().ip;
        eventually(&cluster, "a reaches b", || {
            probe(
                netns(&cluster, "town/a"),
                None,
                b,
                Icmp,
                Duration::from_millis(500),
            )
            .is_ok_and(|o| o.answered())
        });
        for key in ["town/a", "town/b"] {
            assert_eq!(seen(&cluster, key), None, "{key} unmasqueraded is answered");
            assert_ne!(reaches(&cluster, key, Udp(UDP_PORT)), Outcome::Answered);
            assert_ne!(reaches(&cluster, key, Icmp), Outcome::Answered);
        }
    }
    let cluster = cluster_with(
        RoutingMode::Native,
        &[("CELLIUM_IPV4_NATIVE_ROUTING_CIDR", "192.0.2.0/24")],
    );
    let world = world(&cluster);
    let a = cluster.pod("town/a").unwrap().ip;
    eventually(
        &cluster,
        "a, in the native routing CIDR, is not answered",
        || seen(&cluster, "town/a").is_none(),
    );
    for node in 0..2 {
        world
            .ns
            .ip(&[
                "route",
                "add",
                &Cluster::node_pod_cidr(node),
                "via",
                &Cluster::node_ip(node).to_string(),
            ])
            .expect("route to the pod CIDR");
    }
    eventually(&cluster, "the world sees a's own address", || {
        seen(&cluster, "town/a") == Some(IpAddr::V4(a))
    });
    assert_eq!(
        reaches(&cluster, "town/b", Udp(UDP_PORT)),
        Outcome::Answered
    );
}

/// Policy is decided on the pod's own address, before masquerading: `toCIDR` and
/// `toEntities: [world]` select what the pod may send to the world, whatever source it then
/// leaves with.
#[test]
fn egress_policy_to_the_world_applies_before_masquerading() {
    let _serial = serial();
    let cluster = cluster_with(RoutingMode::Native, &[]);
    let _world = world(&cluster);
    eventually(&cluster, "a reaches the world", || {
        seen(&cluster, "town/a") == Some(IpAddr::V4(Cluster::node_ip(0)))
    });
    cluster
        .apply_policy(&format!(
            r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{ name: a-tcp-only, namespace: town }}
spec:
  endpointSelector: {{ matchLabels: {{ app: a }} }}
  egress:
  - toCIDR: [ "{WORLD}/32" ]
    toPorts: [ {{ ports: [ {{ port: "{PEER_PORT}", protocol: TCP }} ] }} ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{ name: b-udp-only, namespace: town }}
spec:
  endpointSelector: {{ matchLabels: {{ app: b }} }}
  egress:
  - toEntities: [ world ]
    toPorts: [ {{ ports: [ {{ port: "{UDP_PORT}", protocol: UDP }} ] }} ]
"#
        ))
        .expect("policies");
    eventually(&cluster, "a's UDP to the world is denied", || {
        reaches(&cluster, "town/a", Udp(UDP_PORT)) == Outcome::Dropped
    });
    assert_eq!(
        seen(&cluster, "town/a"),
        Some(IpAddr::V4(Cluster::node_ip(0))),
        "toCIDR admits a's TCP, masqueraded"
    );
    assert_eq!(reaches(&cluster, "town/a", Icmp), Outcome::Dropped);
    eventually(&cluster, "b's TCP to the world is denied", || {
        seen(&cluster, "town/b").is_none()
    });
    assert_eq!(
        reaches(&cluster, "town/b", Udp(UDP_PORT)),
        Outcome::Answered,
        "toEntities world admits b's UDP"
    );
    assert_eq!(
        reaches(&cluster, "town/b", Tcp(ECHO_PORT)),
        Outcome::Dropped
    );
}

/// A pod's long-lived connection to the world keeps flowing while its node's agent is stopped
/// and started again: its conntrack and masquerading entries are pinned and nothing flushes
/// them.
fn a_long_download_from_a_pod_survives_an_agent_restart(mode: RoutingMode) {
    let _serial = serial();
    let mut cluster = cluster_with(mode, &[]);
    let _world = world(&cluster);
    eventually(&cluster, "a reaches the world", || {
        seen(&cluster, "town/a") == Some(IpAddr::V4(Cluster::node_ip(0)))
    });
    let flow = OpenFlow::tcp(
        netns(&cluster, "town/a"),
        SocketAddr::new(IpAddr::V4(WORLD), ECHO_PORT),
    )
    .expect("open");
    let stream = Stream::start(flow);
    stream.wait_rounds(FLOWING_ROUNDS);
    cluster.agent_mut(0).stop().expect("stop");
    stream.wait_rounds(FLOWING_ROUNDS);
    cluster.start_agent(0).expect("start again");
    stream.wait_rounds(FLOWING_ROUNDS);
    let log = stream.finish().expect("stream");
    assert!(
        log.failure.is_none(),
        "the transfer broke: {:?}\n{}",
        log.failure,
        cluster.logs()
    );
    assert_eq!(
        seen(&cluster, "town/a"),
        Some(IpAddr::V4(Cluster::node_ip(0))),
        "new connections are masqueraded after the restart"
    );
}

/// With `enable-ip-masq-agent`, the ip-masq-agent's file says where pods keep their address:
/// read at start, re-read as it changes, and a file that does not parse leaves the last
/// prefixes in force (said in `cellium status`).
#[test]
fn the_ip_masq_agent_file_is_followed_as_it_changes_and_a_broken_one_keeps_the_last() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("config");
    std::fs::write(&file, "nonMasqueradeCIDRs: [192.0.2.0/24]\n").expect("write");
    let path = file.to_str().expect("a UTF-8 path");
    let cluster = cluster_with(
        RoutingMode::Native,
        &[
            ("CELLIUM_ENABLE_IP_MASQ_AGENT", "true"),
            ("CELLIUM_IP_MASQ_AGENT_CONFIG_PATH", path),
        ],
    );
    let world = world(&cluster);
    for node in 0..2 {
        world
            .ns
            .ip(&[
                "route",
                "add",
                &Cluster::node_pod_cidr(node),
                "via",
                &Cluster::node_ip(node).to_string(),
            ])
            .expect("route to the pod CIDR");
    }
    let a = IpAddr::V4(cluster.pod("town/a").unwrap().ip);
    let node = IpAddr::V4(Cluster::node_ip(0));
    eventually(&cluster, "the world, not masqueraded to, sees a", || {
        seen(&cluster, "town/a") == Some(a)
    });
    std::fs::write(&file, "nonMasqueradeCIDRs: [198.51.100.0/24]\n").expect("rewrite");
    eventually(&cluster, "a is masqueraded once the file changed", || {
        seen(&cluster, "town/a") == Some(node)
    });
    std::fs::write(&file, "nonMasqueradeCIDRs: [not-a-cidr]\n").expect("break");
    eventually(&cluster, "status says the file is not applied", || {
        cluster
            .agent(0)
            .cli(&["status", "--verbose"])
            .is_ok_and(|s| s.contains("the previous configuration stays"))
    });
    let status = cluster.agent(0).cli(&["status"]).expect("status");
    assert!(
        status.contains("the ip-masq-agent configuration") && status.contains("is not applied"),
        "a note says so: {status}"
    );
    assert_eq!(
        seen(&cluster, "town/a"),
        Some(node),
        "the last prefixes stay"
    );
}

/// The keys of an agent's pinned IPv4 map `name` (`struct ct_key` keys: `cel_ct4`,
/// `cel_snat4`) whose source or destination is `ip`, read as another process would.
fn keys_naming(cluster: &Cluster, node: usize, name: &str, ip: Ipv4Addr) -> Vec<Vec<u8>> {
    let map = MapHandle::from_pinned_path(cluster.agent(node).bpf_root().join("maps").join(name))
        .expect("the pinned map");
    map.keys()
        .filter(|k| k.get(..4) == Some(&ip.octets()[..]) || k.get(4..8) == Some(&ip.octets()[..]))
        .collect()
}

/// A masqueraded connection's two `cel_snat4` entries (the pod's tuple, and the reply's,
/// which names the pod in its value only) go once its conntrack entry is gone (here deleted
/// as the collector deletes an expired one), at the agent's next conntrack collection; a
/// connection still open keeps its own.
#[test]
fn a_masqueraded_connections_entries_go_with_its_conntrack_entry() {
    let _serial = serial();
    let cluster = cluster_with(
        RoutingMode::Native,
        &[("CELLIUM_CONNTRACK_GC_INTERVAL", "1s")],
    );
    let _world = world(&cluster);
    let a = cluster.pod("town/a").unwrap().ip;
    let world = SocketAddr::new(IpAddr::V4(WORLD), ECHO_PORT);
    let mut open = OpenFlow::tcp(netns(&cluster, "town/a"), world).expect("open");
    assert_eq!(open.round_trip(), Outcome::Answered);
    udp_request(
        netns(&cluster, "town/a"),
        SocketAddr::new(IpAddr::V4(WORLD), UDP_PORT),
        Duration::from_secs(1),
    )
    .expect("udp answered");
    const UDP: u8 = 17;
    let proto = |k: &Vec<u8>| k.get(12).copied();
    let forward = keys_naming(&cluster, 0, "cel_snat4", a);
    assert_eq!(
        forward.iter().filter(|k| proto(k) == Some(UDP)).count(),
        1,
        "the UDP exchange's forward entry: {forward:?}"
    );
    let ct = MapHandle::from_pinned_path(cluster.agent(0).bpf_root().join("maps/cel_ct4"))
        .expect("cel_ct4");
    for key in keys_naming(&cluster, 0, "cel_ct4", a) {
        if proto(&key) == Some(UDP) && key.get(4..8) == Some(&WORLD.octets()[..]) {
            ct.delete(&key)
                .expect("delete the UDP exchange's conntrack entry");
        }
    }
    let snat = MapHandle::from_pinned_path(cluster.agent(0).bpf_root().join("maps/cel_snat4"))
        .expect("cel_snat4");
    let udp_entries = || {
        snat.keys()
            .filter(|k| {
                proto(k) == Some(UDP)
                    && k.get(..4)
                        .is_some_and(|s| s == WORLD.octets() || s == a.octets())
            })
            .count()
    };
    eventually(&cluster, "the UDP exchange's entries are collected", || {
        udp_entries() == 0
    });
    assert_eq!(
        open.round_trip(),
        Outcome::Answered,
        "the open TCP connection keeps its translation"
    );
    assert!(
        keys_naming(&cluster, 0, "cel_snat4", a)
            .iter()
            .any(|k| proto(k) == Some(6)),
        "the open connection's forward entry stays"
    );
}

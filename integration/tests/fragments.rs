//! Fragmented datagrams through the datapath: delivered wherever their first fragment is
//! allowed (policy, conntrack and service translation included), and a fragment whose first
//! never was is dropped and counted, never let through on its own.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test fragments -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces through the real `cellium-cni` and
//! removes them (guards), and sends traffic only to addresses inside them and to cluster IPs
//! that exist only in the node's datapath. The pods are dual-stack and every test runs in both
//! families. Their links have an MTU of 1,500: a UDP payload of 1,472 bytes is the largest
//! that fits one IPv4 packet (1,452 for IPv6), and ICMP echo data of 3,000 bytes takes three
//! fragments.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use cellium_integration::agent::pod_objects;
use cellium_integration::cni::{result_ipv4, result_ipv6};
use cellium_integration::frame::{self, Ipv4Packet, Ipv6Packet, UDP};
use cellium_integration::probe::{self, UdpServer};
use cellium_integration::wait::eventually;
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use libbpf_rs::{MapCore, MapHandle};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(3);
const SHORT: Duration = Duration::from_millis(700);
const POD_CIDR4: &str = "10.244.0.0/24";
const POD_CIDR6: &str = "fd00:10:244::/112";

/// The UDP payloads of a family: the largest unfragmented one, the smallest fragmented one,
/// a large one.
fn sizes(ip: IpAddr) -> [usize; 3] {
    match ip {
        IpAddr::V4(_) => [1472, 1473, 8000],
        IpAddr::V6(_) => [1452, 1453, 8000],
    }
}

/// A dual-stack pod made through the plugin.
struct Pod {
    ns: NetNs,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
}

impl Pod {
    /// Its addresses, IPv4 first.
    fn ips(&self) -> [IpAddr; 2] {
        [self.v4.into(), self.v6.into()]
    }
}

/// An agent with dual-stack pods and a service range per family.
fn agent() -> Agent {
    Agent::start_new(AgentOptions {
        pod_cidrs: vec![POD_CIDR4.into(), POD_CIDR6.into()],
        env: vec![(
            "CELLIUM_SERVICE_CIDR".into(),
            "10.96.0.0/16,fd00:10:96::/108".into(),
        )],
        ..AgentOptions::default()
    })
    .expect("start the agent")
}

/// Applies Pod objects `default/<name>` with `app: <name>` and makes the pods.
fn pods<const N: usize>(agent: &Agent, names: [&str; N]) -> [Pod; N] {
    agent
        .objects("apply", &pod_objects(&names))
        .expect("apply pods");
    names.map(|name| {
        let ns = NetNs::new().expect("pod netns");
        let call = CniCall::new("ADD", &format!("frag{name}x{}", std::process::id()))
            .netns(ns.path())
            .args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
        let (status, result) = agent.cni(&call).expect("run the plugin");
        assert!(status.success(), "ADD {name}: {result}");
        let v4 = result_ipv4(&result).unwrap_or_else(|| panic!("no IPv4 in {result}"));
        let v6 = result_ipv6(&result).unwrap_or_else(|| panic!("no IPv6 in {result}"));
        Pod { ns, v4, v6 }
    })
}

fn counter(agent: &Agent, direction: &str, reason: &str) -> u64 {
    agent.datapath_packets(direction, reason).expect("metrics")
}

/// A payload of `n` bytes that no truncation or reordering leaves intact.
fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Sends a datagram of `size` bytes from `from` to `to` (a [`UdpServer`]); the server's banner
/// if the whole datagram and its whole answer arrived.
fn exchange(from: &NetNs, to: SocketAddr, size: usize) -> Option<String> {
    probe::udp_exchange(from, to, &payload(size), SHORT)
        .ok()
        .map(|r| r.banner)
}

/// How many datagrams the agent's pinned fragment table of `dst`'s family holds for `dst`.
fn recorded(agent: &Agent, dst: IpAddr) -> usize {
    let (map, daddr) = match dst {
        IpAddr::V4(_) => ("maps/cel_frag4", 4..8),
        IpAddr::V6(_) => ("maps/cel_frag6", 16..32),
    };
    let map = MapHandle::from_pinned_path(agent.bpf_root().join(map))
        .expect("open the pinned fragment map");
    let ip = |bytes: &[u8]| match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        _ => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
    };
    map.keys()
        .filter(|k| k.get(daddr.clone()).and_then(ip) == Some(dst))
        .count()
}

#[test]
fn fragmented_datagrams_between_pods_arrive_without_policy() {
    let _serial = serial();
    let agent = agent();
    let [a, b] = pods(&agent, ["a", "b"]);
    let servers: Vec<UdpServer> = b
        .ips()
        .map(|ip| UdpServer::start(&b.ns, SocketAddr::new(ip, 5000), "b").expect("udp server"))
        .into();
    for (ip, from_a) in b.ips().into_iter().zip(a.ips()) {
        let to_b = SocketAddr::new(ip, 5000);
        for size in sizes(ip) {
            assert_eq!(
                exchange(&a.ns, to_b, size).as_deref(),
                Some("b"),
                "a -> {to_b}, UDP with {size} bytes, and the answer of as many"
            );
        }
        assert!(
            probe::ping_size(&a.ns, ip, 2, 3000).expect("ping"),
            "a -> {ip}, ping -s 3000"
        );
        assert!(
            probe::ping_size(agent.node(), from_a, 2, 3000).expect("ping"),
            "the node -> {from_a}, ping -s 3000 (fragments through cel_to_container)"
        );
        // The first fragments left their ports for the later ones.
        assert!(recorded(&agent, ip) > 0, "no datagram to {ip} recorded");
    }
    drop(servers);
    assert_eq!(
        agent.datapath_drops().expect("metrics"),
        0,
        "{}",
        agent.metrics().expect("metrics")
    );
}

#[test]
fn an_l4_policy_admits_fragments_only_where_the_first_fragment_is_allowed() {
    let _serial = serial();
    let agent = agent();
    let [a, b, c] = pods(&agent, ["a", "b", "c"]);
    let _servers: Vec<UdpServer> = b
        .ips()
        .into_iter()
        .flat_map(|ip| [5000, 5001].map(|port| SocketAddr::new(ip, port)))
        .map(|to| UdpServer::start(&b.ns, to, "b").expect("udp server"))
        .collect();
    agent.apply_policy(r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: b-udp-5000-from-a, namespace: default }
spec:
  podSelector: { matchLabels: { app: b } }
  policyTypes: [ Ingress ]
  ingress: [ { from: [ { podSelector: { matchLabels: { app: a } } } ], ports: [ { port: 5000, protocol: UDP } ] } ]
"#).expect("the policy is enforced");
    let orphans = || {
        counter(&agent, "ingress", "first fragment not seen")
            + counter(&agent, "egress", "first fragment not seen")
    };
    let before = orphans();
    for ip in b.ips() {
        let (allowed, other) = (SocketAddr::new(ip, 5000), SocketAddr::new(ip, 5001));
        for size in sizes(ip) {
            assert_eq!(
                exchange(&a.ns, allowed, size).as_deref(),
                Some("b"),
                "a -> {allowed} with {size} bytes"
            );
        }
        let denied = counter(&agent, "ingress", "policy default deny");
        assert_eq!(exchange(&a.ns, other, 8000), None, "a -> {other}");
        assert_eq!(exchange(&c.ns, allowed, 8000), None, "c -> {allowed}");
        assert!(
            !probe::ping_size(&a.ns, ip, 1, 3000).expect("ping"),
            "a -> {ip}, ping -s 3000"
        );
        // Every fragment of the denied datagrams met the policy with its first's ports:
        // 8,008 bytes of UDP take six fragments, 3,008 of ICMP three.
        let now = counter(&agent, "ingress", "policy default deny");
        assert!(now >= denied + 6 + 6 + 3, "{ip}: {denied} -> {now}");
    }
    assert_eq!(orphans(), before, "a fragment lost its first");
}

#[test]
fn fragmented_datagrams_reach_a_cluster_ip_and_its_answers_come_from_it() {
    let _serial = serial();
    let agent = agent();
    let [client, web] = pods(&agent, ["client", "web"]);
    let _servers: Vec<UdpServer> = web
        .ips()
        .map(|ip| UdpServer::start(&web.ns, SocketAddr::new(ip, 5353), "web").expect("udp server"))
        .into();
    agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: dns }\nspec: { ipFamilyPolicy: RequireDualStack, selector: { app: web }, ports: [ { port: 53, targetPort: 5353, protocol: UDP } ] }\n",
        )
        .expect("apply the service");
    let mut vips = Vec::new();
    eventually("both frontends have their backend", || {
        let list = agent.cli_json(&["service", "list"]).expect("service list");
        vips = list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f: &Value| {
                let ip: IpAddr = f["vip"].as_str()?.parse().ok()?;
                (f["backends"].as_array()?.len() == 1).then_some(ip)
            })
            .collect();
        vips.len() == 2
    });
    for vip in vips.iter().map(|ip| SocketAddr::new(*ip, 53)) {
        for size in sizes(vip.ip()) {
            let reply = probe::udp_exchange(&client.ns, vip, &payload(size), TIMEOUT)
                .unwrap_or_else(|e| panic!("client -> {vip} with {size} bytes: {e}"));
            assert_eq!(reply.banner, "web");
            assert_eq!(reply.from, vip, "the answer comes from the cluster IP");
        }
    }
    assert_eq!(agent.datapath_drops().expect("metrics"), 0);
}

#[test]
fn a_fragment_whose_first_was_never_seen_is_dropped_and_counted() {
    let _serial = serial();
    let agent = agent();
    let [a, b] = pods(&agent, ["a", "b"]);
    let (la, lb) = (
        agent.endpoint_link(a.v4.into()),
        agent.endpoint_link(b.v4.into()),
    );
    let fragment = |src, dst, id, offset, more, payload: Vec<u8>| Ipv4Packet {
        src,
        dst,
        protocol: UDP,
        id,
        offset,
        more,
        payload,
    };
    let (egress, ingress, reason) = ("egress", "ingress", "first fragment not seen");

    // From a pod: a last fragment (offset 1,480 bytes) of a datagram nobody began.
    let before = counter(&agent, egress, reason);
    let lone = fragment(a.v4, b.v4, 0x4242, 185, false, vec![0x5a; 64]);
    frame::send(&a.ns, "eth0", lone.frame(la.pod_mac, la.host_mac)).expect("send");
    eventually("the lone fragment is counted", || {
        counter(&agent, egress, reason) == before + 1
    });
    // Its first fragment (a UDP header to b:5000 and eight bytes), then the same last one:
    // it follows its first now.
    let mut first = vec![0x30, 0x39, 0x13, 0x88, 0, 80, 0, 0];
    first.extend_from_slice(&[0x5a; 8]);
    let forwarded = counter(&agent, egress, "forwarded");
    for packet in [
        fragment(a.v4, b.v4, 0x4343, 0, true, first),
        fragment(a.v4, b.v4, 0x4343, 2, false, vec![0x5a; 56]),
    ] {
        frame::send(&a.ns, "eth0", packet.frame(la.pod_mac, la.host_mac)).expect("send");
    }
    eventually("both fragments are forwarded", || {
        counter(&agent, egress, "forwarded") >= forwarded + 2
    });
    assert_eq!(counter(&agent, egress, reason), before + 1);

    // From the node, into a pod (cel_to_container): the same.
    let before = counter(&agent, ingress, reason);
    let lone = fragment(
        Ipv4Addr::new(10, 99, 0, 10),
        b.v4,
        0x4444,
        185,
        false,
        vec![0; 64],
    );
    frame::send(
        agent.node(),
        &lb.host_ifname,
        lone.frame(lb.host_mac, lb.pod_mac),
    )
    .expect("send");
    eventually("the lone fragment to b is counted", || {
        counter(&agent, ingress, reason) == before + 1
    });

    // IPv6: a lone last fragment, then a first and its last; from the node too.
    let before = counter(&agent, egress, reason);
    let udp = || Ipv6Packet::udp(a.v6, b.v6);
    let lone = udp().fragment(0x4242_4242, 185, false);
    frame::send(&a.ns, "eth0", lone.frame(la.pod_mac, la.host_mac)).expect("send");
    eventually("the lone IPv6 fragment is counted", || {
        counter(&agent, egress, reason) == before + 1
    });
    let forwarded = counter(&agent, egress, "forwarded");
    let mut last = udp();
    last.rest = vec![0x5a; 56];
    for packet in [
        udp().fragment(0x4343_4343, 0, true),
        last.fragment(0x4343_4343, 1, false),
    ] {
        frame::send(&a.ns, "eth0", packet.frame(la.pod_mac, la.host_mac)).expect("send");
    }
    eventually("both IPv6 fragments are forwarded", || {
        counter(&agent, egress, "forwarded") >= forwarded + 2
    });
    assert_eq!(counter(&agent, egress, reason), before + 1);
    let before = counter(&agent, ingress, reason);
    let lone = Ipv6Packet::udp("fd00:99::10".parse().unwrap(), b.v6).fragment(7, 185, false);
    frame::send(
        agent.node(),
        &lb.host_ifname,
        lone.frame(lb.host_mac, lb.pod_mac),
    )
    .expect("send");
    eventually("the lone IPv6 fragment to b is counted", || {
        counter(&agent, ingress, reason) == before + 1
    });
}

//! IPv6 at parity with IPv4: dual-stack and IPv6-only pods through the real `cellium-cni`,
//! policy (identities, CIDR rules and ipBlocks per family, the world split by family, deny
//! rules) enforced on IPv6 as on IPv4, conntrack, source anti-spoofing, the link-local control
//! both stacks need, neighbour discovery of the pods' gateway answered by the datapath, and
//! extension-header chains the datapath does not parse dropped and counted.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test ipv6 -- --test-threads=1`.
//!
//! Every test makes its own agent, node, pod and external namespaces and removes them
//! (guards), and sends traffic only to addresses inside them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use cellium_integration::agent::pod_objects;
use cellium_integration::cni::{result_ipv4, result_ipv6};
use cellium_integration::frame::{
    self, DSTOPTS, ECHO_REQUEST, HOPOPTS, Ipv6Packet, MLD2_REPORT, MOBILITY, ROUTING,
};
use cellium_integration::lab::External;
use cellium_integration::lab::external::{EXT_ADDRS, EXT_ADDRS6};
use cellium_integration::probe::{self, TcpServer, UdpServer};
use cellium_integration::wait::eventually;
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use libbpf_rs::{MapCore, MapHandle};

const TIMEOUT: Duration = Duration::from_secs(3);
const SHORT: Duration = Duration::from_millis(700);
const POD_CIDR4: &str = "10.244.0.0/24";
const POD_CIDR6: &str = "fd00:10:244::/112";

/// A pod made through the plugin: dual-stack, or IPv6 only (`v4` unset).
struct Pod {
    ns: NetNs,
    v4: Option<Ipv4Addr>,
    v6: Ipv6Addr,
}

impl Pod {
    fn v4(&self) -> Ipv4Addr {
        self.v4.expect("a dual-stack pod")
    }
}

fn agent_with(pod_cidrs: &[&str]) -> Agent {
    Agent::start_new(AgentOptions {
        pod_cidrs: pod_cidrs.iter().map(|c| c.to_string()).collect(),
        ..AgentOptions::default()
    })
    .expect("start the agent")
}

fn agent() -> Agent {
    agent_with(&[POD_CIDR4, POD_CIDR6])
}

/// Applies the Pod objects `default/<name>` with `app: <name>` and makes the pods, checking
/// right away, before anything else can happen, that each IPv6 address is usable (not
/// `tentative`).
fn pods<const N: usize>(agent: &Agent, names: [&str; N]) -> [Pod; N] {
    agent
        .objects("apply", &pod_objects(&names))
        .expect("apply pods");
    names.map(|name| add(agent, name))
}

fn add(agent: &Agent, name: &str) -> Pod {
    let ns = NetNs::new().expect("pod netns");
    let call = CniCall::new("ADD", &format!("v6{name}x{}", std::process::id()))
        .netns(ns.path())
        .args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
    let (status, result) = agent.cni(&call).expect("run the plugin");
    assert!(status.success(), "ADD {name}: {result}");
    let v6 = result_ipv6(&result).unwrap_or_else(|| panic!("no IPv6 in {result}"));
    let shown = ns
        .ip(&["-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"])
        .expect("ip addr");
    assert!(shown.contains(&format!("{v6}/128")), "{shown}");
    assert!(
        !shown.contains("tentative"),
        "{v6} is not usable when ADD returns: {shown}"
    );
    Pod {
        ns,
        v4: result_ipv4(&result),
        v6,
    }
}

/// The IPv6 pool's router address: the pods' IPv6 gateway, on the node.
fn router6(agent: &Agent) -> Ipv6Addr {
    let pools = agent.pools().expect("ipam list");
    pools
        .iter()
        .filter_map(|p| p["router"].as_str()?.parse().ok())
        .find_map(|ip: IpAddr| match ip {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        })
        .unwrap_or_else(|| panic!("no IPv6 router in {pools:?}"))
}

fn counter(agent: &Agent, direction: &str, reason: &str) -> u64 {
    agent.datapath_packets(direction, reason).expect("metrics")
}

fn ping(from: &NetNs, to: impl Into<IpAddr>) -> bool {
    probe::ping(from, to, 1).expect("ping")
}

/// The sources of the agent's pinned IPv6 connection table, read as another process would.
fn ct6_sources(agent: &Agent) -> Vec<Ipv6Addr> {
    let map = MapHandle::from_pinned_path(agent.bpf_root().join("maps/cel_ct6"))
        .expect("open the pinned IPv6 conntrack map");
    map.keys()
        .filter_map(|k| Some(Ipv6Addr::from(<[u8; 16]>::try_from(k.get(..16)?).ok()?)))
        .collect()
}

#[test]
fn dual_stack_pods_reach_each_other_the_node_and_the_outside_over_ipv6_without_policy() {
    let _serial = serial();
    let agent = agent();
    let [a, b, c] = pods(&agent, ["a", "b", "c"]);
    let ext = external(&agent);
    let gw6 = router6(&agent);
    let notes = &agent.cli_json(&["status"]).expect("cellium status -o json")["notes"];
    assert!(
        notes.as_array().is_none_or(Vec::is_empty),
        "nothing left to warn about: {notes}"
    );

    assert!(ping(&a.ns, b.v6), "a -> b over IPv6");
    assert!(ping(&b.ns, c.v6), "b -> c over IPv6");
    assert!(ping(&a.ns, gw6), "a -> the node ({gw6})");
    assert!(ping(agent.node(), c.v6), "the node -> c");
    eventually("a -> the outside over IPv6", || ping(&a.ns, EXT_ADDRS6[0]));
    assert!(ping(ext.netns(), c.v6), "the outside -> c over IPv6");
    let _tcp = TcpServer::start(&b.ns, SocketAddr::new(b.v6.into(), 8080), "b").unwrap();
    let reply = probe::tcp_request(&a.ns, SocketAddr::new(b.v6.into(), 8080), TIMEOUT).unwrap();
    assert_eq!(reply.banner, "b");
    let _udp = UdpServer::start(&c.ns, SocketAddr::new(c.v6.into(), 5353), "c").unwrap();
    let reply = probe::udp_request(&a.ns, SocketAddr::new(c.v6.into(), 5353), TIMEOUT).unwrap();
    assert_eq!(reply.banner, "c");
    assert!(ping(&a.ns, b.v4()), "a -> b over IPv4");
    // Conntrack of IPv6, in its own table.
    assert!(
        ct6_sources(&agent).contains(&a.v6),
        "no IPv6 connection from a"
    );
    // Neighbour discovery, duplicate address detection and listener reports of every pod and
    // of the node all passed: nothing was dropped.
    assert_eq!(
        agent.datapath_drops().unwrap(),
        0,
        "{}",
        agent.metrics().unwrap()
    );
}

#[test]
fn ipv6_follows_the_policy_as_ipv4_does() {
    let _serial = serial();
    let agent = agent();
    let [a, b, c] = pods(&agent, ["a", "b", "c"]);
    let servers: Vec<TcpServer> = [IpAddr::from(b.v4()), b.v6.into()]
        .into_iter()
        .map(|ip| TcpServer::start(&b.ns, SocketAddr::new(ip, 8080), "b").unwrap())
        .collect();
    agent.apply_policy(r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: b-from-a, namespace: default }
spec:
  podSelector: { matchLabels: { app: b } }
  policyTypes: [ Ingress ]
  ingress: [ { from: [ { podSelector: { matchLabels: { app: a } } } ], ports: [ { port: 8080, protocol: TCP } ] } ]
"#).expect("the policy is enforced");
    let denied = counter(&agent, "ingress", "policy default deny");
    for server in &servers {
        let to = server.addr();
        assert_eq!(
            probe::tcp_request(&a.ns, to, TIMEOUT).unwrap().banner,
            "b",
            "a -> {to}"
        );
        assert!(probe::tcp_connect(&c.ns, to, SHORT).is_err(), "c -> {to}");
        assert!(!ping(&a.ns, to.ip()), "a pings {}", to.ip());
        // allow-localhost, and replies to b's own requests.
        assert!(ping(agent.node(), to.ip()), "the node -> {}", to.ip());
    }
    assert!(ping(&b.ns, a.v6), "b -> a over IPv6 (the reply enters b)");
    assert!(ping(&b.ns, a.v4()), "b -> a over IPv4");
    assert!(ping(&a.ns, c.v6), "a -> c, whom no policy selects");
    assert!(
        counter(&agent, "ingress", "policy default deny") >= denied + 4,
        "{}",
        agent.metrics().unwrap()
    );
}

/// The lab's network outside the cluster, routed through the node: `10.99.0.10`, `10.99.0.20`,
/// `fd00:99::10` and `fd00:99::20`, external addresses for CIDR rules. Dropping it removes it
/// (and the node's end of its link).
fn external(agent: &Agent) -> External {
    External::attach(agent.node(), &[POD_CIDR4.into(), POD_CIDR6.into()]).expect("external netns")
}

#[test]
fn cidr_rules_entities_and_deny_rules_apply_per_family() {
    let _serial = serial();
    let agent = agent();
    let [a, b, c, d, e] = pods(&agent, ["a", "b", "c", "d", "e"]);
    let ext = external(&agent);
    // The external side of the node's link: in no rule's prefix, so the world itself.
    let (link4, link6) = (
        Ipv4Addr::new(10, 98, 0, 2),
        "fd00:98::2".parse::<Ipv6Addr>().unwrap(),
    );
    let ([(_, x10), (_, x20)], [y10, y20]) = (EXT_ADDRS, EXT_ADDRS6);
    eventually("a -> fd00:99::10 before any policy", || ping(&a.ns, y10));
    assert!(ping(&a.ns, x10), "a -> 10.99.0.10 before any policy");

    agent
        .apply_policy(
            r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: c-not-from-a, namespace: default }
spec:
  endpointSelector: { matchLabels: { app: c } }
  enableDefaultDeny: { ingress: false }
  ingressDeny: [ { fromEndpoints: [ { matchLabels: { app: a } } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: a-not-to-y10, namespace: default }
spec:
  endpointSelector: { matchLabels: { app: a } }
  egress: [ { toEntities: [ all ] } ]
  egressDeny: [ { toCIDR: [ "fd00:99::10/128" ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: b-to-the-ipv6-world, namespace: default }
spec:
  endpointSelector: { matchLabels: { app: b } }
  egress: [ { toEntities: [ world-ipv6 ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: e-to-the-ipv4-world, namespace: default }
spec:
  endpointSelector: { matchLabels: { app: e } }
  egress: [ { toEntities: [ world-ipv4 ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: d-to-an-ipv6-block, namespace: default }
spec:
  podSelector: { matchLabels: { app: d } }
  policyTypes: [ Egress ]
  egress: [ { to: [ { ipBlock: { cidr: "fd00:99::/64", except: [ "fd00:99::20/128" ] } } ] } ]
"#,
        )
        .expect("the policy is enforced");
    // ingressDeny: from a, in both families; everyone else still gets in.
    assert!(!ping(&a.ns, c.v4()), "a -> c over IPv4");
    assert!(!ping(&a.ns, c.v6), "a -> c over IPv6");
    assert!(ping(agent.node(), c.v6), "the node -> c over IPv6");
    // egressDeny of one IPv6 address; the allow-all covers the rest, IPv4 included.
    assert!(!ping(&a.ns, y10), "a -> fd00:99::10");
    assert!(ping(&a.ns, y20), "a -> fd00:99::20");
    assert!(ping(&a.ns, x10) && ping(&a.ns, x20), "a -> the IPv4 world");
    assert!(ping(&a.ns, b.v6), "a -> b over IPv6");
    // world-ipv6: the IPv6 world only (addresses outside every prefix are world-ipv6 on a
    // dual-stack node, those inside IPv6 CIDR identities), neither the IPv4 world nor pods;
    // world-ipv4 the other way round.
    assert!(ping(&b.ns, y10) && ping(&b.ns, y20), "b -> the IPv6 CIDRs");
    assert!(ping(&b.ns, link6), "b -> fd00:98::2, outside every prefix");
    assert!(
        !ping(&b.ns, x10) && !ping(&b.ns, link4),
        "b -> the IPv4 world"
    );
    assert!(!ping(&b.ns, a.v6), "b -> a over IPv6");
    assert!(
        ping(&e.ns, x10) && ping(&e.ns, link4),
        "e -> the IPv4 world"
    );
    assert!(
        !ping(&e.ns, y10) && !ping(&e.ns, link6),
        "e -> the IPv6 world"
    );
    assert!(!ping(&e.ns, a.v4()), "e -> a over IPv4");
    // An IPv6 ipBlock selects IPv6 addresses only.
    assert!(ping(&d.ns, y10), "d -> fd00:99::10");
    assert!(!ping(&d.ns, y20), "d -> fd00:99::20 (the exception)");
    assert!(!ping(&d.ns, x10), "d -> 10.99.0.10");
    assert!(!ping(&d.ns, a.v6), "d -> a over IPv6");
    // What the outside sends to pods meets their ingress: c denies only a.
    assert!(ping(ext.netns(), c.v6), "fd00:98::2 -> c");
}

#[test]
fn a_pod_cannot_send_from_an_ipv6_address_it_does_not_own() {
    let _serial = serial();
    let agent = agent();
    let [a, b, c] = pods(&agent, ["a", "b", "c"]);
    let receiver =
        c.ns.run(move || -> std::io::Result<UdpSocket> {
            let sock = UdpSocket::bind(SocketAddr::new(c.v6.into(), 7000))?;
            sock.set_read_timeout(Some(SHORT))?;
            Ok(sock)
        })
        .unwrap()
        .expect("bind in c");
    // Sends from `src`, an address put on a's interface, to c; returns how many c received.
    let send_from = |src: Ipv6Addr, count: u32| -> u32 {
        a.ns.ip(&["addr", "add", &format!("{src}/128"), "dev", "eth0", "nodad"])
            .expect("addr add");
        let dst = SocketAddr::new(c.v6.into(), 7000);
        a.ns.run(move || -> std::io::Result<()> {
            let sock = UdpSocket::bind(SocketAddr::new(src.into(), 0))?;
            for _ in 0..count {
                sock.send_to(b"spoofed", dst)?;
            }
            Ok(())
        })
        .unwrap()
        .expect("send");
        a.ns.ip(&["addr", "del", &format!("{src}/128"), "dev", "eth0"])
            .expect("addr del");
        let mut got = 0;
        let mut buf = [0u8; 64];
        while receiver.recv_from(&mut buf).is_ok() {
            got += 1;
        }
        got
    };
    // A genuine datagram arrives (so the receiver and the path work).
    let own = SocketAddr::new(a.v6.into(), 0);
    let to_c = SocketAddr::new(c.v6.into(), 7000);
    let mut buf = [0u8; 64];
    eventually("a datagram from a's own address reaches c", || {
        a.ns.run(move || UdpSocket::bind(own)?.send_to(b"own", to_c))
            .unwrap()
            .expect("send");
        receiver.recv_from(&mut buf).is_ok()
    });

    let before = counter(&agent, "egress", "invalid source");
    let unallocated: Ipv6Addr = "fd00:10:244::99".parse().unwrap();
    assert_eq!(
        send_from(unallocated, 5),
        0,
        "c received from an unallocated address"
    );
    assert_eq!(
        send_from(b.v6, 5),
        0,
        "c received from b's address, sent by a"
    );
    let after = counter(&agent, "egress", "invalid source");
    assert!(
        after >= before + 10,
        "{before} -> {after}: {}",
        agent.metrics().unwrap()
    );
}

#[test]
fn the_datapath_answers_a_pods_neighbour_solicitation_for_its_gateway() {
    let _serial = serial();
    let agent = agent();
    let [a, b] = pods(&agent, ["a", "b"]);
    let gw6 = router6(&agent);
    // a may send to b only: its solicitations are not traffic to anyone.
    agent
        .apply_policy(
            r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: a-to-b, namespace: default }
spec:
  podSelector: { matchLabels: { app: a } }
  policyTypes: [ Egress ]
  egress: [ { to: [ { podSelector: { matchLabels: { app: b } } } ] } ]
"#,
        )
        .expect("the policy is enforced");
    let host_mac = agent.endpoint_link(a.v6.into()).host_mac;
    let gw = gw6.to_string();
    // The permanent entry gone, a must solicit its gateway to reach anything.
    a.ns.ip(&["-6", "neigh", "del", &gw, "dev", "eth0"])
        .expect("neigh del");
    assert!(
        ping(&a.ns, b.v6),
        "a -> b through a gateway it had to solicit"
    );
    let entry =
        a.ns.ip(&["-6", "neigh", "show", &gw, "dev", "eth0"])
            .expect("neigh show");
    let mac = format_mac(host_mac);
    assert!(
        entry.contains(&mac) && !entry.contains("PERMANENT"),
        "the gateway resolved to the host end's MAC {mac}: {entry}"
    );
    // Once stale, the entry is confirmed by a unicast solicitation, answered the same way.
    a.ns.ip(&[
        "-6", "neigh", "change", &gw, "dev", "eth0", "lladdr", &mac, "nud", "stale",
    ])
    .expect("neigh change");
    assert!(ping(&a.ns, b.v6), "a -> b with a stale gateway entry");
    // After the first probe delay (5 s), a unicast solicitation to the gateway's address;
    // unanswered, the entry would fail.
    let began = Instant::now();
    loop {
        let entry =
            a.ns.ip(&["-6", "neigh", "show", &gw, "dev", "eth0"])
                .expect("neigh show");
        if entry.contains("REACHABLE") {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(15) && !entry.contains("FAILED"),
            "the stale entry is never confirmed: {entry} (drops: {:?})",
            drops(&agent)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        agent.datapath_drops().unwrap(),
        0,
        "{}",
        agent.metrics().unwrap()
    );
}

fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn ipv6_only_pods_reach_each_other_and_follow_policy() {
    let _serial = serial();
    let agent = agent_with(&[POD_CIDR6]);
    let [a, b, c] = pods(&agent, ["a", "b", "c"]);
    assert!(a.v4.is_none(), "an IPv6-only pod has no IPv4 address");
    let gw6 = router6(&agent);
    assert!(ping(&a.ns, b.v6), "a -> b");
    assert!(ping(&a.ns, gw6), "a -> the node");
    let _tcp = TcpServer::start(&b.ns, SocketAddr::new(b.v6.into(), 8080), "b").unwrap();
    agent
        .apply_policy(
            r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: b-from-a, namespace: default }
spec:
  podSelector: { matchLabels: { app: b } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: a } } } ] } ]
"#,
        )
        .expect("the policy is enforced");
    let to_b = SocketAddr::new(b.v6.into(), 8080);
    assert_eq!(
        probe::tcp_request(&a.ns, to_b, TIMEOUT).unwrap().banner,
        "b"
    );
    assert!(probe::tcp_connect(&c.ns, to_b, SHORT).is_err(), "c -> b");
    assert!(ping(agent.node(), b.v6), "the node -> b");
    assert!(ping(&b.ns, c.v6), "b -> c, and the reply back in");
}

#[test]
fn the_cli_shows_ipv6_as_it_shows_ipv4() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions {
        pod_cidrs: vec![POD_CIDR4.into(), POD_CIDR6.into()],
        env: vec![(
            "CELLIUM_SERVICE_CIDR".into(),
            "10.96.0.0/16,fd00:10:96::/108".into(),
        )],
        ..AgentOptions::default()
    })
    .expect("start the agent");
    let [a] = pods(&agent, ["a"]);
    let gw6 = router6(&agent);
    agent.apply_policy(r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: a-out, namespace: default }
spec:
  endpointSelector: { matchLabels: { app: a } }
  egress: [ { toCIDR: [ "fd00:99::/64" ], toPorts: [ { ports: [ { port: "443", protocol: TCP } ] } ] } ]
---
apiVersion: v1
kind: Service
metadata: { name: web }
spec: { ipFamilyPolicy: PreferDualStack, selector: { app: a }, ports: [ { port: 80 } ] }
"#).expect("the policy is enforced");
    let id = agent.endpoints().expect("endpoints")[0]["id"]
        .as_u64()
        .expect("an id")
        .to_string();
    // endpoint get: both addresses and both gateways, the IPv6 CIDR peer with its port.
    let ep = agent.cli(&["endpoint", "get", &id]).expect("endpoint get");
    for text in [
        format!("{}/32, {}/128", a.v4(), a.v6),
        format!(", {gw6}"),
        "cidr:fd00-99--0/64".into(),
        "443/tcp".into(),
    ] {
        assert!(ep.contains(&text), "no {text:?} in:\n{ep}");
    }
    // ipcache: the pod's /128 from its endpoint, the node's router address, the rule's prefix;
    // an address outside every prefix is the world of its family on a dual-stack node.
    let list = agent.cli(&["ipcache", "list"]).expect("ipcache list");
    let identity = agent.endpoints().expect("endpoints")[0]["identity"].to_string();
    for (prefix, who, source) in [
        (format!("{}/128", a.v6), identity.as_str(), "endpoint"),
        (format!("{gw6}/128"), "1", "host"),
        ("fd00:99::/64".to_string(), "16777216", "policy"),
    ] {
        let row = [prefix.as_str(), who, source];
        assert!(
            list.lines().any(|l| l.split_whitespace().take(3).eq(row)),
            "no {row:?} in:\n{list}"
        );
    }
    let got = agent
        .cli_json(&["ipcache", "get", &a.v6.to_string()])
        .expect("ipcache get");
    assert_eq!(got["prefix"], format!("{}/128", a.v6));
    for (ip, world) in [("fd00:77::1", 10), ("10.77.0.1", 9)] {
        let text = agent.cli(&["ipcache", "get", ip]).expect("ipcache get");
        assert!(
            text.contains(&format!("world (identity {world})")),
            "{ip}: {text}"
        );
    }
    // policy get: the rule with its IPv6 CIDR selector and the identity behind it.
    let policy = agent.cli_json(&["policy", "get"]).expect("policy get");
    let peers = policy["rules"].to_string();
    assert!(peers.contains("cidr:fd00-99--0/64"), "{policy}");
    // service list: a frontend per family, IPv6 ones bracketed.
    let services = agent.cli(&["service", "list"]).expect("service list");
    assert!(
        services.contains(&format!("[{}]:80", a.v6))
            && services.contains(&format!("{}:80", a.v4())),
        "{services}"
    );
    assert!(services.contains("[fd00:10:96::"), "{services}");
}

/// Every drop counter of the agent's datapath, by its labels.
fn drops(agent: &Agent) -> BTreeMap<String, u64> {
    agent
        .metrics()
        .expect("metrics")
        .lines()
        .filter(|l| l.starts_with("cellium_datapath_packets") && !l.contains("\"forwarded\""))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// What a hand-made packet must meet: nothing (it passes, no drop counted), or exactly one
/// drop under (direction, reason).
#[derive(Debug, Clone, Copy)]
enum Verdict {
    Pass,
    Drop(&'static str, &'static str),
}

/// Sends `bytes` on `ifname` in `ns` and checks the verdict against the agent's counters.
fn expect(
    agent: &Agent,
    case: &str,
    (ns, ifname): (&NetNs, &str),
    bytes: Vec<u8>,
    verdict: Verdict,
) {
    let before = drops(agent);
    let total = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
    frame::send(ns, ifname, bytes).expect("send the frame");
    match verdict {
        Verdict::Pass => {
            std::thread::sleep(Duration::from_millis(300));
            let after = drops(agent);
            assert_eq!(
                total(&after),
                total(&before),
                "{case}: dropped ({before:?} -> {after:?})"
            );
        }
        Verdict::Drop(direction, reason) => {
            let key = format!(
                "cellium_datapath_packets_total{{direction=\"{direction}\",reason=\"{reason}\"}}"
            );
            let was = before.get(&key).copied().unwrap_or(0);
            eventually(&format!("{case}: a drop under {key}"), || {
                drops(agent).get(&key).copied().unwrap_or(0) > was
            });
            let after = drops(agent);
            assert_eq!(
                total(&after),
                total(&before) + 1,
                "{case}: {before:?} -> {after:?}"
            );
        }
    }
}

#[test]
fn link_local_control_passes_and_everything_else_meets_policy_or_is_dropped() {
    use Verdict::{Drop, Pass};
    let _serial = serial();
    let agent = agent();
    let [locked, open] = pods(&agent, ["locked", "open"]);
    agent
        .apply_policy(
            r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: lock, namespace: default }
spec: { podSelector: { matchLabels: { app: locked } }, policyTypes: [ Ingress, Egress ] }
"#,
        )
        .expect("the policy is enforced");
    let (l, o) = (
        agent.endpoint_link(locked.v6.into()),
        agent.endpoint_link(open.v6.into()),
    );
    // The node's link-local address on locked's link (what locked's neighbour unreachability
    // detection probes), a link-local address of locked's own choosing, one that no one has.
    let host_ll = link_local(&agent, &l.host_ifname);
    let (ll, nobody): (Ipv6Addr, Ipv6Addr) =
        ("fe80::1234".parse().unwrap(), "fe80::1".parse().unwrap());
    let unspecified = Ipv6Addr::UNSPECIFIED;
    let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
    let (egress, ingress) = ("egress", "ingress");
    let (spoofed, denied) = ("invalid source", "policy default deny");
    let chain = "unsupported extension header";
    let solicit = Ipv6Packet::solicitation;

    // From the pod whose egress is enforced.
    let cases = [
        (
            "DAD solicitation",
            solicit(unspecified, solicited(locked.v6), locked.v6),
            Pass,
        ),
        (
            "solicitation from link-local",
            solicit(ll, solicited(host_ll), host_ll),
            Pass,
        ),
        (
            "solicitation from its own address",
            solicit(locked.v6, host_ll, host_ll),
            Pass,
        ),
        ("listener report", Ipv6Packet::listener_report(ll), Pass),
        (
            "unicast solicitation for the gateway from link-local",
            solicit(ll, router6(&agent), router6(&agent)),
            Pass,
        ),
        (
            "solicitation with hop limit 254",
            solicit(ll, solicited(host_ll), host_ll).hop_limit(254),
            Drop(egress, spoofed),
        ),
        (
            "solicitation behind hop-by-hop options",
            solicit(ll, solicited(host_ll), host_ll).behind(HOPOPTS),
            Drop(egress, spoofed),
        ),
        (
            "listener report behind destination options",
            Ipv6Packet::icmp(ll, "ff02::16".parse().unwrap(), 1, &MLD2_REPORT).behind(DSTOPTS),
            Drop(egress, spoofed),
        ),
        (
            "listener report with hop limit 2",
            Ipv6Packet::listener_report(ll).hop_limit(2),
            Drop(egress, spoofed),
        ),
        (
            "solicitation from link-local to a routable address",
            solicit(ll, open.v6, open.v6),
            Drop(egress, spoofed),
        ),
        (
            "solicitation from its own address to a routable one",
            solicit(locked.v6, open.v6, open.v6),
            Drop(egress, denied),
        ),
        (
            "echo behind hop-by-hop options",
            Ipv6Packet::icmp(locked.v6, open.v6, 64, &ECHO_REQUEST).behind(HOPOPTS),
            Drop(egress, denied),
        ),
        (
            "udp behind a routing header with segments left",
            Ipv6Packet::udp(locked.v6, open.v6).behind_header(ROUTING, [4, 1, 0, 0, 0, 0]),
            Drop(egress, chain),
        ),
        (
            "udp behind a mobility header",
            Ipv6Packet::udp(locked.v6, open.v6).behind_header(MOBILITY, [0; 6]),
            Drop(egress, chain),
        ),
        (
            "udp behind nine destination options headers",
            (0..9).fold(Ipv6Packet::udp(locked.v6, open.v6), |p, _| {
                p.behind(DSTOPTS)
            }),
            Drop(egress, chain),
        ),
        (
            "udp behind a hop-by-hop header that is not first",
            Ipv6Packet::udp(locked.v6, open.v6)
                .behind(HOPOPTS)
                .behind(DSTOPTS),
            Drop(egress, chain),
        ),
        (
            "udp behind a routing header with none left, to whom policy denies",
            Ipv6Packet::udp(locked.v6, open.v6).behind_header(ROUTING, [4, 0, 0, 0, 0, 0]),
            Drop(egress, denied),
        ),
        (
            "a later fragment whose first was never seen",
            Ipv6Packet::udp(locked.v6, open.v6).fragment(0x0bad_cafe, 185, false),
            Drop(egress, "first fragment not seen"),
        ),
    ];
    for (case, packet, verdict) in cases {
        expect(
            &agent,
            case,
            (&locked.ns, "eth0"),
            packet.frame(l.pod_mac, l.host_mac),
            verdict,
        );
    }
    // From the pod without policy, to the one whose ingress is enforced.
    let cases = [
        (
            "udp behind destination options",
            Ipv6Packet::udp(open.v6, locked.v6).behind(DSTOPTS),
        ),
        (
            "solicitation to a routable address",
            solicit(open.v6, locked.v6, locked.v6),
        ),
    ];
    for (case, packet) in cases {
        expect(
            &agent,
            case,
            (&open.ns, "eth0"),
            packet.frame(o.pod_mac, o.host_mac),
            Drop(ingress, denied),
        );
    }
    // From the node, on the pods' host veths.
    let node = agent.node();
    let cases = [
        (
            "solicitation",
            &l,
            solicit(nobody, solicited(locked.v6), locked.v6),
            Pass,
        ),
        (
            "unicast solicitation",
            &l,
            solicit(nobody, locked.v6, locked.v6),
            Pass,
        ),
        (
            "listener report",
            &l,
            Ipv6Packet::listener_report(nobody),
            Pass,
        ),
        (
            "solicitation with hop limit 254",
            &l,
            solicit(nobody, locked.v6, locked.v6).hop_limit(254),
            Drop(ingress, denied),
        ),
        (
            "solicitation from a routable address",
            &l,
            solicit(open.v6, locked.v6, locked.v6),
            Drop(ingress, denied),
        ),
        (
            "udp behind a mobility header",
            &l,
            Ipv6Packet::udp(nobody, locked.v6).behind_header(MOBILITY, [0; 6]),
            Drop(ingress, chain),
        ),
        (
            "echo to all nodes: the node's own, on the link",
            &o,
            Ipv6Packet::icmp(nobody, all_nodes, 64, &ECHO_REQUEST),
            Pass,
        ),
        (
            "echo to the open pod",
            &o,
            Ipv6Packet::icmp(nobody, open.v6, 64, &ECHO_REQUEST),
            Pass,
        ),
    ];
    for (case, link, packet, verdict) in cases {
        let bytes = packet.frame(link.host_mac, link.pod_mac);
        expect(
            &agent,
            &format!("node: {case}"),
            (node, &link.host_ifname),
            bytes,
            verdict,
        );
    }
    // Non-IP frames (ARP) are not the datapath's business.
    let arp = frame::arp_request(l.pod_mac, locked.v4(), Ipv4Addr::new(10, 244, 0, 1));
    expect(&agent, "ARP request", (&locked.ns, "eth0"), arp, Pass);
}

/// The solicited-node multicast group of `a`.
fn solicited(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    let low = u16::from_be_bytes([o[14], o[15]]);
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(o[13]), low)
}

/// The link-local address of `ifname` in the agent's node.
fn link_local(agent: &Agent, ifname: &str) -> Ipv6Addr {
    agent
        .node()
        .ip(&["-6", "-o", "addr", "show", "dev", ifname, "scope", "link"])
        .expect("ip addr")
        .split_whitespace()
        .find_map(|w| w.strip_suffix("/64")?.parse().ok())
        .unwrap_or_else(|| panic!("no link-local address on {ifname}"))
}

/// BPF masquerading (on by default) of both families: a pod's connections to the outside
/// leave with the node's address of the link towards it, so the outside, its routes back to
/// the pod CIDRs removed, still answers TCP, UDP and ICMPv6 echo; the outside's own
/// connections to a pod keep their addresses both ways.
#[test]
fn pods_reach_an_outside_without_routes_to_them_masqueraded_in_both_families() {
    let _serial = serial();
    let agent = agent();
    let [a, b] = pods(&agent, ["a", "b"]);
    let ext = external(&agent);
    let node4 = IpAddr::V4(Ipv4Addr::new(10, 98, 0, 1));
    let node6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x98, 0, 0, 0, 0, 0, 1));
    let to4 = SocketAddr::new(EXT_ADDRS[0].1.into(), 8080);
    let to6 = SocketAddr::new(EXT_ADDRS6[0].into(), 8080);
    let _peers = [to4, to6].map(|to| probe::PeerServer::start(ext.netns(), to).unwrap());
    let _b_tcp = TcpServer::start(&b.ns, SocketAddr::new(b.v6.into(), 8080), "b").unwrap();

    // The outside reaches b, and b's answers keep b's address (the outside's connection).
    let banner = probe::tcp_request(ext.netns(), SocketAddr::new(b.v6.into(), 8080), TIMEOUT);
    assert_eq!(banner.unwrap().banner, "b", "the outside -> b over IPv6");
    for cidr in [POD_CIDR4, POD_CIDR6] {
        ext.netns()
            .ip(&["route", "del", cidr])
            .expect("the outside forgets the pods");
    }
    for (to, node) in [(to4, node4), (to6, node6)] {
        eventually(&format!("a -> {to} seen as {node}"), || {
            probe::seen_from(&a.ns, to).ok() == Some(node)
        });
    }
    eventually("a pings the outside over IPv6", || {
        ping(&a.ns, EXT_ADDRS6[0])
    });
    assert!(ping(&a.ns, EXT_ADDRS[0].1), "a pings the outside over IPv4");
    let _udp = UdpServer::start(
        ext.netns(),
        SocketAddr::new(EXT_ADDRS6[1].into(), 5353),
        "x",
    )
    .unwrap();
    let reply = probe::udp_request(&a.ns, SocketAddr::new(EXT_ADDRS6[1].into(), 5353), TIMEOUT);
    assert_eq!(reply.unwrap().banner, "x", "a's UDP over IPv6, answered");
}

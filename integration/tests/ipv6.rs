//! IPv6 before the IPv6 datapath: dual-stack pods through the real `cellium-cni`, and a
//! datapath that lets IPv6 through only where no policy applies, never from an address the pod
//! does not own, and the link-local control both stacks need everywhere.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test ipv6 -- --test-threads=1`.
//!
//! Every test makes its own agent, node, pod and external namespaces and removes them
//! (guards), and sends traffic only to addresses inside them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use cellium_integration::cni::{result_ipv4, result_ipv6};
use cellium_integration::frame::{self, DSTOPTS, ECHO_REQUEST, HOPOPTS, Ipv6Packet, MLD2_REPORT};
use cellium_integration::probe::{self, TcpServer, UdpServer};
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs};

const TIMEOUT: Duration = Duration::from_secs(3);
const SHORT: Duration = Duration::from_millis(700);
const POD_CIDR4: &str = "10.244.0.0/24";
const POD_CIDR6: &str = "fd00:10:244::/112";

/// Tests share two cores and each runs an agent: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A dual-stack pod made through the plugin.
struct Pod {
    ns: NetNs,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
}

fn agent() -> Agent {
    Agent::start_new(AgentOptions {
        pod_cidrs: vec![POD_CIDR4.into(), POD_CIDR6.into()],
        ..AgentOptions::default()
    })
    .expect("start the agent")
}

/// The Pod objects `default/<name>` with `app: <name>`.
fn pod_objects(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {n}, labels: {{ app: {n} }} }}\nspec: {{ containers: [ {{ name: c }} ] }}\n---\n"
            )
        })
        .collect()
}

/// ADD of pod `default/<name>` as a kubelet makes it; checks right away, before anything else
/// can happen, that its IPv6 address is usable (not `tentative`).
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
    let v4 = result_ipv4(&result).unwrap_or_else(|| panic!("no IPv4 in {result}"));
    Pod { ns, v4, v6 }
}

/// The pools' router addresses: the pods' gateways, on the node.
fn routers(agent: &Agent) -> (Ipv4Addr, Ipv6Addr) {
    let pools = agent.pools().expect("ipam list");
    let router = |i: usize| pools[i]["router"].as_str().map(str::to_string);
    let (a, b) = (router(0).expect("router"), router(1).expect("router"));
    let (a, b): (IpAddr, IpAddr) = (a.parse().expect("ip"), b.parse().expect("ip"));
    match (a, b) {
        (IpAddr::V4(v4), IpAddr::V6(v6)) | (IpAddr::V6(v6), IpAddr::V4(v4)) => (v4, v6),
        _ => panic!("not one router per family: {pools:?}"),
    }
}

/// The datapath's packet counter for (direction, reason) from the agent's metrics; reasons as
/// the metrics name them ("forwarded", "invalid source", "ipv6 not enforced", ...).
fn packets(agent: &Agent, direction: &str, reason: &str) -> u64 {
    let labels = format!("direction=\"{direction}\",reason=\"{reason}\"");
    agent
        .metrics()
        .expect("metrics")
        .lines()
        .filter(|l| l.starts_with("cellium_datapath_packets") && l.contains(&labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn ping(from: &NetNs, to: impl Into<IpAddr>) -> bool {
    probe::ping(from, to, 1).expect("ping")
}

/// Polls `f` for up to 10 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let began = Instant::now();
    while !f() {
        assert!(began.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dual_stack_pods_reach_each_other_and_the_node_over_ipv6_without_policy() {
    let _serial = serial();
    let agent = agent();
    agent
        .objects("apply", &pod_objects(&["a", "b", "c"]))
        .expect("apply pods");
    let (a, b, c) = (add(&agent, "a"), add(&agent, "b"), add(&agent, "c"));
    let (_, gw6) = routers(&agent);
    assert!(
        agent.log().contains("IPv6 is not enforced"),
        "no warning at start: {}",
        agent.log()
    );
    let status = agent.cli(&["status"]).expect("cellium status");
    assert!(
        status.contains("IPv6 is not enforced"),
        "cellium status does not say so:\n{status}"
    );
    let notes = &agent.cli_json(&["status"]).expect("cellium status -o json")["notes"];
    assert!(
        notes.to_string().contains("IPv6 is not enforced"),
        "not in the JSON notes: {notes}"
    );

    assert!(ping(&a.ns, b.v6), "a -> b over IPv6");
    assert!(ping(&b.ns, c.v6), "b -> c over IPv6");
    assert!(ping(&a.ns, gw6), "a -> the node ({gw6})");
    assert!(ping(agent.node(), c.v6), "the node -> c");
    let _tcp = TcpServer::start(&b.ns, SocketAddr::new(b.v6.into(), 8080), "b").unwrap();
    let reply = probe::tcp_request(&a.ns, SocketAddr::new(b.v6.into(), 8080), TIMEOUT).unwrap();
    assert_eq!(reply.banner, "b");
    let _udp = UdpServer::start(&c.ns, SocketAddr::new(c.v6.into(), 5353), "c").unwrap();
    let reply = probe::udp_request(&a.ns, SocketAddr::new(c.v6.into(), 5353), TIMEOUT).unwrap();
    assert_eq!(reply.banner, "c");
    // IPv4 as before.
    assert!(ping(&a.ns, b.v4), "a -> b over IPv4");
    // Neighbour discovery, duplicate address detection and listener reports of every pod and
    // of the node all passed: nothing was dropped.
    assert_eq!(
        agent.datapath_drops().unwrap(),
        0,
        "{}",
        agent.metrics().unwrap()
    );
}

/// Applies `yaml` and waits until every endpoint enforces the resulting policy revision.
fn apply_policy(agent: &Agent, yaml: &str) {
    let revision = || {
        agent.cli_json(&["policy", "get"]).expect("policy get")["revision"]
            .as_u64()
            .expect("revision")
    };
    let before = revision();
    agent.objects("apply", yaml).expect("apply the policy");
    eventually("the repository takes the policy in", || revision() > before);
    let now = revision();
    eventually("every endpoint enforces it", || {
        agent
            .endpoints()
            .expect("endpoint list")
            .iter()
            .all(|e| e["state"] == "ready" && e["policy_revision"].as_u64().unwrap_or(0) >= now)
    });
}

#[test]
fn default_deny_ingress_drops_all_ipv6_to_the_pod_while_ipv4_follows_the_policy() {
    let _serial = serial();
    let agent = agent();
    agent
        .objects("apply", &pod_objects(&["a", "b", "c"]))
        .expect("apply pods");
    let (a, b, c) = (add(&agent, "a"), add(&agent, "b"), add(&agent, "c"));
    let _tcp4 = TcpServer::start(&b.ns, SocketAddr::new(b.v4.into(), 8080), "b").unwrap();
    let _tcp6 = TcpServer::start(&b.ns, SocketAddr::new(b.v6.into(), 8080), "b6").unwrap();
    let b6 = SocketAddr::new(b.v6.into(), 8080);
    assert!(
        probe::tcp_request(&a.ns, b6, TIMEOUT).is_ok(),
        "a -> b over IPv6 before"
    );

    apply_policy(
        &agent,
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: b-from-a, namespace: default }
spec:
  podSelector: { matchLabels: { app: b } }
  policyTypes: [ Ingress ]
  ingress: [ { from: [ { podSelector: { matchLabels: { app: a } } } ], ports: [ { port: 8080, protocol: TCP } ] } ]
"#,
    );
    let not_enforced = packets(&agent, "ingress", "ipv6 not enforced");
    // IPv4 follows the policy.
    let b4 = SocketAddr::new(b.v4.into(), 8080);
    assert_eq!(probe::tcp_request(&a.ns, b4, TIMEOUT).unwrap().banner, "b");
    assert!(
        probe::tcp_connect(&c.ns, b4, SHORT).is_err(),
        "c -> b over IPv4"
    );
    // IPv6 to b is dropped whatever the policy says, from pods and from the node alike; and
    // without IPv6 conntrack, replies to b's own IPv6 requests too.
    assert!(
        probe::tcp_connect(&a.ns, b6, SHORT).is_err(),
        "a -> b over IPv6"
    );
    assert!(!ping(&c.ns, b.v6), "c -> b over IPv6");
    assert!(!ping(agent.node(), b.v6), "the node -> b over IPv6");
    assert!(
        !ping(&b.ns, a.v6),
        "b -> a over IPv6 (the reply is dropped)"
    );
    assert!(
        packets(&agent, "ingress", "ipv6 not enforced") >= not_enforced + 4,
        "{}",
        agent.metrics().unwrap()
    );
    // Pods whose policy does not restrict IPv6 keep it.
    assert!(ping(&a.ns, c.v6), "a -> c over IPv6");
}

/// An IPv6 network outside the cluster, routed through the node, holding `fd00:99::10` and
/// `fd00:99::20`: external addresses for CIDR rules. Dropping it removes it (and the node's
/// end of its link).
fn external6(agent: &Agent) -> NetNs {
    let node = agent.node();
    let ext = NetNs::new().expect("external netns");
    node.ip(&[
        "link",
        "add",
        "celx6",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        ext.name(),
    ])
    .expect("veth");
    // Link-local addresses usable at once: the node resolves the external side from its own.
    node.sysctl("net.ipv6.conf.celx6.accept_dad", "0")
        .expect("sysctl");
    ext.sysctl("net.ipv6.conf.eth0.accept_dad", "0")
        .expect("sysctl");
    node.ip(&["addr", "add", "fd00:98::1/64", "dev", "celx6", "nodad"])
        .expect("addr");
    ext.ip(&["addr", "add", "fd00:98::2/64", "dev", "eth0", "nodad"])
        .expect("addr");
    for ip in ["fd00:99::10/128", "fd00:99::20/128"] {
        ext.ip(&["addr", "add", ip, "dev", "eth0", "nodad"])
            .expect("addr");
    }
    node.ip(&["link", "set", "celx6", "up"]).expect("up");
    ext.ip(&["link", "set", "eth0", "up"]).expect("up");
    node.ip(&["-6", "route", "add", "fd00:99::/64", "via", "fd00:98::2"])
        .expect("route");
    ext.ip(&["-6", "route", "add", POD_CIDR6, "via", "fd00:98::1"])
        .expect("route");
    ext
}

#[test]
fn cilium_deny_rules_stop_ipv6_ingress_deny_and_egress_deny_to_an_ipv6_cidr() {
    let _serial = serial();
    let agent = agent();
    agent
        .objects("apply", &pod_objects(&["a", "b", "c"]))
        .expect("apply pods");
    let (a, b, c) = (add(&agent, "a"), add(&agent, "b"), add(&agent, "c"));
    let _ext = external6(&agent);
    let (x10, x20): (Ipv6Addr, Ipv6Addr) = (
        "fd00:99::10".parse().unwrap(),
        "fd00:99::20".parse().unwrap(),
    );
    eventually("a -> fd00:99::10 before any policy", || ping(&a.ns, x10));
    assert!(ping(&b.ns, c.v6), "b -> c over IPv6 before any policy");

    apply_policy(
        &agent,
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
metadata: { name: a-not-to-x10, namespace: default }
spec:
  endpointSelector: { matchLabels: { app: a } }
  egress: [ { toEntities: [ all ] } ]
  egressDeny: [ { toCIDR: [ "fd00:99::10/128" ] } ]
"#,
    );
    let ingress = packets(&agent, "ingress", "ipv6 not enforced");
    let egress = packets(&agent, "egress", "ipv6 not enforced");
    // ingressDeny: IPv4 from a is denied, from b allowed; IPv6 to c stops from everyone.
    assert!(!ping(&a.ns, c.v4), "a -> c over IPv4 (denied)");
    assert!(ping(&b.ns, c.v4), "b -> c over IPv4 (what the deny leaves)");
    assert!(!ping(&a.ns, c.v6), "a -> c over IPv6");
    assert!(!ping(&b.ns, c.v6), "b -> c over IPv6");
    // egressDeny toCIDR: a's IPv6 stops, to the denied CIDR and everywhere else; a's IPv4
    // follows its allow-all rule; b's IPv6 is b's.
    assert!(!ping(&a.ns, x10), "a -> fd00:99::10");
    assert!(!ping(&a.ns, x20), "a -> fd00:99::20");
    assert!(!ping(&a.ns, b.v6), "a -> b over IPv6");
    assert!(ping(&a.ns, b.v4), "a -> b over IPv4");
    assert!(ping(&b.ns, x10), "b -> fd00:99::10");
    // a's IPv6 stops at a's own egress (to c too); b's to c at c's ingress.
    assert!(packets(&agent, "ingress", "ipv6 not enforced") > ingress);
    assert!(packets(&agent, "egress", "ipv6 not enforced") >= egress + 4);
}

#[test]
fn a_pod_cannot_send_from_an_ipv6_address_it_does_not_own() {
    let _serial = serial();
    let agent = agent();
    agent
        .objects("apply", &pod_objects(&["a", "b", "c"]))
        .expect("apply pods");
    let (a, b, c) = (add(&agent, "a"), add(&agent, "b"), add(&agent, "c"));
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

    let before = packets(&agent, "egress", "invalid source");
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
    let after = packets(&agent, "egress", "invalid source");
    assert!(
        after >= before + 10,
        "{before} -> {after}: {}",
        agent.metrics().unwrap()
    );
}

/// A pod's interface as the datapath sees it: the host end's name and both MACs.
struct Link {
    host_ifname: String,
    host_mac: [u8; 6],
    pod_mac: [u8; 6],
}

fn mac(text: &str) -> [u8; 6] {
    let mut out = [0u8; 6];
    for (b, part) in out.iter_mut().zip(text.split(':')) {
        *b = u8::from_str_radix(part, 16).expect("mac");
    }
    out
}

fn link_of(agent: &Agent, pod: &Pod) -> Link {
    let eps = agent.endpoints().expect("endpoint list");
    let ep = eps
        .iter()
        .find(|e| {
            e["addresses"].as_array().into_iter().flatten().any(|a| {
                a.as_str()
                    .is_some_and(|a| a.starts_with(&format!("{}/", pod.v6)))
            })
        })
        .unwrap_or_else(|| panic!("no endpoint with {} in {eps:?}", pod.v6));
    let text = |k: &str| {
        ep[k]
            .as_str()
            .unwrap_or_else(|| panic!("no {k} in {ep}"))
            .to_string()
    };
    Link {
        host_ifname: text("host_ifname"),
        host_mac: mac(&text("host_mac")),
        pod_mac: mac(&text("pod_mac")),
    }
}

/// Every drop counter of the agent's datapath, by its labels.
fn drops(agent: &Agent) -> std::collections::BTreeMap<String, u64> {
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
    let total = |m: &std::collections::BTreeMap<String, u64>| m.values().sum::<u64>();
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
fn only_unforwardable_link_local_control_passes_where_ipv6_is_not_enforced() {
    use Verdict::{Drop, Pass};
    let _serial = serial();
    let agent = agent();
    agent
        .objects("apply", &pod_objects(&["locked", "open"]))
        .expect("apply pods");
    let (locked, open) = (add(&agent, "locked"), add(&agent, "open"));
    apply_policy(
        &agent,
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: lock, namespace: default }
spec: { podSelector: { matchLabels: { app: locked } }, policyTypes: [ Ingress, Egress ] }
"#,
    );
    let (l, o) = (link_of(&agent, &locked), link_of(&agent, &open));
    // The node's link-local address on locked's link (what locked's neighbour unreachability
    // detection probes), a link-local address of locked's own choosing, one that no one has.
    let host_ll = link_local(&agent, &l.host_ifname);
    let (ll, nobody): (Ipv6Addr, Ipv6Addr) =
        ("fe80::1234".parse().unwrap(), "fe80::1".parse().unwrap());
    let unspecified = Ipv6Addr::UNSPECIFIED;
    let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
    let (egress, ingress) = ("egress", "ingress");
    let (spoofed, not_enforced) = ("invalid source", "ipv6 not enforced");
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
            Drop(egress, not_enforced),
        ),
        (
            "echo behind hop-by-hop options",
            Ipv6Packet::icmp(locked.v6, open.v6, 64, &ECHO_REQUEST).behind(HOPOPTS),
            Drop(egress, not_enforced),
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
            Drop(ingress, not_enforced),
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
            Drop(ingress, not_enforced),
        ),
        (
            "solicitation from a routable address",
            &l,
            solicit(open.v6, locked.v6, locked.v6),
            Drop(ingress, not_enforced),
        ),
        (
            "echo to all nodes",
            &o,
            Ipv6Packet::icmp(nobody, all_nodes, 64, &ECHO_REQUEST),
            Drop(ingress, not_enforced),
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
    let arp = frame::arp_request(l.pod_mac, locked.v4, Ipv4Addr::new(10, 244, 0, 1));
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

//! Privileged end-to-end tests of the eBPF datapath on network namespaces.
//! Run as root, serially: `cargo test -p cellium-integration --test datapath -- --test-threads=1`.
//!
//! Each test builds a node namespace with pods (see `Topology`), mounts a
//! private bpffs, writes maps through the crate API and checks what a user
//! would see: packets delivered or dropped, events, counters.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellium_datapath_bpf::{
    AttachAction, AttachKind, AttachMode, Backend, CtTuple, Datapath, DatapathConfig,
    DatapathOptions, Direction, EndpointFlags, EndpointInfo, Event, EventKind, Frontend, IpNet,
    MapOrigin, PolicyMatch, PolicyRule, Protocol, Reason, Verdict, compile_policy,
};
use cellium_integration::probe::{self, TcpServer, UdpServer};
use cellium_integration::topology::GATEWAY;
use cellium_integration::wait::FLOWING_ROUNDS;
use cellium_integration::{BpffsMount, Topology, serial};

const TIMEOUT: Duration = Duration::from_secs(2);
const SHORT: Duration = Duration::from_millis(700);

/// A node with pods and the datapath attached to every pod.
struct Env {
    // Field order is drop order: namespaces first, then the pins.
    topo: Topology,
    dp: Arc<Datapath>,
    _bpf: BpffsMount,
}

fn identity(i: u8) -> u32 {
    1000 + u32::from(i)
}

fn env_with(pods: u8, mode: AttachMode, flags: impl Fn(u8) -> EndpointFlags) -> Env {
    let topo = Topology::new(pods).expect("topology");
    let bpf = BpffsMount::new().expect("bpffs");
    let dp = Arc::new(
        Datapath::open(DatapathOptions {
            bpf_root: bpf.path().to_owned(),
            attach_mode: mode,
        })
        .expect("open datapath"),
    );
    // These tests read packet counts from conntrack entries.
    dp.config()
        .set_flag(DatapathConfig::CT_ACCOUNTING, true)
        .expect("conntrack accounting");
    for pod in &topo.pods {
        let info = pod.endpoint(u16::from(pod.index), identity(pod.index), flags(pod.index));
        dp.endpoints().put(pod.ip.into(), &info).expect("endpoint");
        dp.ipcache()
            .put(
                IpNet::from(std::net::IpAddr::V4(pod.ip)),
                identity(pod.index),
            )
            .expect("ipcache");
        let (dp2, ifindex) = (dp.clone(), pod.host_ifindex);
        let done = topo
            .node
            .run(move || dp2.attach(ifindex))
            .expect("netns")
            .expect("attach");
        assert_eq!(done.len(), 2);
    }
    Env {
        topo,
        dp,
        _bpf: bpf,
    }
}

fn env(pods: u8, flags: impl Fn(u8) -> EndpointFlags) -> Env {
    env_with(pods, AttachMode::Auto, flags)
}

fn no_enforcement(_: u8) -> EndpointFlags {
    EndpointFlags::NONE
}

fn rule(
    identity: u32,
    direction: Direction,
    protocol: Option<Protocol>,
    port: Option<u16>,
    verdict: Verdict,
) -> PolicyRule {
    PolicyRule {
        identity,
        direction,
        protocol,
        ports: port.map(|p| p..=p),
        verdict,
    }
}

fn set_policy(dp: &Datapath, endpoint: u8, rules: &[PolicyRule]) {
    let id = u16::from(endpoint);
    let entries = compile_policy(id, rules).expect("compile policy");
    dp.policy()
        .sync_endpoint(id, &entries)
        .expect("sync policy");
}

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

/// Waits for an event matching `pred`, reading with the async reader.
fn wait_event(dp: &Datapath, trigger: impl FnOnce(), pred: impl Fn(&Event) -> bool) -> Event {
    let mut reader = dp.events().expect("events reader");
    trigger();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let e = reader.next().await.expect("read event");
                if pred(&e) {
                    return e;
                }
            }
        })
        .await
        .expect("no matching event within 5s")
    })
}

#[test]
fn pods_exchange_icmp_tcp_and_udp() {
    let _serial = serial();
    let env = env(3, no_enforcement);
    let (p1, p2, p3) = (env.topo.pod(1), env.topo.pod(2), env.topo.pod(3));

    assert!(probe::ping(&p1.ns, p2.ip, 3).unwrap(), "ping pod1 -> pod2");
    assert!(probe::ping(&p2.ns, p3.ip, 3).unwrap(), "ping pod2 -> pod3");

    let _tcp = TcpServer::start(&p3.ns, addr(p3.ip, 8080), "pod3").unwrap();
    let reply = probe::tcp_request(&p1.ns, addr(p3.ip, 8080), TIMEOUT).unwrap();
    assert_eq!(reply.banner, "pod3");
    assert_eq!(reply.peer, SocketAddr::V4(addr(p3.ip, 8080)));

    let _udp = UdpServer::start(&p2.ns, addr(p2.ip, 5353), "pod2").unwrap();
    let reply = probe::udp_request(&p3.ns, addr(p2.ip, 5353), TIMEOUT).unwrap();
    assert_eq!(reply.banner, "pod2");

    // The datapath carried them: conntrack knows the flows, nothing dropped.
    let flows = env.dp.conntrack().entries().unwrap();
    assert!(
        flows.iter().any(|(t, e)| t.saddr == p1.ip
            && t.daddr == p3.ip
            && t.dport == 8080
            && t.protocol == Protocol::Tcp
            && e.packets[1] > 0),
        "no TCP flow in {flows:?}"
    );
    assert!(flows.iter().any(|(t, _)| t.saddr == p3.ip
        && t.daddr == p2.ip
        && t.dport == 5353
        && t.protocol == Protocol::Udp));
    assert!(
        flows
            .iter()
            .any(|(t, _)| t.saddr == p1.ip && t.daddr == p2.ip && t.protocol == Protocol::Icmp)
    );
    let fwd = env
        .dp
        .metrics()
        .get(Direction::Egress, Reason::Forwarded)
        .unwrap();
    assert!(fwd.packets >= 10, "{fwd:?}");
    assert_eq!(env.dp.metrics().drops().unwrap(), 0);
}

#[test]
fn deny_entry_drops_and_reports_the_reason() {
    let _serial = serial();
    let env = env(3, |i| {
        if i == 2 {
            EndpointFlags::ENFORCE_INGRESS
        } else {
            EndpointFlags::NONE
        }
    });
    let (p1, p2, p3) = (env.topo.pod(1), env.topo.pod(2), env.topo.pod(3));
    set_policy(
        &env.dp,
        2,
        &[
            rule(
                identity(1),
                Direction::Ingress,
                Some(Protocol::Tcp),
                Some(8080),
                Verdict::Allow,
            ),
            rule(
                identity(1),
                Direction::Ingress,
                Some(Protocol::Tcp),
                Some(9090),
                Verdict::Deny,
            ),
        ],
    );
    let _open = TcpServer::start(&p2.ns, addr(p2.ip, 8080), "open").unwrap();
    let _closed = TcpServer::start(&p2.ns, addr(p2.ip, 9090), "closed").unwrap();

    assert_eq!(
        probe::tcp_request(&p1.ns, addr(p2.ip, 8080), TIMEOUT)
            .unwrap()
            .banner,
        "open"
    );

    let event = wait_event(
        &env.dp,
        || {
            assert!(
                probe::tcp_connect(&p1.ns, addr(p2.ip, 9090), SHORT).is_err(),
                "denied port connected"
            )
        },
        |e| e.kind == EventKind::Drop && e.dport == 9090,
    );
    assert_eq!(event.reason, Reason::PolicyDeny);
    assert_eq!(event.direction, Direction::Ingress);
    assert_eq!(event.endpoint_id, 2);
    assert_eq!((event.saddr, event.daddr), (p1.ip.into(), p2.ip.into()));
    assert_eq!(
        (event.src_identity, event.dst_identity),
        (identity(1), identity(2))
    );
    assert_eq!(event.protocol, Protocol::Tcp);
    assert!(
        env.dp
            .metrics()
            .get(Direction::Ingress, Reason::PolicyDeny)
            .unwrap()
            .packets
            >= 1
    );

    // pod3 has no allow entry at all: default deny, a different reason.
    let event = wait_event(
        &env.dp,
        || {
            assert!(
                probe::tcp_connect(&p3.ns, addr(p2.ip, 8080), SHORT).is_err(),
                "unlisted peer connected"
            )
        },
        |e| e.kind == EventKind::Drop && e.saddr == p3.ip,
    );
    assert_eq!(event.reason, Reason::PolicyDefaultDeny);
}

#[test]
fn replies_pass_while_the_reverse_direction_is_denied() {
    let _serial = serial();
    let both = EndpointFlags::ENFORCE_INGRESS | EndpointFlags::ENFORCE_EGRESS;
    let env = env(2, |_| both);
    let (p1, p2) = (env.topo.pod(1), env.topo.pod(2));
    set_policy(
        &env.dp,
        1,
        &[rule(
            identity(2),
            Direction::Egress,
            None,
            None,
            Verdict::Allow,
        )],
    );
    set_policy(
        &env.dp,
        2,
        &[rule(
            identity(1),
            Direction::Ingress,
            None,
            None,
            Verdict::Allow,
        )],
    );

    let _s2 = TcpServer::start(&p2.ns, addr(p2.ip, 8080), "pod2").unwrap();
    let _s1 = TcpServer::start(&p1.ns, addr(p1.ip, 8081), "pod1").unwrap();

    // pod1 -> pod2 is allowed, and the replies of that connection come back.
    for _ in 0..3 {
        assert_eq!(
            probe::tcp_request(&p1.ns, addr(p2.ip, 8080), TIMEOUT)
                .unwrap()
                .banner,
            "pod2"
        );
    }
    assert!(probe::ping(&p1.ns, p2.ip, 2).unwrap());

    // A new connection pod2 -> pod1 is not.
    assert!(probe::tcp_connect(&p2.ns, addr(p1.ip, 8081), SHORT).is_err());
    assert!(!probe::ping(&p2.ns, p1.ip, 1).unwrap());
    let denied = env
        .dp
        .metrics()
        .get(Direction::Egress, Reason::PolicyDefaultDeny)
        .unwrap();
    assert!(denied.packets >= 2, "{denied:?}");
}

#[test]
fn cluster_ip_balances_over_two_backends_and_replies_carry_the_vip() {
    let _serial = serial();
    let env = env(3, no_enforcement);
    let (p1, p2, p3) = (env.topo.pod(1), env.topo.pod(2), env.topo.pod(3));
    let vip = Ipv4Addr::new(10, 96, 0, 10);
    let _t2 = TcpServer::start(&p2.ns, addr(p2.ip, 8080), "pod2").unwrap();
    let _t3 = TcpServer::start(&p3.ns, addr(p3.ip, 8080), "pod3").unwrap();
    let _u2 = UdpServer::start(&p2.ns, addr(p2.ip, 5353), "pod2").unwrap();
    let _u3 = UdpServer::start(&p3.ns, addr(p3.ip, 5353), "pod3").unwrap();

    let svc = env.dp.services();
    svc.put_backend(
        1,
        &Backend {
            addr: p2.ip.into(),
            port: 8080,
            protocol: Protocol::Tcp,
        },
    )
    .unwrap();
    svc.put_backend(
        2,
        &Backend {
            addr: p3.ip.into(),
            port: 8080,
            protocol: Protocol::Tcp,
        },
    )
    .unwrap();
    svc.put_backend(
        3,
        &Backend {
            addr: p2.ip.into(),
            port: 5353,
            protocol: Protocol::Udp,
        },
    )
    .unwrap();
    svc.put_backend(
        4,
        &Backend {
            addr: p3.ip.into(),
            port: 5353,
            protocol: Protocol::Udp,
        },
    )
    .unwrap();
    let tcp_fe = Frontend {
        vip: vip.into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let udp_fe = Frontend {
        vip: vip.into(),
        port: 53,
        protocol: Protocol::Udp,
    };
    svc.put_service(&tcp_fe, 1, &[1, 2]).unwrap();
    svc.put_service(&udp_fe, 2, &[3, 4]).unwrap();
    assert_eq!(
        svc.service(&tcp_fe).unwrap().unwrap().backend_ids,
        vec![1, 2]
    );

    let mut tcp_seen = std::collections::BTreeSet::new();
    let mut udp_seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let r = probe::tcp_request(&p1.ns, addr(vip, 80), TIMEOUT).unwrap();
        assert_eq!(
            r.peer,
            SocketAddr::V4(addr(vip, 80)),
            "TCP reply not from the VIP"
        );
        tcp_seen.insert(r.banner);
        let r = probe::udp_request(&p1.ns, addr(vip, 53), TIMEOUT).unwrap();
        assert_eq!(
            r.from,
            SocketAddr::V4(addr(vip, 53)),
            "UDP reply not from the VIP"
        );
        udp_seen.insert(r.banner);
        if tcp_seen.len() == 2 && udp_seen.len() == 2 {
            break;
        }
    }
    assert_eq!(tcp_seen.into_iter().collect::<Vec<_>>(), ["pod2", "pod3"]);
    assert_eq!(udp_seen.into_iter().collect::<Vec<_>>(), ["pod2", "pod3"]);

    // The backend choice is remembered per connection in a service entry.
    let flows = env.dp.conntrack().entries().unwrap();
    assert!(flows.iter().any(|(t, e)| t.service
        && t.daddr == vip
        && t.dport == 80
        && [1, 2].contains(&e.backend_id)));

    // A frontend without backends drops with its own reason.
    let empty_vip = Ipv4Addr::new(10, 96, 0, 11);
    let empty = Frontend {
        vip: empty_vip.into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    svc.put_service(&empty, 3, &[]).unwrap();
    assert!(probe::tcp_connect(&p1.ns, addr(empty_vip, 80), SHORT).is_err());
    assert!(
        env.dp
            .metrics()
            .get(Direction::Egress, Reason::NoServiceBackend)
            .unwrap()
            .packets
            >= 1
    );
}

#[test]
fn spoofed_source_addresses_are_dropped() {
    let _serial = serial();
    let env = env(2, no_enforcement);
    let (p1, p2) = (env.topo.pod(1), env.topo.pod(2));
    p1.ns
        .ip(&["addr", "add", "10.244.0.99/32", "dev", "eth0"])
        .unwrap();
    let event = wait_event(
        &env.dp,
        || {
            let ok = cellium_integration::cmd::output(
                "ip",
                &[
                    "netns",
                    "exec",
                    p1.ns.name(),
                    "ping",
                    "-n",
                    "-c",
                    "1",
                    "-W",
                    "1",
                    "-I",
                    "10.244.0.99",
                    &p2.ip.to_string(),
                ],
            )
            .unwrap()
            .status
            .success();
            assert!(!ok, "a spoofed ping got an answer");
        },
        |e| e.kind == EventKind::Drop && e.saddr == Ipv4Addr::new(10, 244, 0, 99),
    );
    assert_eq!(event.reason, Reason::InvalidSource);
    assert!(
        probe::ping(&p1.ns, p2.ip, 1).unwrap(),
        "the real address still works"
    );
}

#[test]
fn traffic_from_the_node_gets_ingress_policy_at_to_container() {
    let _serial = serial();
    let env = env(1, |_| EndpointFlags::ENFORCE_INGRESS);
    let p1 = env.topo.pod(1);
    env.dp
        .ipcache()
        .put(IpNet::from(std::net::IpAddr::V4(GATEWAY)), 1)
        .unwrap();

    // The endpoint enforces ingress and has no policy map yet: closed, for that reason.
    let node = cellium_integration::NetNs::existing(env.topo.node.name());
    assert!(!probe::ping(&node, p1.ip, 1).unwrap());
    let dropped = |reason| {
        env.dp
            .metrics()
            .get(Direction::Ingress, reason)
            .unwrap()
            .packets
    };
    assert!(dropped(Reason::NoPolicyMap) >= 1);
    // An empty map: nothing allows the host yet.
    set_policy(&env.dp, 1, &[]);
    assert!(!probe::ping(&node, p1.ip, 1).unwrap());
    assert!(dropped(Reason::PolicyDefaultDeny) >= 1);

    set_policy(
        &env.dp,
        1,
        &[rule(
            1,
            Direction::Ingress,
            Some(Protocol::Icmp),
            None,
            Verdict::Allow,
        )],
    );
    assert!(probe::ping(&node, p1.ip, 2).unwrap());
    let fwd = env
        .dp
        .metrics()
        .get(Direction::Ingress, Reason::Forwarded)
        .unwrap();
    assert!(fwd.packets >= 2, "{fwd:?}");
}

#[test]
fn conntrack_gc_removes_expired_entries() {
    let _serial = serial();
    let env = env(2, no_enforcement);
    let (p1, p2) = (env.topo.pod(1), env.topo.pod(2));
    let cfg = DatapathConfig {
        ct_udp: 1,
        ..env.dp.config().get().unwrap()
    };
    env.dp.config().set(&cfg).unwrap();
    let _u = UdpServer::start(&p2.ns, addr(p2.ip, 5353), "pod2").unwrap();
    probe::udp_request(&p1.ns, addr(p2.ip, 5353), TIMEOUT).unwrap();
    let is_flow = |t: &CtTuple| t.protocol == Protocol::Udp && t.daddr == p2.ip && t.dport == 5353;
    assert!(
        env.dp
            .conntrack()
            .entries()
            .unwrap()
            .iter()
            .any(|(t, _)| is_flow(t))
    );

    // The entry expires 1 s after its last packet: collected by a pass after that, however
    // late a busy machine runs it.
    let began = Instant::now();
    let mut deleted = 0;
    while env
        .dp
        .conntrack()
        .entries()
        .unwrap()
        .iter()
        .any(|(t, _)| is_flow(t))
    {
        assert!(began.elapsed() < Duration::from_secs(15), "never collected");
        std::thread::sleep(Duration::from_millis(200));
        deleted += env.dp.conntrack().gc().unwrap().deleted;
    }
    assert!(deleted >= 1, "the entry went without a collection");
}

#[test]
fn flushing_addresses_removes_every_entry_that_names_them() {
    let _serial = serial();
    let bpf = BpffsMount::new().expect("bpffs");
    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        attach_mode: AttachMode::Auto,
    })
    .expect("open datapath");
    let (a, b, c, vip) = (
        Ipv4Addr::new(10, 244, 0, 5),
        Ipv4Addr::new(10, 244, 0, 6),
        Ipv4Addr::new(10, 244, 0, 7),
        Ipv4Addr::new(10, 96, 0, 10),
    );
    let tuple = |saddr: Ipv4Addr, daddr: Ipv4Addr, service| CtTuple {
        saddr: saddr.into(),
        daddr: daddr.into(),
        sport: 40000,
        dport: 80,
        protocol: Protocol::Tcp,
        service,
    };
    let tuples = [
        tuple(a, vip, true), // a as a service client
        tuple(a, b, false),  // ... translated to backend b
        tuple(c, a, false),  // a as a server
        tuple(b, c, false),  // not a's
        tuple(c, vip, true), // not a's either
    ];
    for t in &tuples {
        dp.conntrack().put(t, &Default::default()).unwrap();
    }
    // An IPv6 connection of a's IPv6 address, in the other family's table.
    let v6: std::net::IpAddr = "fd00::5".parse().unwrap();
    let t6 = CtTuple {
        saddr: v6,
        daddr: "fd00::6".parse().unwrap(),
        ..tuples[0]
    };
    dp.conntrack().put(&t6, &Default::default()).unwrap();
    assert_eq!(dp.conntrack().flush_addresses(&[v6]).unwrap(), 1);
    dp.conntrack().put(&t6, &Default::default()).unwrap();
    assert_eq!(dp.conntrack().flush_addresses(&[a.into(), v6]).unwrap(), 4);
    let left: Vec<CtTuple> = dp
        .conntrack()
        .entries()
        .unwrap()
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&tuples[3]) && left.contains(&tuples[4]));
    assert_eq!(dp.conntrack().flush_addresses(&[a.into()]).unwrap(), 0);
}

#[test]
fn clsact_attach_works_and_detach_restores_plain_routing() {
    let _serial = serial();
    let env = env_with(2, AttachMode::Clsact, no_enforcement);
    let (p1, p2) = (env.topo.pod(1), env.topo.pod(2));
    let attached = env.dp.attached().unwrap();
    assert_eq!(attached.len(), 4);
    assert!(attached.iter().all(|a| a.kind == AttachKind::Clsact));
    // Attaching again the programs already there leaves the filters as they are.
    let (dp, ifindex) = (env.dp.clone(), p1.host_ifindex);
    let again = env
        .topo
        .node
        .run(move || dp.attach(ifindex))
        .unwrap()
        .unwrap();
    assert!(
        again.iter().all(|h| h.action == AttachAction::Unchanged),
        "{again:?}"
    );
    assert!(probe::ping(&p1.ns, p2.ip, 2).unwrap());
    let before = env
        .dp
        .metrics()
        .get(Direction::Egress, Reason::Forwarded)
        .unwrap()
        .packets;
    assert!(before >= 2);

    for pod in &env.topo.pods {
        let (dp, ifindex) = (env.dp.clone(), pod.host_ifindex);
        env.topo
            .node
            .run(move || dp.detach(ifindex))
            .unwrap()
            .unwrap();
    }
    assert!(env.dp.attached().unwrap().is_empty());
    assert!(
        probe::ping(&p1.ns, p2.ip, 2).unwrap(),
        "plain routing after detach"
    );
    assert_eq!(
        env.dp
            .metrics()
            .get(Direction::Egress, Reason::Forwarded)
            .unwrap()
            .packets,
        before
    );
}

#[test]
fn clsact_attach_takes_over_from_tcx_links_left_by_a_tcx_agent() {
    let _serial = serial();
    let env = env_with(2, AttachMode::Tcx, no_enforcement);
    let (p1, p2) = (env.topo.pod(1), env.topo.pod(2));
    assert!(
        env.dp
            .attached()
            .unwrap()
            .iter()
            .all(|a| a.kind == AttachKind::Tcx)
    );
    // A new agent in clsact mode over the same pins.
    let dp = Arc::new(
        Datapath::open(DatapathOptions {
            bpf_root: env.dp.bpf_root().to_owned(),
            attach_mode: AttachMode::Clsact,
        })
        .unwrap(),
    );
    for pod in &env.topo.pods {
        let (dp, ifindex) = (dp.clone(), pod.host_ifindex);
        env.topo
            .node
            .run(move || dp.attach(ifindex))
            .unwrap()
            .unwrap();
    }
    let attached = dp.attached().unwrap();
    assert_eq!(attached.len(), 4, "{attached:?}");
    assert!(
        attached.iter().all(|a| a.kind == AttachKind::Clsact),
        "tcx links left: {attached:?}"
    );
    let forwarded = || {
        dp.metrics()
            .get(Direction::Egress, Reason::Forwarded)
            .unwrap()
            .packets
    };
    let before = forwarded();
    assert!(probe::ping(&p1.ns, p2.ip, 2).unwrap());
    // Two echo requests and two replies, each through one from-container program once.
    assert_eq!(forwarded() - before, 4);
}

/// Removes a named topology on drop.
struct NamedTopology(String, u8);

impl Drop for NamedTopology {
    fn drop(&mut self) {
        Topology::remove_named(&self.0, self.1);
    }
}

fn testbed_attach(name: &str, bpf_root: &std::path::Path) -> String {
    testbed_attach_with(name, bpf_root, &[])
}

/// `cellium-testbed attach` with `extra` arguments.
fn testbed_attach_with(name: &str, bpf_root: &std::path::Path, extra: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cellium-testbed"))
        .args([
            "attach",
            "--name",
            name,
            "--pods",
            "2",
            "--policy",
            "allow",
            "--bpf-root",
        ])
        .arg(bpf_root)
        .args(extra)
        .output()
        .expect("run cellium-testbed");
    assert!(
        out.status.success(),
        "cellium-testbed attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes every program pinned for a next start (`<bpf>/programs/<tag>/<name>`).
fn unpin_programs(bpf: &std::path::Path) {
    for dir in std::fs::read_dir(bpf.join("programs")).unwrap() {
        let dir = dir.unwrap().path();
        for pin in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(pin.unwrap().path()).unwrap();
        }
        std::fs::remove_dir(&dir).unwrap();
    }
}

fn program_ids(report: &str) -> (u32, u32) {
    let line = report
        .lines()
        .find_map(|l| l.strip_prefix("programs "))
        .expect("programs line");
    let mut ids = line
        .split_whitespace()
        .map(|s| s.parse::<u32>().expect("program id"));
    (ids.next().expect("from id"), ids.next().expect("to id"))
}

/// Two pods in a named topology (what `cellium-testbed` attaches to), removed at the end,
/// and a private bpffs. Fields drop in order: the pins first, the topology last.
struct NamedBed {
    bpf: BpffsMount,
    name: String,
    _cleanup: NamedTopology,
    topo: Topology,
}

fn named_bed(prefix: &str) -> NamedBed {
    let name = format!("{prefix}{}", std::process::id());
    let topo = Topology::named(&name, 2).expect("topology");
    NamedBed {
        bpf: BpffsMount::new().unwrap(),
        _cleanup: NamedTopology(name.clone(), 2),
        name,
        topo,
    }
}

/// Runs `swap` (another agent's attach, which it returns the output of) under a TCP stream
/// from `p1` to `p2`, and checks that bytes flowed before, during and after it, without a
/// stall and without a retransmission. Returns the swap's output and how many rounds ran.
fn under_a_stream(
    p1: &cellium_integration::topology::Pod,
    p2: &cellium_integration::topology::Pod,
    swap: impl FnOnce() -> String,
) -> (String, usize) {
    let server = TcpServer::start(&p2.ns, addr(p2.ip, 8080), "pod2").unwrap();
    let stream = probe::tcp_connect(&p1.ns, addr(p2.ip, 8080), TIMEOUT).unwrap();
    let retrans = || {
        (
            p1.ns.snmp("Tcp", "RetransSegs").unwrap(),
            p2.ns.snmp("Tcp", "RetransSegs").unwrap(),
        )
    };
    let retrans_before = retrans();
    let client = probe::EchoStream::start(stream);
    client.wait_rounds(FLOWING_ROUNDS);
    let swap_at = Instant::now();
    let output = swap();
    let swap_done = Instant::now();
    client.wait_rounds(FLOWING_ROUNDS);
    let rounds = client.stop().expect("stream failed");

    assert!(
        rounds.iter().any(|t| *t < swap_at) && rounds.iter().any(|t| *t > swap_done),
        "{} rounds",
        rounds.len()
    );
    let max_gap = probe::max_gap(&rounds);
    assert!(
        max_gap < Duration::from_millis(150),
        "stream stalled for {max_gap:?}"
    );
    assert!(server.received() >= rounds.len() as u64 * probe::ECHO_ROUND_BYTES as u64);
    assert_eq!(retrans(), retrans_before, "TCP retransmitted");
    (output, rounds.len())
}

#[test]
fn a_new_process_reuses_pins_and_replaces_programs_without_loss() {
    let _serial = serial();
    let NamedBed {
        bpf, name, topo, ..
    } = &named_bed("rt");
    let (p1, p2) = (topo.pod(1), topo.pod(2));

    // First agent: loads, writes endpoints and an allow policy, attaches, exits.
    let first = testbed_attach(name, bpf.path());
    assert!(
        first.contains("map cel_ct4 created") && first.contains("tcx Created"),
        "{first}"
    );
    let first_ids = program_ids(&first);
    // Count every packet in conntrack (the pinned setting outlives this handle), so that the
    // flow's entry shows it carried every round across the replacement.
    Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..Default::default()
    })
    .unwrap()
    .config()
    .set_flag(DatapathConfig::CT_ACCOUNTING, true)
    .unwrap();

    // Second agent, of another build, under a long-lived stream: its programs are not the
    // pinned ones (those are unpinned here, as another build's tag would not find them), so
    // it loads its own, reopens the pinned maps and swaps the programs in place.
    let (second, rounds) = under_a_stream(p1, p2, || {
        unpin_programs(bpf.path());
        testbed_attach(name, bpf.path())
    });

    for map in [
        "cel_endpoints",
        "cel_policy",
        "cel_ct4",
        "cel_lb4_services",
        "cel_config",
        "cel_metrics",
    ] {
        assert!(
            second.contains(&format!("map {map} reused")),
            "{map} not reused: {second}"
        );
    }
    assert_eq!(second.matches("tcx Replaced").count(), 4, "{second}");
    assert!(second.contains("program origin loaded"), "{second}");
    let second_ids = program_ids(&second);
    assert_ne!(first_ids, second_ids, "programs were not replaced");

    // The pinned state is one and the same: no drops, the flow tracked once.
    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..Default::default()
    })
    .unwrap();
    assert!(
        dp.maps_report()
            .iter()
            .all(|r| r.origin == MapOrigin::Reused),
        "{:?}",
        dp.maps_report()
    );
    assert_eq!(
        dp.metrics().drops().unwrap(),
        0,
        "{:?}",
        dp.metrics().all().unwrap()
    );
    let flows = dp.conntrack().entries().unwrap();
    let flow = flows
        .iter()
        .find(|(t, _)| t.saddr == p1.ip && t.daddr == p2.ip && t.dport == 8080)
        .expect("flow");
    assert!(flow.1.packets[0] as usize >= rounds, "{:?}", flow.1);
    let attached = dp.attached().unwrap();
    assert_eq!(attached.len(), 4);
    for a in attached
        .iter()
        .filter(|a| a.hook == cellium_datapath_bpf::Hook::FromContainer)
    {
        assert_eq!(a.program_id, Some(second_ids.0));
    }
}

/// Pins `bpf`'s endpoints map again in v0.1.0's layout (no `cluster_identity`), holding its
/// entries, as that release left it. The programs attached keep the map they were loaded with.
fn pin_endpoints_as_v0_1_0(bpf: &std::path::Path) {
    use cellium_datapath_bpf::abi::Plain;
    use cellium_datapath_bpf::abi::releases::v0_1_0;
    use libbpf_rs::{MapCore, MapFlags, MapHandle};

    let path = bpf.join("maps/cel_endpoints");
    let current = MapHandle::from_pinned_path(&path).expect("the pinned endpoints");
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as u64,
        map_flags: current.info().unwrap().info.map_flags,
        ..Default::default()
    };
    let mut old = MapHandle::create(
        current.map_type(),
        Some("cel_endpoints"),
        current.key_size(),
        v0_1_0::EndpointInfo::SIZE as u32,
        current.max_entries(),
        &opts,
    )
    .expect("a map of v0.1.0's layout");
    for key in current.keys() {
        let value = current.lookup(&key, MapFlags::ANY).unwrap().unwrap();
        let e = EndpointInfo::decode(&value).unwrap();
        let released = v0_1_0::EndpointInfo {
            ifindex: e.ifindex,
            id: e.id,
            flags: e.flags,
            identity: e.identity,
            host_mac: e.host_mac,
            pod_mac: e.pod_mac,
        };
        old.update(&key, &released.encode(), MapFlags::ANY).unwrap();
    }
    std::fs::remove_file(&path).unwrap();
    old.pin(&path).unwrap();
}

/// An upgrade from v0.1.0, whose endpoints map had a smaller value: the new build converts
/// its entries as it opens the pinned map, so its programs find every pod from their first
/// packet, before the agent writes anything. A stream between two pods goes on without a
/// stall or a retransmission; each endpoint keeps what it had and publishes the identity it
/// enforced with. (Recreated empty instead, the new programs would drop every packet of
/// the pods until their endpoints were written again.)
#[test]
fn an_upgrade_converts_the_previous_releases_endpoints_with_connections_kept() {
    let _serial = serial();
    let NamedBed {
        bpf, name, topo, ..
    } = &named_bed("up");
    let (p1, p2) = (topo.pod(1), topo.pod(2));
    testbed_attach(name, bpf.path());
    // Another build: its programs are loaded, and read the converted map. It writes nothing.
    let (upgraded, _) = under_a_stream(p1, p2, || {
        pin_endpoints_as_v0_1_0(bpf.path());
        unpin_programs(bpf.path());
        testbed_attach_with(name, bpf.path(), &["--keep-maps"])
    });
    assert!(
        upgraded.contains("map cel_endpoints migrated 4 entries")
            && upgraded.contains("the layout of v0.1.0"),
        "{upgraded}"
    );
    assert!(upgraded.contains("program origin loaded"), "{upgraded}");

    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        dp.metrics().drops().unwrap(),
        0,
        "{:?}",
        dp.metrics().all().unwrap()
    );
    for pod in [p1, p2] {
        let e = dp
            .endpoints()
            .get(pod.ip.into())
            .unwrap()
            .expect("endpoint");
        assert_eq!(e.identity, 1000 + u32::from(pod.index), "{e:?}");
        assert_eq!(e.cluster_identity, e.identity, "{e:?}");
        assert_eq!(e.ifindex, pod.host_ifindex, "{e:?}");
    }
}

#[test]
fn a_restart_of_the_same_build_reuses_its_programs_and_their_maps() {
    let _serial = serial();
    let NamedBed {
        bpf, name, topo, ..
    } = &named_bed("rr");
    let (p1, p2) = (topo.pod(1), topo.pod(2));

    let first = testbed_attach(name, bpf.path());
    assert!(
        first.contains("program origin loaded (no programs pinned by this build)"),
        "{first}"
    );
    let first_ids = program_ids(&first);

    // The next process of this build takes the pinned programs: no verifier, the same
    // programs stay attached (their links left as they were), and traffic goes on
    // through them.
    let server = TcpServer::start(&p2.ns, addr(p2.ip, 8080), "pod2").unwrap();
    let second = testbed_attach(name, bpf.path());
    assert!(second.contains("program origin reused"), "{second}");
    assert_eq!(program_ids(&second), first_ids, "{second}");
    assert_eq!(second.matches("tcx Unchanged").count(), 4, "{second}");
    probe::tcp_connect(&p1.ns, addr(p2.ip, 8080), TIMEOUT).expect("allowed before");

    // Its map handles are the maps those programs read and write: a policy written
    // through them is enforced, and the drop comes back through its events.
    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        dp.program_origin(),
        &cellium_datapath_bpf::ProgramOrigin::Reused
    );
    set_policy(&dp, 2, &[]);
    let event = wait_event(
        &dp,
        || {
            let refused = probe::tcp_connect(&p1.ns, addr(p2.ip, 8080), SHORT);
            assert!(refused.is_err(), "connected with no rule allowing it");
        },
        |e| e.kind == EventKind::Drop && e.saddr == p1.ip && e.dport == 8080,
    );
    assert_eq!(event.reason, Reason::PolicyDefaultDeny, "{event:?}");
    assert!(dp.metrics().drops().unwrap() > 0);
    drop(server);
}

#[test]
fn traces_and_verdicts_carry_their_match_and_the_service_when_switched_on() {
    let _serial = serial();
    let env = env(2, |i| {
        if i == 2 {
            EndpointFlags::ENFORCE_INGRESS
        } else {
            EndpointFlags::NONE
        }
    });
    let (p1, p2) = (env.topo.pod(1), env.topo.pod(2));
    set_policy(
        &env.dp,
        2,
        &[rule(
            identity(1),
            Direction::Ingress,
            Some(Protocol::Tcp),
            Some(8080),
            Verdict::Allow,
        )],
    );
    let _server = TcpServer::start(&p2.ns, addr(p2.ip, 8080), "pod2").unwrap();

    // Off (the default): a new connection emits nothing.
    let mut reader = env.dp.events().unwrap();
    probe::tcp_request(&p1.ns, addr(p2.ip, 8080), TIMEOUT).unwrap();
    assert!(reader.poll(Duration::from_millis(200)).unwrap().is_empty());

    env.dp
        .config()
        .set_flag(DatapathConfig::TRACE_EVENTS, true)
        .unwrap();
    env.dp
        .config()
        .set_flag(DatapathConfig::POLICY_VERDICT_EVENTS, true)
        .unwrap();
    let verdict = wait_event(
        &env.dp,
        || {
            probe::tcp_request(&p1.ns, addr(p2.ip, 8080), TIMEOUT).unwrap();
        },
        |e| e.kind == EventKind::PolicyVerdict && e.direction == Direction::Ingress,
    );
    assert!(verdict.allowed);
    assert_eq!(verdict.egress_match, PolicyMatch::L3L4);
    let trace = wait_event(
        &env.dp,
        || {
            probe::tcp_request(&p1.ns, addr(p2.ip, 8080), TIMEOUT).unwrap();
        },
        |e| e.kind == EventKind::Trace,
    );
    assert_eq!((trace.saddr, trace.daddr), (p1.ip.into(), p2.ip.into()));
    assert_eq!(trace.direction, Direction::Egress);
    // pod1's egress is not enforced (all); pod2's ingress allowed identity and port.
    assert_eq!(trace.egress_match, PolicyMatch::All);
    assert_eq!(trace.ingress_match, PolicyMatch::L3L4);
    assert_eq!(trace.rev_nat_id, 0);
    assert_eq!(trace.tcp_flags & 0x02, 0x02, "the SYN");

    // Through a frontend: the trace names its rev-NAT id, the destination is the backend.
    let vip = Ipv4Addr::new(10, 96, 0, 10);
    let svc = env.dp.services();
    svc.put_backend(
        1,
        &Backend {
            addr: p2.ip.into(),
            port: 8080,
            protocol: Protocol::Tcp,
        },
    )
    .unwrap();
    let fe = Frontend {
        vip: vip.into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    svc.put_service(&fe, 7, &[1]).unwrap();
    let trace = wait_event(
        &env.dp,
        || {
            probe::tcp_request(&p1.ns, addr(vip, 80), TIMEOUT).unwrap();
        },
        |e| e.kind == EventKind::Trace && e.rev_nat_id != 0,
    );
    assert_eq!(trace.rev_nat_id, 7);
    assert_eq!(trace.daddr, std::net::IpAddr::from(p2.ip));
    assert_eq!(trace.dport, 8080);
}

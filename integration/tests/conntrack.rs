//! Conntrack and NAT state never outlive an endpoint, and connections policy denies leave
//! none: the real agent, pods through `cellium-cni` (the policy lab), connections through the
//! datapath, and the agent's pinned connection table read directly.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test conntrack -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces and removes them (guards), and sends
//! traffic only to addresses inside them and to cluster IPs that exist only in the node's
//! datapath.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use cellium_datapath_bpf::abi::{CtEntry, CtKey, Plain, be32, ipv4_of};
use cellium_datapath_bpf::ktime_now_ns;
use cellium_integration::lab::{Lab, fixture};
use cellium_integration::probe;
use cellium_integration::reach::{Outcome, Probe};
use cellium_integration::{Agent, AgentOptions, NetNs, serial};
use libbpf_rs::{MapCore, MapHandle};

const DB: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 11);

/// One entry of the agent's connection table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Conn {
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    dport: u16,
    service: bool,
}

/// Every entry of the agent's pinned `cel_ct4`, read as another process would.
fn conntrack(agent: &Agent) -> Vec<Conn> {
    let map = MapHandle::from_pinned_path(agent.bpf_root().join("maps/cel_ct4"))
        .expect("open the pinned conntrack map");
    map.keys()
        .map(|raw| {
            let k = CtKey::decode(&raw).expect("a ct_key");
            Conn {
                saddr: ipv4_of(k.saddr),
                daddr: ipv4_of(k.daddr),
                dport: u16::from_be(k.dport),
                service: k.flags & 1 != 0,
            }
        })
        .collect()
}

/// The entries whose source or destination is `ip`.
fn naming(agent: &Agent, ip: Ipv4Addr) -> Vec<Conn> {
    conntrack(agent)
        .into_iter()
        .filter(|c| c.saddr == ip || c.daddr == ip)
        .collect()
}

/// The datapath's packet counter for (direction, reason), as the agent's metrics name them.
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

/// The cluster IP and port of service `namespace/name`, once it has a backend.
fn frontend(lab: &Lab, service: &str) -> SocketAddrV4 {
    let mut found = None;
    lab.wait_until(&format!("{service} has a backend"), |lab| {
        let list = lab.agent().cli_json(&["service", "list"])?;
        found = list.as_array().into_iter().flatten().find_map(|f| {
            let backends = f["backends"].as_array().map_or(0, Vec::len);
            if f["service"] != service || backends == 0 {
                return None;
            }
            let ip: Ipv4Addr = f["vip"].as_str()?.parse().ok()?;
            Some(SocketAddrV4::new(
                ip,
                u16::try_from(f["port"].as_u64()?).ok()?,
            ))
        });
        Ok(found.is_some())
    })
    .expect("the service");
    found.expect("a frontend")
}

/// A ClusterIP service in `ops` for the DNS pod's UDP port 53.
const DNS_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: dns, namespace: ops }
spec: { selector: { app: dns }, ports: [ { port: 53, protocol: UDP } ] }
"#;

#[test]
fn a_deleted_pods_connections_go_with_it_and_its_address_starts_clean() {
    let _serial = serial();
    // The address goes to the next pod at once: what this test is about is what a new holder
    // could inherit, which the release quarantine would otherwise only postpone.
    let mut lab = fixture::lab(AgentOptions {
        env: vec![("CELLIUM_IPAM_RELEASE_QUARANTINE".into(), "0s".into())],
        ..AgentOptions::default()
    })
    .expect("the lab");
    lab.serve(&[Probe::Udp(53), Probe::Udp(5353)]).unwrap();
    lab.apply(DNS_SERVICE).unwrap();
    let dns = frontend(&lab, "ops/dns");

    // shop/db is a client of a service (a service entry and a translated one name it) and the
    // server of an open UDP flow from dev/tool.
    let db_ns = NetNs::existing(lab.pod("shop/db").unwrap().netns.name());
    probe::udp_request(&db_ns, dns, Duration::from_secs(2)).expect("db -> the dns service");
    let mut flow = lab.open("dev/tool", "shop/db", Probe::Udp(5353)).unwrap();
    let before = naming(lab.agent(), DB);
    assert!(
        before.iter().any(|c| c.service && c.saddr == DB),
        "no service entry of db: {before:?}"
    );
    assert!(
        before.iter().any(|c| c.daddr == DB && c.dport == 5353),
        "{before:?}"
    );

    // CNI DEL: every entry naming its address goes, service entries included.
    lab.remove_pod("shop/db").unwrap();
    assert_eq!(naming(lab.agent(), DB), [], "entries outlived the pod");

    // tool keeps sending on its open flow while the address belongs to nobody: the datapath
    // records it as a connection to some address off the node.
    assert_ne!(flow.round_trip(), Outcome::Answered);
    assert!(
        !naming(lab.agent(), DB).is_empty(),
        "the flow left no entry"
    );

    // A pod that admits nothing gets the address.
    lab.delete("apiVersion: v1\nkind: Pod\nmetadata: { name: db, namespace: shop }\n")
        .unwrap();
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: vault, namespace: shop, labels: { app: vault } }\nspec: { containers: [ { name: c } ] }\n",
    )
    .unwrap();
    lab.apply_policy(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: vault, namespace: shop }\nspec: { podSelector: { matchLabels: { app: vault } }, policyTypes: [ Ingress ] }\n",
    )
    .unwrap();
    // Another flow of tool's sends all along vault's creation: no moment of it may let a
    // connection into conntrack before vault's policy applies.
    let stream = Stream::start(&NetNs::existing(lab.pod("dev/tool").unwrap().netns.name()));
    lab.add_pod("shop/vault", DB).unwrap();
    lab.settle().unwrap();
    let vault_ns = NetNs::existing(lab.pod("shop/vault").unwrap().netns.name());
    let receivers: Vec<UdpSocket> = [5353, STREAM_PORT]
        .into_iter()
        .map(|port| {
            vault_ns
                .run(move || -> std::io::Result<UdpSocket> {
                    let sock = UdpSocket::bind(SocketAddrV4::new(DB, port))?;
                    sock.set_read_timeout(Some(Duration::from_millis(300)))?;
                    Ok(sock)
                })
                .unwrap()
                .expect("bind in vault")
        })
        .collect();
    let denied = packets(lab.agent(), "ingress", "policy default deny");
    for _ in 0..5 {
        assert_ne!(flow.round_trip(), Outcome::Answered);
    }
    let mut buf = [0u8; 64];
    for r in &receivers {
        assert!(
            r.recv_from(&mut buf).is_err(),
            "vault received an old flow's datagram on {:?}",
            r.local_addr()
        );
    }
    let sent = stream.stop();
    assert!(sent > 100, "the stream sent {sent} datagrams");
    assert!(packets(lab.agent(), "ingress", "policy default deny") >= denied + 5);
    // A datagram that read the endpoint map just before vault's entry was written may have
    // recorded its flow after the flush: such an entry is not trusted for vault.
    assert_eq!(
        trusted_for(lab.agent(), DB),
        [],
        "denied datagrams left entries that vault's policy never admitted"
    );
}

/// The entries naming `ip` at an end marked as a local endpoint that admitted the connection
/// (`CEL_CT_F_SRC_LOCAL` for the source, `CEL_CT_F_DST_LOCAL` for the destination).
fn trusted_for(agent: &Agent, ip: Ipv4Addr) -> Vec<(Conn, u8)> {
    let map = MapHandle::from_pinned_path(agent.bpf_root().join("maps/cel_ct4"))
        .expect("open the pinned conntrack map");
    map.keys()
        .filter_map(|raw| {
            let k = CtKey::decode(&raw).expect("a ct_key");
            let value = map.lookup(&raw, libbpf_rs::MapFlags::ANY).ok()??;
            let flags = CtEntry::decode(&value).expect("a ct_entry").flags;
            let conn = Conn {
                saddr: ipv4_of(k.saddr),
                daddr: ipv4_of(k.daddr),
                dport: u16::from_be(k.dport),
                service: k.flags & 1 != 0,
            };
            let trusted = (conn.saddr == ip && flags & CT_F_SRC_LOCAL != 0)
                || (conn.daddr == ip && flags & CT_F_DST_LOCAL != 0);
            trusted.then_some((conn, flags))
        })
        .collect()
}

/// `ct_entry.flags` (bpf/include/cellium/conntrack.h).
const CT_F_SRC_LOCAL: u8 = 0x01;
const CT_F_DST_LOCAL: u8 = 0x02;

/// The race the datapath closes, made deterministic: a packet that read the endpoint map just
/// before a new endpoint's entry was written records its connection as one to "somewhere off
/// the node" after the flush that follows the write. The test writes that entry itself, as
/// such a packet would have (no end marked local), once the new pod is up; its flow must still
/// meet the new pod's ingress policy, which admits nothing.
#[test]
fn a_connection_recorded_as_off_the_node_meets_the_new_endpoints_ingress_policy() {
    let _serial = serial();
    let mut lab = fixture::lab(AgentOptions {
        env: vec![("CELLIUM_IPAM_RELEASE_QUARANTINE".into(), "0s".into())],
        ..AgentOptions::default()
    })
    .expect("the lab");
    lab.remove_pod("shop/db").unwrap();
    lab.delete("apiVersion: v1\nkind: Pod\nmetadata: { name: db, namespace: shop }\n")
        .unwrap();
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: vault, namespace: shop, labels: { app: vault } }\nspec: { containers: [ { name: c } ] }\n",
    )
    .unwrap();
    lab.apply_policy(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: vault, namespace: shop }\nspec: { podSelector: { matchLabels: { app: vault } }, policyTypes: [ Ingress ] }\n",
    )
    .unwrap();
    lab.add_pod("shop/vault", DB).unwrap();
    lab.settle().unwrap();

    let tool = lab.pod("dev/tool").unwrap();
    let tool_ip = tool.ip;
    let tool_ns = NetNs::existing(tool.netns.name());
    let vault_ns = NetNs::existing(lab.pod("shop/vault").unwrap().netns.name());
    let receiver = vault_ns
        .run(|| -> std::io::Result<UdpSocket> {
            let sock = UdpSocket::bind(SocketAddrV4::new(DB, STALE_PORT))?;
            sock.set_read_timeout(Some(Duration::from_millis(300)))?;
            Ok(sock)
        })
        .unwrap()
        .expect("bind in vault");
    let sender = tool_ns
        .run(move || -> std::io::Result<UdpSocket> {
            let sock = UdpSocket::bind(SocketAddrV4::new(tool_ip, 0))?;
            sock.connect(SocketAddrV4::new(DB, STALE_PORT))?;
            Ok(sock)
        })
        .unwrap()
        .expect("the sender's socket");
    let sport = sender.local_addr().unwrap().port();

    // The late entry: tool's flow to the address, recorded while it was nobody's.
    let map = MapHandle::from_pinned_path(lab.agent().bpf_root().join("maps/cel_ct4"))
        .expect("open the pinned conntrack map");
    let key = CtKey {
        saddr: be32(tool_ip),
        daddr: be32(DB),
        sport: sport.to_be(),
        dport: STALE_PORT.to_be(),
        protocol: 17,
        flags: 0,
        pad: 0,
    };
    let now = ktime_now_ns().expect("the clock");
    let entry = CtEntry {
        expires_ns: now + 600 * 1_000_000_000,
        created_ns: now,
        packets: [1, 0],
        bytes: [64, 0],
        backend_id: 0,
        rev_nat_id: 0,
        tcp_flags: [0, 0],
        state: 1, // CEL_CT_STATE_ESTABLISHED
        flags: 0,
        nat_port: 0,
        pad2: 0,
    };
    map.update(&key.encode(), &entry.encode(), libbpf_rs::MapFlags::ANY)
        .expect("write the late entry");

    let denied = packets(lab.agent(), "ingress", "policy default deny");
    for _ in 0..5 {
        sender.send(b"late").expect("send");
    }
    let mut buf = [0u8; 64];
    assert!(
        receiver.recv_from(&mut buf).is_err(),
        "vault received a datagram of a connection recorded before it came"
    );
    lab.wait_until(
        "the late flow's datagrams are denied by vault's policy",
        |lab| Ok(packets(lab.agent(), "ingress", "policy default deny") >= denied + 5),
    )
    .expect("denied datagrams");
    // Still not trusted for vault: its policy did not admit the flow.
    let raw = map
        .lookup(&key.encode(), libbpf_rs::MapFlags::ANY)
        .expect("read the entry")
        .expect("the entry");
    let flags = CtEntry::decode(&raw).expect("a ct_entry").flags;
    assert_eq!(
        flags & CT_F_DST_LOCAL,
        0,
        "the entry was marked admitted: {flags:#x}"
    );
}

/// The port of the late entry's flow.
const STALE_PORT: u16 = 7000;

const STREAM_PORT: u16 = 6000;

/// Datagrams to `DB:STREAM_PORT` from one socket (one tuple), every 100 µs until stopped.
struct Stream {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Stream {
    fn start(ns: &NetNs) -> Stream {
        let sock = ns
            .run(|| -> std::io::Result<UdpSocket> {
                let sock = UdpSocket::bind("0.0.0.0:0")?;
                sock.connect(SocketAddrV4::new(DB, STREAM_PORT))?;
                Ok(sock)
            })
            .unwrap()
            .expect("the stream's socket");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut sent = 0;
            while !running.load(std::sync::atomic::Ordering::Relaxed) {
                // Errors (no route while the address is nobody's) are part of the story.
                if sock.send(b"stream").is_ok() {
                    sent += 1;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            sent
        });
        Stream { stop, thread }
    }

    /// Stops; returns how many datagrams left the socket.
    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the stream's thread")
    }
}

#[test]
fn an_endpoint_removed_at_restart_leaves_no_connections() {
    let _serial = serial();
    let mut lab = fixture::lab(AgentOptions::default()).expect("the lab");
    let mut flow = lab.open("dev/tool", "shop/db", Probe::Udp(5353)).unwrap();
    assert_eq!(flow.round_trip(), Outcome::Answered);
    assert!(!naming(lab.agent(), DB).is_empty());

    // The pod goes while the agent is down: the restarted agent removes its endpoint.
    let host = lab.endpoints().unwrap()["shop/db"]["host_ifname"]
        .as_str()
        .expect("db's host end")
        .to_string();
    lab.agent_mut().kill().unwrap();
    lab.vanish_pod("shop/db").unwrap();
    // The kernel destroys a namespace (and the veth pair into it) a moment after its last
    // reference goes: the pod is gone once its host end is.
    let gone = std::time::Instant::now();
    while lab.agent().node().ip(&["link", "show", &host]).is_ok() {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "{host} outlived its namespace"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.agent_mut().start().unwrap();
    assert!(
        lab.agent().log().contains("endpoint not restored"),
        "{}",
        lab.agent().log()
    );
    assert_eq!(naming(lab.agent(), DB), [], "entries outlived the pod");
}

#[test]
fn denied_connections_to_a_cluster_ip_leave_no_conntrack_entries() {
    let _serial = serial();
    let mut lab = fixture::lab(AgentOptions::default()).expect("the lab");
    lab.serve(&[Probe::Tcp(8080)]).unwrap();
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: { name: web, namespace: shop }\nspec: { selector: { app: web }, ports: [ { port: 80, targetPort: http } ] }\n",
    )
    .unwrap();
    let web = frontend(&lab, "shop/web");
    // Only shop/db may reach shop/web.
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: db } } } ] } ]
"#,
    )
    .unwrap();
    let tool = Ipv4Addr::new(10, 244, 0, 21);
    let tool_ns = NetNs::existing(lab.pod("dev/tool").unwrap().netns.name());
    let entries = conntrack(lab.agent()).len();
    let denied = packets(lab.agent(), "ingress", "policy default deny");

    // 500 connection attempts from dev/tool, each from a new port: every SYN is denied.
    let connected = tool_ns
        .run(move || {
            (0..500)
                .filter(|_| {
                    TcpStream::connect_timeout(&SocketAddr::V4(web), Duration::from_millis(2))
                        .is_ok()
                })
                .count()
        })
        .unwrap();
    assert_eq!(connected, 0);
    let began = Instant::now();
    while packets(lab.agent(), "ingress", "policy default deny") < denied + 500 {
        assert!(began.elapsed() < Duration::from_secs(10), "not 500 denials");
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = naming(lab.agent(), tool);
    assert!(
        left.is_empty(),
        "denied attempts left {} entries, e.g. {:?}",
        left.len(),
        left.first()
    );
    assert_eq!(conntrack(lab.agent()).len(), entries);

    // An allowed client gets its connection, and its backend remembered.
    let db_ns = NetNs::existing(lab.pod("shop/db").unwrap().netns.name());
    let reply = probe::tcp_request(&db_ns, web, Duration::from_secs(2)).expect("db -> web");
    assert_eq!(reply.banner, "shop/web");
    let db = naming(lab.agent(), DB);
    assert!(
        db.iter()
            .any(|c| c.service && c.daddr == *web.ip() && c.dport == web.port()),
        "{db:?}"
    );
}

/// The packet counters [forward, reply] of the connection `from` -> `to` in the agent's
/// pinned `cel_ct4`.
fn counters(agent: &Agent, from: Ipv4Addr, to: SocketAddrV4) -> [u64; 2] {
    let map = MapHandle::from_pinned_path(agent.bpf_root().join("maps/cel_ct4"))
        .expect("open the pinned conntrack map");
    map.keys()
        .find_map(|raw| {
            let k = CtKey::decode(&raw)?;
            let ours = ipv4_of(k.saddr) == from
                && ipv4_of(k.daddr) == *to.ip()
                && u16::from_be(k.dport) == to.port();
            let value = map.lookup(&raw, libbpf_rs::MapFlags::ANY).ok()??;
            ours.then(|| CtEntry::decode(&value)).flatten()
        })
        .map(|e| e.packets)
        .expect("the connection's entry")
}

#[test]
fn conntrack_entries_count_every_packet_only_with_bpf_conntrack_accounting() {
    let _serial = serial();
    let pods = "apiVersion: v1\nkind: Pod\nmetadata: { name: a }\nspec: { containers: [ { name: c } ] }\n---\napiVersion: v1\nkind: Pod\nmetadata: { name: b }\nspec: { containers: [ { name: c } ] }\n";
    for accounting in [false, true] {
        let mut opts = AgentOptions::default();
        if accounting {
            opts.env
                .push(("CELLIUM_BPF_CONNTRACK_ACCOUNTING".into(), "true".into()));
        }
        let agent = Agent::start_new(opts).expect("start the agent");
        agent.objects("apply", pods).expect("apply the pods");
        let tag = |n: &str| format!("acct{n}{}x{}", u8::from(accounting), std::process::id());
        let (a, b) = (NetNs::new().expect("netns"), NetNs::new().expect("netns"));
        let a_ip = agent.add_pod(&a, &tag("a"), "default", "a").expect("ADD a");
        let b_ip = agent.add_pod(&b, &tag("b"), "default", "b").expect("ADD b");
        let to = SocketAddrV4::new(b_ip, 8080);
        let _server = probe::TcpServer::start(&b, to, "b").expect("server");
        // Handshake, banner, message, echo, close: several packets each way.
        probe::tcp_request(&a, to, Duration::from_secs(2)).expect("a -> b");
        let packets = counters(&agent, a_ip, to);
        if accounting {
            assert!(packets[0] >= 4 && packets[1] >= 3, "{packets:?}");
        } else {
            assert_eq!(packets, [1, 0], "only the first packet is counted");
        }
    }
}

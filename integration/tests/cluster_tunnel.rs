//! What only tunnel mode promises, on the cluster testbed (`integration/src/cluster.rs`) in
//! `routing-mode: tunnel`, with an underlay that refuses pod addresses (a `prohibit` rule on
//! each node's underlay interface), so only the tunnel (VXLAN, device `cel_vxlan`) can carry pod
//! traffic: the device, the pods' MTU, the node's own traffic through the tunnel, policy by the
//! identity the VNI carries and Cilium's entities across nodes, bulk transfer at the full MTU,
//! an open connection across restarts of both agents, and whom the tunnel believes (a VNI only
//! from a node, only for an identity a node sends). The tests every routing mode shares are
//! in `cluster.rs`.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test cluster_tunnel -- --test-threads=1`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use cellium_integration::NetNs;
use cellium_integration::cluster::{Cluster, ClusterOptions, RoutingMode, UNDERLAY_IF};
use cellium_integration::frame::{self, Ipv4Packet, udp};
use cellium_integration::probe::{TcpServer, tcp_connect};
use cellium_integration::reach::{Outcome, Probe, probe};
use cellium_integration::shop::{self, WEB_FROM_CLIENT};

const PORT: u16 = 8080;

/// Other nodes themselves may reach web.
const WEB_FROM_REMOTE_NODES: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-from-remote-nodes, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  ingress: [ { fromEntities: [ remote-node ] } ]
"#;

/// Anything in the cluster may reach web.
const WEB_FROM_CLUSTER: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-from-cluster, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  ingress: [ { fromEntities: [ cluster ] } ]
"#;

#[track_caller]
fn eventually(cluster: &Cluster, what: &str, ok: impl FnMut() -> bool) {
    if let Err(e) = cluster.eventually(what, ok) {
        panic!("{e}\n{}", cluster.logs());
    }
}

/// Whether a TCP probe from `from` (a node's or a pod's namespace) to `ip` is answered.
fn reaches(from: &NetNs, ip: Ipv4Addr) -> bool {
    matches!(
        probe(from, None, ip, Probe::Tcp(PORT), Duration::from_millis(700)),
        Ok(Outcome::Answered)
    )
}

/// One echo round trip of `len` bytes on an open connection.
fn echo(stream: &mut TcpStream, len: usize) -> std::io::Result<()> {
    let sent: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    stream.write_all(&sent)?;
    let mut got = vec![0u8; len];
    stream.read_exact(&mut got)?;
    assert_eq!(got, sent, "echo differs");
    Ok(())
}

/// A cluster in tunnel mode whose nodes refuse pod addresses arriving on the underlay; packets
/// to the nodes themselves, the tunnel's among them, pass.
fn tunnel_only_cluster() -> Cluster {
    let cluster = Cluster::start(ClusterOptions {
        routing_mode: RoutingMode::Tunnel,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    for i in 0..2 {
        cluster
            .agent(i)
            .node()
            .ip(&[
                "rule",
                "add",
                "iif",
                UNDERLAY_IF,
                "to",
                "10.245.0.0/16",
                "prohibit",
            ])
            .expect("no pod traffic on the underlay");
    }
    cluster
}

/// A [`tunnel_only_cluster`] with pod `shop/client` on node 1 and `shop/web` (serving TCP on
/// `PORT` while the returned server is held) on node 2, once the client reaches the web pod.
fn client_and_web() -> (Cluster, Ipv4Addr, TcpServer) {
    let mut cluster = tunnel_only_cluster();
    cluster.namespace("shop", "").expect("namespace");
    cluster
        .add_pod(0, "shop/client", "app=client", &[])
        .expect("client");
    let web = cluster
        .add_pod(1, "shop/web", "app=web", &[("http", PORT, "TCP")])
        .expect("web")
        .ip;
    let web_ns = &cluster.pod("shop/web").expect("web").netns;
    let server =
        TcpServer::start(web_ns, SocketAddr::new(IpAddr::V4(web), PORT), "web").expect("server");
    let client = &cluster.pod("shop/client").expect("client").netns;
    eventually(&cluster, "client reaches web through the tunnel", || {
        reaches(client, web)
    });
    (cluster, web, server)
}

#[test]
fn pods_reach_across_nodes_only_through_the_tunnel_with_their_identity() {
    let mut cluster = tunnel_only_cluster();
    for i in 0..2 {
        let node = cluster.agent(i).node();
        let link = node
            .ip(&["-d", "link", "show", "cel_vxlan"])
            .expect("device");
        assert!(link.contains("vxlan external"), "{link}");
        assert!(link.contains("dstport 8472"), "{link}");
    }
    shop::add_to(&mut cluster).expect("the shop pods");
    let web = cluster.pod("shop/web").expect("web").ip;
    let pod = |key: &str| &cluster.pod(key).expect("pod").netns;
    let _server = shop::serve_web(&cluster).expect("server");
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());

    // Pods' MTU leaves room for VXLAN's 50 bytes.
    let eth0 = pod("shop/client")
        .ip(&["link", "show", "eth0"])
        .expect("eth0");
    assert!(eth0.contains("mtu 1450"), "{eth0}");
    // Node 1 knows web with its node as the tunnel endpoint, and node 2's pod CIDR too.
    eventually(&cluster, "node 1 tunnels to web", || {
        cluster
            .agent(0)
            .cli(&["ipcache", "list"])
            .is_ok_and(|list| {
                let via_n2 = |prefix: &str| {
                    list.lines()
                        .any(|l| l.starts_with(prefix) && l.contains("192.0.2.2"))
                };
                via_n2(&format!("{web}/32")) && via_n2("10.245.12.0/24")
            })
    });
    eventually(&cluster, "client reaches web through the tunnel", || {
        reaches(pod("shop/client"), web)
    });
    assert!(reaches(pod("shop/other"), web), "no policy yet");
    // Node 1's own traffic takes the tunnel too (its route leads into the device).
    let routes = cluster.routes(0).expect("routes");
    assert!(routes.contains("10.245.12.0/24 dev cel_vxlan"), "{routes}");
    assert!(reaches(one, web), "node 1 reaches web through the tunnel");
    // A bulk transfer: segments of the full pod MTU fit in the tunnel.
    let to_web = SocketAddr::new(IpAddr::V4(web), PORT);
    let mut stream =
        tcp_connect(pod("shop/client"), to_web, Duration::from_secs(5)).expect("connect");
    let mut banner = [0u8; 4];
    stream.read_exact(&mut banner).expect("banner");
    echo(&mut stream, 256 * 1024).expect("bulk echo across the tunnel");

    // Node 2 admits node 1's pods by the identity their packets carry.
    cluster.apply_policy(WEB_FROM_CLIENT).expect("policy");
    eventually(&cluster, "other is denied", || {
        !reaches(pod("shop/other"), web)
    });
    assert!(reaches(pod("shop/client"), web), "client is still allowed");
    let flows = cluster
        .agent(1)
        .cli(&[
            "observe",
            "--last",
            "50",
            "--verdict",
            "DROPPED",
            "-o",
            "json",
        ])
        .expect("observe");
    assert!(
        flows.contains("other"),
        "the drop names the remote pod: {flows}"
    );
    // The entities, as Cilium means them: node 2 itself is `host` (allowed, as the local node
    // always is); node 1 is `remote-node` (its tunnelled `host` identity), not selected yet.
    assert!(reaches(two, web), "the local node is allowed");
    assert!(!reaches(one, web), "remote-node is not selected");
    cluster.apply_policy(WEB_FROM_REMOTE_NODES).expect("policy");
    eventually(&cluster, "remote-node is allowed", || reaches(one, web));
    assert!(
        !reaches(pod("shop/other"), web),
        "remote-node is not its pods"
    );
    cluster.apply_policy(WEB_FROM_CLUSTER).expect("policy");
    eventually(&cluster, "cluster takes in the remote pods", || {
        reaches(pod("shop/other"), web)
    });

    // The open connection survives a restart of either agent.
    for i in 0..2 {
        cluster.agent_mut(i).stop().expect("stop an agent");
        cluster.start_agent(i).expect("restart it");
        echo(&mut stream, 4096).expect("echo after an agent restarted");
    }

    // Started again in native mode, an agent takes the device and its programs' pins away.
    let agent = cluster.agent_mut(0);
    agent.stop().expect("stop");
    for (key, value) in agent.options_mut().env.iter_mut() {
        if key == "CELLIUM_ROUTING_MODE" {
            *value = "native".into();
        }
    }
    cluster.start_agent(0).expect("start in native mode");
    let node = cluster.agent(0).node();
    assert!(
        node.ip(&["link", "show", "cel_vxlan"]).is_err(),
        "the device is gone"
    );
    let pins: Vec<String> = std::fs::read_dir(cluster.agent(0).bpf_root().join("links"))
        .expect("links")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!pins.iter().any(|p| p.contains("overlay")), "{pins:?}");
}

/// Packets `cel_vxlan` on `node` sent and received: (tx, rx).
fn vxlan_packets(node: &NetNs) -> (u64, u64) {
    let read = |counter: &str| {
        let path = format!("/sys/class/net/cel_vxlan/statistics/{counter}");
        let text = node.exec("cat", &[&path]).expect("device statistics");
        text.trim().parse::<u64>().expect("a count")
    };
    (read("tx_packets"), read("rx_packets"))
}

/// The programs encapsulate pods' packets themselves and send them straight to the underlay,
/// and take the outer headers off those for a local pod themselves: connections between pods
/// of two nodes move no packet through either node's VXLAN device. The one kind of packet the
/// receiving programs leave to the device, a GSO packet (its encapsulation state can only be
/// reset by the device), arrives whole through it.
#[test]
fn the_programs_encapsulate_and_decapsulate_past_both_vxlan_devices() {
    let (cluster, web, _server) = client_and_web();
    let client = &cluster.pod("shop/client").expect("client").netns;
    let to_web = SocketAddr::new(IpAddr::V4(web), PORT);
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());

    let before = (vxlan_packets(one), vxlan_packets(two));
    for _ in 0..20 {
        assert!(reaches(client, web), "a connection across the tunnel");
    }
    let mut stream = tcp_connect(client, to_web, Duration::from_secs(5)).expect("connect");
    let mut banner = [0u8; 4];
    stream.read_exact(&mut banner).expect("banner");
    for _ in 0..20 {
        echo(&mut stream, 100).expect("a small echo");
    }
    let after = (vxlan_packets(one), vxlan_packets(two));
    assert_eq!(
        before, after,
        "((tx, rx) node 1, (tx, rx) node 2): no packet crossed a VXLAN device"
    );

    // Segments of a bulk transfer leave encapsulated by the programs, and arrive as GSO
    // packets, which the device takes.
    echo(&mut stream, 1024 * 1024).expect("bulk echo across the tunnel");
    let bulk = (vxlan_packets(one), vxlan_packets(two));
    assert_eq!(
        (bulk.0.0, bulk.1.0),
        (after.0.0, after.1.0),
        "neither device sent a packet"
    );
    assert!(
        bulk.1.1 > after.1.1 && bulk.0.1 > after.0.1,
        "both devices received the GSO packets: before {after:?}, after {bulk:?}"
    );
}

/// The MAC address of `ifname` in `ns`.
fn mac_of(ns: &NetNs, ifname: &str) -> [u8; 6] {
    frame::mac_of(ns, ifname).expect("a MAC address")
}

/// What `node` (an index) sends to node 2's VXLAN port: the VXLAN header with `flags` and
/// `vni`, then `inner` (an Ethernet frame), as an Ethernet frame for node 2's underlay MAC.
fn vxlan_frame(cluster: &Cluster, flags: u8, vni: u32, inner: &[u8]) -> Vec<u8> {
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());
    vxlan_datagram(flags, vni, inner).frame(mac_of(one, UNDERLAY_IF), mac_of(two, UNDERLAY_IF))
}

/// The outer packet of [`vxlan_frame`].
fn vxlan_datagram(flags: u8, vni: u32, inner: &[u8]) -> Ipv4Packet {
    let vxlan = frame::vxlan(flags, vni, inner);
    Ipv4Packet {
        src: Cluster::node_ip(0),
        dst: Cluster::node_ip(1),
        protocol: 17,
        id: 1,
        offset: 0,
        more: false,
        payload: udp(40000, 8472, &vxlan),
    }
}

/// Where a frame's IPv4 header starts.
const IP_AT: usize = 14;

/// `frame` with the IPv4 header at `at` changed by `edit` (which may grow it: the header
/// length, total length and checksum are computed again).
fn edit_ipv4(mut frame: Vec<u8>, at: usize, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let len = usize::from(frame[at] & 0x0f) * 4;
    let mut header: Vec<u8> = frame.splice(at..at + len, []).collect();
    edit(&mut header);
    let len = header.len();
    header[0] = 0x40 | u8::try_from(len / 4).expect("a header length");
    let total = u16::try_from(frame.len() - at + len).expect("a total length");
    header[2..4].copy_from_slice(&total.to_be_bytes());
    header[10..12].fill(0);
    let checksum = frame::internet_checksum(&header);
    header[10..12].copy_from_slice(&checksum.to_be_bytes());
    frame.splice(at..at, header);
    frame
}

/// Frames made by hand and sent from node 1's underlay interface to node 2's VXLAN port, with
/// the zero UDP checksum the programs' own encapsulation sends (so that node 2's programs, not
/// only its VXLAN device, look at them), with the VNI node 1 itself sends (host, 1). A
/// well-formed one reaches the pod: a node's VNI is taken at its word. One without an identity
/// (VNI 0), one whose inner header claims more than the packet holds and one with flags VXLAN
/// does not define reach nothing, and the node goes on serving real traffic. Frames whose
/// outer headers the programs do not take apart (IP options, fragments, a congestion mark,
/// a UDP length short of its packet) go to the VXLAN device, as they did before the programs
/// decapsulated.
#[test]
fn hostile_vxlan_frames_reach_no_pod() {
    let (cluster, web, _server) = client_and_web();
    let client = &cluster.pod("shop/client").expect("client").netns;
    let web_ns = &cluster.pod("shop/web").expect("web").netns;
    let to_web = SocketAddr::new(IpAddr::V4(web), PORT);
    let sink = web_ns
        .run(move || UdpSocket::bind(to_web))
        .expect("netns")
        .expect("bind in web");
    sink.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let inner = |data: &[u8]| {
        Ipv4Packet {
            src: Ipv4Addr::new(10, 245, 11, 200),
            dst: web,
            protocol: 17,
            id: 7,
            offset: 0,
            more: false,
            payload: udp(40000, PORT, data),
        }
        .frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
    };
    let received = |frame: Vec<u8>| {
        frame::send(cluster.agent(0).node(), UNDERLAY_IF, frame).expect("send");
        let mut buf = [0u8; 256];
        sink.recv_from(&mut buf)
            .ok()
            .map(|(n, _)| buf[..n].to_vec())
    };
    let (_, rx_before) = vxlan_packets(cluster.agent(1).node());

    // The positive control: node 1's own identity (host, 1), which no policy refuses yet.
    let got = received(vxlan_frame(&cluster, 0x08, 1, &inner(b"hello")));
    assert_eq!(got.as_deref(), Some(&b"hello"[..]), "a well-formed frame");
    assert_eq!(
        vxlan_packets(cluster.agent(1).node()).1,
        rx_before,
        "taken by node 2's programs, not its device"
    );
    let mut short = inner(&[0u8; 100]);
    short.truncate(14 + 20 + 8);
    for (what, frame) in [
        (
            "no identity",
            vxlan_frame(&cluster, 0x08, 0, &inner(b"none")),
        ),
        (
            "an inner length beyond the packet",
            vxlan_frame(&cluster, 0x08, 1, &short),
        ),
        (
            "undefined VXLAN flags",
            vxlan_frame(&cluster, 0x0c, 1, &inner(b"flags")),
        ),
    ] {
        assert_eq!(received(frame), None, "{what} reached the pod");
    }

    // Outer headers the programs do not take apart are the device's, as before the programs
    // decapsulated: IP options, a fragmented outer packet, a congestion mark (whose copy into
    // the inner header is the device's), bytes past the UDP datagram. Each is
    // decapsulated by node 2's device, once, and its inner packet delivered as it would be.
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());
    let macs = (mac_of(one, UNDERLAY_IF), mac_of(two, UNDERLAY_IF));
    let fragments = |data: &[u8]| {
        let whole = vxlan_datagram(0x08, 1, &inner(data));
        let (head, tail) = whole.payload.split_at(16);
        [(0, true, head), (2, false, tail)].map(|(offset, more, part)| {
            Ipv4Packet {
                offset,
                more,
                payload: part.to_vec(),
                ..whole.clone()
            }
            .frame(macs.0, macs.1)
        })
    };
    // The inner packet ECN-capable (ECT(0)), so that a marked outer one is delivered marked.
    let ect = |data: &[u8]| edit_ipv4(inner(data), IP_AT, |h| h[1] = 0x02);
    // Bytes past the UDP datagram inside the outer packet (bytes past the outer packet itself
    // would not reach node 2: the underlay's bridge trims them when it filters).
    let mut trailing = vxlan_datagram(0x08, 1, &inner(b"trailing"));
    trailing.payload.extend_from_slice(&[0; 6]);
    let trailing = trailing.frame(macs.0, macs.1);
    for (what, data, frames) in [
        (
            "IP options",
            &b"options"[..],
            vec![edit_ipv4(
                vxlan_frame(&cluster, 0x08, 1, &inner(b"options")),
                IP_AT,
                |h| h.extend_from_slice(&[1, 1, 1, 0]),
            )],
        ),
        (
            "a fragmented outer packet",
            b"fragments",
            fragments(b"fragments").to_vec(),
        ),
        (
            "a congestion mark",
            b"marked",
            vec![edit_ipv4(
                vxlan_frame(&cluster, 0x08, 1, &ect(b"marked")),
                IP_AT,
                |h| h[1] = 0x03,
            )],
        ),
        ("bytes past the UDP datagram", b"trailing", vec![trailing]),
    ] {
        let (_, before) = vxlan_packets(two);
        let (last, first) = frames.split_last().expect("a frame");
        for frame in first {
            frame::send(one, UNDERLAY_IF, frame.clone()).expect("send");
        }
        assert_eq!(received(last.clone()).as_deref(), Some(data), "{what}");
        assert_eq!(vxlan_packets(two).1, before + 1, "{what}: by the device");
    }
    assert!(reaches(client, web), "real traffic still passes");
}

/// A host on the underlay that is no node: a namespace with `192.0.2.66/24` on the underlay's
/// bridge (removed with the namespace), and the MAC it sends from.
fn stranger(cluster: &Cluster) -> (NetNs, [u8; 6]) {
    let ns = cluster
        .underlay_host("strange0", &format!("{STRANGER}/24"))
        .expect("the stranger on the underlay");
    let mac = mac_of(&ns, "eth0");
    (ns, mac)
}

/// The stranger's address: on the underlay's subnet, and no node's.
const STRANGER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);

/// Node 2's datapath counter of ingress drops for `reason`.
fn drops(cluster: &Cluster, reason: &str) -> u64 {
    cluster
        .agent(1)
        .datapath_packets("ingress", reason)
        .expect("metrics")
}

/// How many of node 2's dropped flows name `reason` (Hubble's name) and come from `src`.
fn drop_flows(cluster: &Cluster, reason: &str, src: Ipv4Addr) -> usize {
    cluster
        .agent(1)
        .dropped_flows()
        .iter()
        .filter(|f| {
            f["flow"]["drop_reason_desc"] == reason
                && f["flow"]["IP"]["source"] == src.to_string().as_str()
        })
        .count()
}

/// The VNI is believed only from a node and only for an identity a node sends. A host on the
/// underlay that is no node sends node 2 well-formed VXLAN frames carrying what node 1 itself
/// sends (host, 1), for the web pod: one small enough for node 2's programs to decapsulate,
/// one with IP options, which node 2's VXLAN device decapsulates. Neither reaches the pod; each
/// is dropped as from an unknown sender, counted, and reported as a flow. The same frames from
/// node 1 reach the pod, and frames from node 1 whose VNI claims an identity no node sends
/// (kube-apiserver, the world) are dropped as invalid on both paths. Node 1's own identity is
/// remote-node, never the host: under an ingress denying all but the host, its frames pass by
/// neither path.
#[test]
fn the_tunnel_believes_a_vni_only_from_a_node_and_only_for_an_identity_a_node_sends() {
    let (cluster, web, _server) = client_and_web();
    let web_ns = &cluster.pod("shop/web").expect("web").netns;
    let to_web = SocketAddr::new(IpAddr::V4(web), PORT);
    let sink = web_ns
        .run(move || UdpSocket::bind(to_web))
        .expect("netns")
        .expect("bind in web");
    sink.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let (one, two) = (cluster.agent(0).node(), cluster.agent(1).node());
    let (stranger_ns, stranger_mac) = stranger(&cluster);
    let node_mac = mac_of(one, UNDERLAY_IF);
    let two_mac = mac_of(two, UNDERLAY_IF);
    let inner = |sport: u16, data: &[u8]| {
        Ipv4Packet {
            src: Ipv4Addr::new(10, 245, 11, 200),
            dst: web,
            protocol: 17,
            id: 7,
            offset: 0,
            more: false,
            payload: udp(sport, PORT, data),
        }
        .frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
    };
    // The frame for node 2 from `src` (node 1 or the stranger), with `vni`, either as the
    // programs take it or with IP options, for the device. The inner packet comes from
    // `sport`: a connection conntrack has not seen is decided by policy.
    let frame = |src: Ipv4Addr, vni: u32, sport: u16, data: &[u8], device: bool| {
        let datagram = Ipv4Packet {
            src,
            ..vxlan_datagram(0x08, vni, &inner(sport, data))
        };
        let mac = if src == STRANGER {
            stranger_mac
        } else {
            node_mac
        };
        let frame = datagram.frame(mac, two_mac);
        if device {
            edit_ipv4(frame, IP_AT, |h| h.extend_from_slice(&[1, 1, 1, 0]))
        } else {
            frame
        }
    };
    // What the pod receives of `frame` sent from `src`'s namespace.
    let received = |src: Ipv4Addr, frame: Vec<u8>| {
        let (ns, ifname) = if src == STRANGER {
            (&stranger_ns, "eth0")
        } else {
            (one, UNDERLAY_IF)
        };
        frame::send(ns, ifname, frame).expect("send");
        let mut buf = [0u8; 256];
        sink.recv_from(&mut buf)
            .ok()
            .map(|(n, _)| buf[..n].to_vec())
    };
    let node = Cluster::node_ip(0);

    for (path, device) in [("the programs", false), ("the device", true)] {
        // The control: node 1's frame reaches the pod, by the path named.
        let (_, rx) = vxlan_packets(two);
        assert_eq!(
            received(node, frame(node, 1, 40000, b"node", device)).as_deref(),
            Some(&b"node"[..]),
            "{path}: node 1's frame"
        );
        assert_eq!(
            vxlan_packets(two).1,
            rx + u64::from(device),
            "{path}: node 1's frame taken by {path}"
        );

        let before = drops(&cluster, "unknown sender");
        let (_, rx) = vxlan_packets(two);
        assert_eq!(
            received(STRANGER, frame(STRANGER, 1, 40000, b"stranger", device)),
            None,
            "{path}: a stranger's frame reached the pod"
        );
        eventually(&cluster, &format!("{path}: counted"), || {
            drops(&cluster, "unknown sender") == before + 1
        });
        assert_eq!(
            vxlan_packets(two).1,
            rx + u64::from(device),
            "{path}: the stranger's frame taken by {path}"
        );

        for vni in [7, 2] {
            let before = drops(&cluster, "invalid identity");
            assert_eq!(
                received(node, frame(node, vni, 40000, b"claim", device)),
                None,
                "{path}: VNI {vni} reached the pod"
            );
            eventually(&cluster, &format!("{path}: VNI {vni} counted"), || {
                drops(&cluster, "invalid identity") == before + 1
            });
        }
    }
    // Each drop is a flow with its reason: the programs' shows the outer packet (from the
    // stranger), the device's the inner one.
    eventually(&cluster, "the unknown senders' flows", || {
        drop_flows(&cluster, "UNKNOWN_SENDER", STRANGER) == 1
            && drop_flows(&cluster, "UNKNOWN_SENDER", Ipv4Addr::new(10, 245, 11, 200)) == 1
    });
    eventually(&cluster, "the invalid identities' flows", || {
        drop_flows(&cluster, "INVALID_IDENTITY", node)
            + drop_flows(
                &cluster,
                "INVALID_IDENTITY",
                Ipv4Addr::new(10, 245, 11, 200),
            )
            == 4
    });
    let client = &cluster.pod("shop/client").expect("client").netns;
    assert!(reaches(client, web), "real traffic still passes");

    // A node's own identity is remote-node here, never the host: under an ingress that denies
    // everything but the host (`allow-localhost`), node 1's VNI 1 on a new connection passes
    // by neither path.
    cluster
        .apply_policy(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: web-no-ingress, namespace: shop }\nspec: { podSelector: { matchLabels: { app: web } }, policyTypes: [ Ingress ] }\n",
        )
        .expect("policy");
    eventually(&cluster, "client is denied", || !reaches(client, web));
    for device in [false, true] {
        let before = drops(&cluster, "policy default deny");
        assert_eq!(
            received(node, frame(node, 1, 40001, b"host", device)),
            None,
            "node 1's VNI 1 passed as the host (device: {device})"
        );
        eventually(&cluster, "denied as remote-node", || {
            drops(&cluster, "policy default deny") > before
        });
    }
}

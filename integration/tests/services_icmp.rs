//! ICMP and ICMPv6 errors that belong to a connection through a service: the real agent in a
//! node namespace with the lab's external network (`celx0`), pods through the real
//! `cellium-cni`, services through `cellium apply`. An error a backend (or a router on its
//! way) sends about a translated connection reaches the client from the service address,
//! quoting the packet as the client sent it, whatever the client's ingress policy; a forged
//! error that quotes no connection is still decided by policy, and so is one a pod sends about
//! a live connection it is no party of.
//!
//! Root, serially, after `cargo build --workspace --bins`:
//! `cargo test -p cellium-integration --test services_icmp -- --test-threads=1`.
//!
//! Every test makes its own namespaces and agent and removes them through guards; traffic
//! goes only to addresses inside them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use cellium_integration::frame;
use cellium_integration::lab::external::NODE_LINK_IP;
use cellium_integration::lab::service_bed::{self, NODE6, ServiceBed, pods};
use cellium_integration::wait::wait_for;
use cellium_integration::{Agent, NetNs, probe, serial};
use serde_json::Value;

/// Long enough that a lost error shows as a timeout, not as a refusal.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The port nothing listens on in the backend.
const CLOSED: u16 = 9999;
/// A port the backend answers on.
const ECHO: u16 = 8053;

/// The client's ingress: nothing is allowed in.
const CLIENT_NO_INGRESS: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: client-no-ingress, namespace: default }\nspec: { podSelector: { matchLabels: { app: client } }, policyTypes: [ Ingress ] }\n";

/// A dual-stack service of type `kind` whose UDP port 53 leads to web-0's closed port.
fn closed_service(kind: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: closed }}\nspec:\n  type: {kind}\n  ipFamilyPolicy: PreferDualStack\n  selector: {{ app: web }}\n  ports: [ {{ name: dns, port: 53, protocol: UDP, targetPort: {CLOSED} }} ]\n"
    )
}

fn setup() -> ServiceBed {
    ServiceBed::start(&pods(1, false), "icmp").expect("the service bed")
}

/// The frontends of `default/<name>` of `kind`, once there are `count` of them, each with a
/// backend; their addresses, IPv4 first.
fn frontends(agent: &Agent, name: &str, kind: &str, count: usize) -> Vec<SocketAddr> {
    let service = format!("default/{name}");
    let found = wait_for(&format!("{count} {kind} frontends of {service}"), || {
        let all = agent.cli_json(&["service", "list"]).ok()?;
        let found: Vec<Value> = all
            .as_array()?
            .iter()
            .filter(|f| f["service"] == service.as_str() && f["kind"] == kind)
            .filter(|f| f["backends"].as_array().map(Vec::len) == Some(1))
            .cloned()
            .collect();
        (found.len() == count).then_some(found)
    });
    let mut addrs: Vec<SocketAddr> = found
        .iter()
        .map(|f| {
            let ip: IpAddr = f["vip"].as_str().and_then(|s| s.parse().ok()).expect("vip");
            let port = f["port"].as_u64().and_then(|p| u16::try_from(p).ok());
            SocketAddr::new(ip, port.expect("port"))
        })
        .collect();
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs
}

/// [`probe::udp_error`] within [`TIMEOUT`].
fn udp_error_of(ns: &NetNs, to: SocketAddr) -> Option<std::io::ErrorKind> {
    probe::udp_error(ns, to, TIMEOUT).expect("run in the namespace")
}

/// Whether a frame is an ICMP or ICMPv6 destination unreachable (no extension headers).
fn is_unreachable(frame: &[u8]) -> bool {
    match frame.get(12..14) {
        Some([0x08, 0x00]) => frame.get(23) == Some(&1) && frame.get(34) == Some(&3),
        Some([0x86, 0xdd]) => frame.get(20) == Some(&58) && frame.get(54) == Some(&1),
        _ => false,
    }
}

/// Checks an error as `client` received it about its datagram to `service`: from the service
/// address, to the client, valid checksums (the quoted IPv4 header's too), and a quote of the
/// client's packet as it sent it (the client's address, the service address and port).
fn check_error(frame: &[u8], client: IpAddr, service: SocketAddr) {
    let port = |l4: &[u8]| u16::from_be_bytes([l4[2], l4[3]]);
    match (client, service.ip()) {
        (IpAddr::V4(client), IpAddr::V4(vip)) => {
            let ip = &frame[14..34];
            assert_eq!(frame::internet_checksum(ip), 0, "IPv4 header checksum");
            assert_eq!(&ip[12..16], &vip.octets(), "from the service address");
            assert_eq!(&ip[16..20], &client.octets(), "to the client");
            let icmp = &frame[34..];
            assert_eq!((icmp[0], icmp[1]), (3, 3), "port unreachable");
            assert_eq!(frame::internet_checksum(icmp), 0, "ICMP checksum");
            let quote = &icmp[8..];
            assert_eq!(
                frame::internet_checksum(&quote[..20]),
                0,
                "quoted header checksum"
            );
            assert_eq!(&quote[12..16], &client.octets(), "quoted source");
            assert_eq!(&quote[16..20], &vip.octets(), "quoted destination");
            assert_eq!(port(&quote[20..]), service.port(), "quoted port");
        }
        (IpAddr::V6(client), IpAddr::V6(vip)) => {
            let ip = &frame[14..54];
            assert_eq!(&ip[8..24], &vip.octets(), "from the service address");
            assert_eq!(&ip[24..40], &client.octets(), "to the client");
            let icmp = &frame[54..];
            assert_eq!((icmp[0], icmp[1]), (1, 4), "port unreachable");
            let mut pseudo = ip[8..40].to_vec();
            pseudo.extend((icmp.len() as u32).to_be_bytes());
            pseudo.extend([0, 0, 0, 58]);
            pseudo.extend(icmp);
            assert_eq!(frame::internet_checksum(&pseudo), 0, "ICMPv6 checksum");
            let quote = &icmp[8..];
            assert_eq!(&quote[8..24], &client.octets(), "quoted source");
            assert_eq!(&quote[24..40], &vip.octets(), "quoted destination");
            assert_eq!(port(&quote[40..]), service.port(), "quoted port");
        }
        _ => panic!("{client} and {service} are of two families"),
    }
}

/// From `ns` (capturing on `ifname`), a datagram to `to`: refused, and the error as received
/// checks out for `client`.
fn refused_from_service(ns: &NetNs, ifname: &str, client: IpAddr, to: SocketAddr) {
    let capture = frame::Capture::open(ns, ifname).expect("capture");
    assert_eq!(
        udp_error_of(ns, to),
        Some(std::io::ErrorKind::ConnectionRefused),
        "to {to}"
    );
    let error = capture
        .next(TIMEOUT, is_unreachable)
        .expect("the error, as the client received it");
    check_error(&error, client, to);
}

#[test]
fn a_closed_backend_port_behind_a_cluster_ip_is_refused_from_the_cluster_ip_in_both_families() {
    let _serial = serial();
    let env = setup();
    env.agent
        .objects("apply", &closed_service("ClusterIP"))
        .expect("apply the service");
    let vips = frontends(&env.agent, "closed", "ClusterIP", 2);
    for (to, client) in vips.iter().zip(&env.client_ips) {
        refused_from_service(&env.client, "eth0", *client, *to);
    }
    // The errors were the connections' own: no policy decided them, nothing was dropped.
    assert_eq!(env.agent.datapath_drops().expect("metrics"), 0);
}

#[test]
fn a_closed_backend_port_behind_a_node_port_is_refused_from_the_node_port_outside() {
    let _serial = serial();
    let env = setup();
    // Port 53 leads to the closed port; port 54 to a server, to know when the node's device
    // translates (its program is put in place within 5 s of the node's address; until then
    // the node itself refuses a datagram to a node port, from the same address).
    let _servers: Vec<probe::UdpServer> = env
        .web_ips
        .iter()
        .map(|ip| {
            probe::UdpServer::start(&env.web, SocketAddr::new(*ip, ECHO), "web").expect("server")
        })
        .collect();
    let service = closed_service("NodePort").replace(
        " ]\n",
        &format!(", {{ name: echo, port: 54, protocol: UDP, targetPort: {ECHO} }} ]\n"),
    );
    env.agent
        .objects("apply", &service)
        .expect("apply the service");
    let node6: IpAddr = NODE6.parse().expect("an address");
    let node_port = |target: u16, ip: IpAddr| {
        wait_for(&format!("the node port to {target} on {ip}"), || {
            let all = env.agent.cli_json(&["service", "list"]).ok()?;
            all.as_array()?
                .iter()
                .filter(|f| f["service"] == "default/closed" && f["kind"] == "NodePort")
                .filter(|f| f["target_port"] == target.to_string().as_str())
                .filter(|f| f["vip"].as_str() == Some(ip.to_string().as_str()))
                .find_map(|f| u16::try_from(f["port"].as_u64()?).ok())
                .map(|port| SocketAddr::new(ip, port))
        })
    };
    let outside = env.external.netns();
    for ip in [IpAddr::from(NODE_LINK_IP), node6] {
        let echo = node_port(ECHO, ip);
        wait_for(&format!("{echo} translates"), || {
            probe::udp_request(outside, echo, Duration::from_millis(500)).ok()
        });
    }
    let ext4: IpAddr = cellium_integration::lab::external::EXT_LINK_IP.into();
    let ext6: IpAddr = "fd00:98::2".parse().expect("an address");
    for (ip, client) in [(IpAddr::from(NODE_LINK_IP), ext4), (node6, ext6)] {
        refused_from_service(outside, "eth0", client, node_port(CLOSED, ip));
    }
    // Translated, not dropped and answered by the node.
    assert_eq!(env.agent.datapath_drops().expect("metrics"), 0);
}

/// A datagram of `size` bytes to `to` from a connected UDP socket (which sets DF, or for
/// IPv6 does not fragment below the path MTU: path MTU discovery is Linux's default), then a
/// read: the read's OS error and, for IPv4, the socket's path MTU (`IP_MTU`) after it.
fn pmtu_probe(ns: &NetNs, to: SocketAddr, size: usize) -> (Option<i32>, Option<i32>) {
    ns.run(move || -> std::io::Result<(Option<i32>, Option<i32>)> {
        let any: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let sock = std::net::UdpSocket::bind(any)?;
        sock.connect(to)?;
        sock.set_read_timeout(Some(TIMEOUT))?;
        sock.send(&vec![0x5a; size])?;
        let error = sock
            .recv(&mut [0u8; 64])
            .err()
            .and_then(|e| e.raw_os_error());
        if to.is_ipv6() {
            return Ok((error, None));
        }
        let mtu = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::IpMtu)
            .map_err(std::io::Error::from)?;
        Ok((error, Some(mtu)))
    })
    .expect("run in the namespace")
    .expect("the probe's socket")
}

/// The path MTU the client's routing cache holds for `to` (`ip route get`), if any.
fn cached_mtu(ns: &NetNs, to: IpAddr) -> Option<u32> {
    let out = ns
        .ip(&["route", "get", &to.to_string()])
        .expect("ip route get");
    let mut words = out.split_whitespace();
    words.find(|w| *w == "mtu")?;
    words.next()?.parse().ok()
}

/// The link of MTU 1280 behind the external namespace, to `10.99.0.50` and `fd00:99::50`:
/// the external namespace routes to them and answers "fragmentation needed" ("packet too
/// big") for more.
fn far_link(ext: &NetNs) -> NetNs {
    let far = NetNs::new().expect("far netns");
    let name = far.name().to_string();
    let commands: [&[&str]; 3] = [
        &[
            "link", "add", "far0", "type", "veth", "peer", "name", "eth0", "netns", &name,
        ],
        &["link", "set", "far0", "mtu", "1280", "up"],
        &["route", "add", "10.99.0.50/32", "dev", "far0"],
    ];
    for args in commands {
        ext.ip(args).expect("the external side");
    }
    ext.ip(&["-6", "route", "add", "fd00:99::50/128", "dev", "far0"])
        .expect("the external side");
    ext.sysctl("net.ipv4.ip_forward", "1").expect("forwarding");
    ext.sysctl("net.ipv6.conf.all.forwarding", "1")
        .expect("forwarding");
    far.ip(&["addr", "add", "10.99.0.50/32", "dev", "eth0"])
        .expect("far address");
    far.ip(&["addr", "add", "fd00:99::50/128", "dev", "eth0", "nodad"])
        .expect("far address");
    far.ip(&["link", "set", "eth0", "mtu", "1280", "up"])
        .expect("far up");
    far
}

/// Services whose one backend is beyond the far link: `far` (IPv4, 10.96.0.60:53) and `far6`.
const FAR: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: far }
spec: { clusterIP: 10.96.0.60, ports: [ { name: dns, port: 53, protocol: UDP } ] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: far-1, labels: { kubernetes.io/service-name: far } }
addressType: IPv4
endpoints: [ { addresses: [ 10.99.0.50 ] } ]
ports: [ { name: dns, port: 7000, protocol: UDP } ]
---
apiVersion: v1
kind: Service
metadata: { name: far6 }
spec: { ipFamilies: [ IPv6 ], ports: [ { name: dns, port: 53, protocol: UDP } ] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: far6-1, labels: { kubernetes.io/service-name: far6 } }
addressType: IPv6
endpoints: [ { addresses: [ "fd00:99::50" ] } ]
ports: [ { name: dns, port: 7000, protocol: UDP } ]
"#;

#[test]
fn a_router_behind_a_cluster_ip_teaches_the_client_the_path_mtu_of_the_cluster_ip() {
    let _serial = serial();
    let env = setup();
    let _far = far_link(env.external.netns());
    env.agent.objects("apply", FAR).expect("apply the services");
    let vip = frontends(&env.agent, "far", "ClusterIP", 1)[0];
    assert_eq!(
        vip,
        SocketAddr::new(Ipv4Addr::new(10, 96, 0, 60).into(), 53)
    );
    let vip6 = frontends(&env.agent, "far6", "ClusterIP", 1)[0];
    assert!(vip6.is_ipv6(), "{vip6}");

    assert_eq!(cached_mtu(&env.client, vip.ip()), None);
    let (error, mtu) = pmtu_probe(&env.client, vip, 1300);
    assert_eq!(
        error,
        Some(nix::libc::EMSGSIZE),
        "the socket learns the datagram was too big"
    );
    assert_eq!(mtu, Some(1280), "the path MTU towards the cluster IP");
    assert_eq!(cached_mtu(&env.client, vip.ip()), Some(1280));
    // What fits the path goes through as before.
    let (error, _) = pmtu_probe(&env.client, vip, 1000);
    assert_ne!(error, Some(nix::libc::EMSGSIZE));

    // IPv6: packet too big, the same way.
    assert_eq!(cached_mtu(&env.client, vip6.ip()), None);
    let (error, _) = pmtu_probe(&env.client, vip6, 1300);
    assert_eq!(
        error,
        Some(nix::libc::EMSGSIZE),
        "packet too big reaches the socket"
    );
    assert_eq!(cached_mtu(&env.client, vip6.ip()), Some(1280));
}

fn counter(agent: &Agent, direction: &str, reason: &str) -> u64 {
    agent.datapath_packets(direction, reason).expect("metrics")
}

#[test]
fn a_related_error_passes_a_deny_all_ingress_and_a_forged_one_does_not() {
    let _serial = serial();
    let env = setup();
    env.agent
        .objects("apply", &closed_service("ClusterIP"))
        .expect("apply the service");
    let vips = frontends(&env.agent, "closed", "ClusterIP", 2);
    env.agent
        .objects("apply", CLIENT_NO_INGRESS)
        .expect("apply the policy");
    let client4 = env.client_ips[0];
    wait_for("the client's ingress denies the backend", || {
        (!probe::ping(&env.web, client4, 1).expect("ping")).then_some(())
    });

    // The backend's errors about the client's own datagrams: the connection's.
    for (to, client) in vips.iter().zip(&env.client_ips) {
        refused_from_service(&env.client, "eth0", *client, *to);
    }

    // The same error quoting nothing the client sent: a new flow, which the policy denies.
    let (IpAddr::V4(web), IpAddr::V4(client)) = (env.web_ips[0], client4) else {
        panic!("IPv4 first: {:?} {:?}", env.web_ips, env.client_ips);
    };
    let link = env.agent.endpoint_link(env.web_ips[0]);
    let reason = "policy default deny";
    let before = counter(&env.agent, "ingress", reason);
    let capture = frame::Capture::open(&env.client, "eth0").expect("capture");
    frame::send(
        &env.web,
        "eth0",
        frame::port_unreachable(
            web.into(),
            client.into(),
            (
                SocketAddr::new(client.into(), 40000),
                SocketAddr::new(web.into(), 4242),
            ),
            (link.pod_mac, link.host_mac),
        ),
    )
    .expect("send the forged error");
    wait_for("the forged error is denied", || {
        (counter(&env.agent, "ingress", reason) > before).then_some(())
    });
    // A related error after it still arrives, and is the first error the client sees.
    assert_eq!(
        udp_error_of(&env.client, vips[0]),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    let first = capture
        .next(TIMEOUT, is_unreachable)
        .expect("the related error");
    check_error(&first, client4, vips[0]);
}

/// A third pod, a party of no connection of the others.
const INTRUDER: &str = r#"
apiVersion: v1
kind: Pod
metadata: { name: intruder, labels: { app: intruder } }
spec: { containers: [ { name: c } ] }
"#;

/// A dual-stack ClusterIP whose UDP port 54 leads to web-0's [`ECHO`].
fn echo_service() -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: echo }}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  selector: {{ app: web }}\n  ports: [ {{ name: echo, port: 54, protocol: UDP, targetPort: {ECHO} }} ]\n"
    )
}

/// One datagram over `sock` and its answer: how the read failed, `None` if the answer came.
fn exchange(sock: &UdpSocket) -> Option<std::io::ErrorKind> {
    sock.send(b"hello").expect("send");
    sock.recv(&mut [0u8; 64]).err().map(|e| e.kind())
}

/// The client's live UDP connection to the backend `web` (through `to`, web itself or a
/// cluster IP): the intruder's port unreachable quoting it is no party's and meets the
/// client's ingress policy, which denies it (counted); the connection lives on, and web's own
/// port unreachable, once its port is closed, is related and reaches the client.
fn only_the_peer_refuses(
    env: &ServiceBed,
    intruder: (&NetNs, IpAddr, ([u8; 6], [u8; 6])),
    to: SocketAddr,
    web: SocketAddr,
) {
    let server = probe::UdpServer::start(&env.web, web, "web").expect("server");
    let sock = probe::udp_connect(&env.client, to, TIMEOUT).expect("a connected UDP socket");
    assert_eq!(exchange(&sock), None, "a live connection to {to}");
    let client = sock.local_addr().expect("the client's address");

    let reason = "policy default deny";
    let before = counter(&env.agent, "ingress", reason);
    let (ns, from, macs) = intruder;
    let error = frame::port_unreachable(from, client.ip(), (client, web), macs);
    frame::send(ns, "eth0", error).expect("send the intruder's error");
    wait_for(
        &format!("the intruder's error about {to} is denied"),
        || {
            if let Some(e) = sock.take_error().expect("SO_ERROR") {
                panic!("the intruder's error about {to} reached the client: {e}");
            }
            (counter(&env.agent, "ingress", reason) > before).then_some(())
        },
    );
    assert_eq!(exchange(&sock), None, "the connection to {to} lives on");

    drop(server);
    assert_eq!(
        exchange(&sock),
        Some(std::io::ErrorKind::ConnectionRefused),
        "web's own error about {to}"
    );
}

#[test]
fn an_error_from_a_pod_no_party_of_the_connection_is_denied_and_the_peers_is_related() {
    let _serial = serial();
    let env = setup();
    env.agent
        .objects("apply", INTRUDER)
        .expect("apply the intruder");
    let (intruder, intruder_ips) =
        service_bed::add_pod(&env.agent, "intruder", "icmp").expect("the intruder");
    env.agent
        .objects("apply", &echo_service())
        .expect("apply the service");
    let vips = frontends(&env.agent, "echo", "ClusterIP", 2);
    env.agent
        .objects("apply", CLIENT_NO_INGRESS)
        .expect("apply the policy");
    let client4 = env.client_ips[0];
    wait_for("the client's ingress denies everything", || {
        (!probe::ping(&intruder, client4, 1).expect("ping")).then_some(())
    });

    let link = env.agent.endpoint_link(intruder_ips[0]);
    let macs = (link.pod_mac, link.host_mac);
    for (family, vip) in vips.iter().enumerate() {
        let web = SocketAddr::new(env.web_ips[family], ECHO);
        let intruder = (&intruder, intruder_ips[family], macs);
        // Straight to the backend, then through the cluster IP (translated back).
        only_the_peer_refuses(&env, intruder, web, web);
        only_the_peer_refuses(&env, intruder, *vip, web);
    }
}

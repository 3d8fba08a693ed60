//! NodePort, external IP and load balancer IP frontends end to end: the real agent in a node
//! namespace with the lab's external network on `celx0` (10.98.0.1 / fd00:98::1), pods
//! through the real `cellium-cni`, services through `cellium apply`, TCP from outside and
//! from a pod, in both families; and that nothing arriving from outside is the node itself.
//!
//! Root, serially, after `cargo build --workspace --bins`:
//! `cargo test -p cellium-integration --test nodeport -- --test-threads=1`.
//!
//! Every test makes its own namespaces and agent and removes them through guards; traffic
//! goes only to addresses inside them (the node's link address, the test's external and
//! ingress IPs, routed to the node inside the external namespace only).

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cellium_integration::lab::external::{EXT_LINK_IP, NODE_LINK_IP};
use cellium_integration::lab::service_bed::{self, EXT6, NODE6, ServiceBed, frontends, pods};
use cellium_integration::probe::{self, PeerServer, seen_from};
use cellium_integration::wait::wait_for;
use cellium_integration::{Agent, NetNs, frame, serial};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A service of type `kind` selecting web-0, with `extra` spec lines (indented two spaces).
fn service(name: &str, kind: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name} }}\nspec:\n  type: {kind}\n  ipFamilyPolicy: PreferDualStack\n  selector: {{ app: web }}\n  ports: [ {{ name: http, port: 80, targetPort: http }} ]\n{extra}"
    )
}

/// The service bed with web-0's servers on its port `http` (8080) in both families.
struct Env {
    // Drop order: servers, then the bed.
    _servers: Vec<PeerServer>,
    bed: ServiceBed,
}

impl std::ops::Deref for Env {
    type Target = ServiceBed;
    fn deref(&self) -> &ServiceBed {
        &self.bed
    }
}

impl std::ops::DerefMut for Env {
    fn deref_mut(&mut self) -> &mut ServiceBed {
        &mut self.bed
    }
}

fn setup() -> Env {
    let bed = ServiceBed::start(&pods(1, true), "np").expect("the service bed");
    let servers: Vec<PeerServer> = bed
        .web_ips
        .iter()
        .map(|ip| PeerServer::start(&bed.web, SocketAddr::new(*ip, 8080)).expect("server"))
        .collect();
    Env {
        _servers: servers,
        bed,
    }
}

/// The frontends of `default/<name>` of `kind`, once there are `count` of them.
fn frontends_of(agent: &Agent, name: &str, kind: &str, count: usize) -> Vec<Value> {
    let service = format!("default/{name}");
    wait_for(&format!("{count} {kind} frontends of {service}"), || {
        let found: Vec<Value> = frontends(agent)
            .into_iter()
            .filter(|f| f["service"] == service.as_str() && f["kind"] == kind)
            .collect();
        (found.len() == count).then_some(found)
    })
}

/// The NodePort frontends of `default/<name>` (one per node address: the link's and the pod
/// gateway's, of both families), once the link's of both families are there.
fn node_port_frontends(agent: &Agent, name: &str) -> Vec<Value> {
    let service = format!("default/{name}");
    wait_for(
        &format!("NodePort frontends of {service} on the link"),
        || {
            let found: Vec<Value> = frontends(agent)
                .into_iter()
                .filter(|f| f["service"] == service.as_str() && f["kind"] == "NodePort")
                .collect();
            let on = |ip: &str| found.iter().any(|f| f["vip"] == ip);
            (on(&NODE_LINK_IP.to_string()) && on(NODE6)).then_some(found)
        },
    )
}

/// The node port `default/<name>` listens on at the node's addresses.
fn node_port(agent: &Agent, name: &str) -> u16 {
    let fronts = node_port_frontends(agent, name);
    let ports: std::collections::BTreeSet<u64> =
        fronts.iter().filter_map(|f| f["port"].as_u64()).collect();
    assert_eq!(ports.len(), 1, "one node port on every address: {fronts:?}");
    ports
        .into_iter()
        .next()
        .and_then(|p| u16::try_from(p).ok())
        .expect("a port")
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("an address"), port)
}

#[test]
fn a_node_port_is_reached_from_outside_and_from_pods_with_each_traffic_policy() {
    let _serial = serial();
    let env = setup();
    let agent = &env.agent;
    agent
        .objects("apply", &service("cluster", "NodePort", ""))
        .expect("apply the Cluster service");
    agent
        .objects(
            "apply",
            &service("local", "NodePort", "  externalTrafficPolicy: Local\n"),
        )
        .expect("apply the Local service");
    let cluster = node_port(agent, "cluster");
    let local = node_port(agent, "local");
    for port in [cluster, local] {
        assert!((30000..=32767).contains(&port), "{port}");
    }
    let fronts = node_port_frontends(agent, "local");
    assert!(
        fronts.iter().all(|f| f["traffic_policy"] == "Local"),
        "{fronts:?}"
    );
    // Without bpf-lb-sock the node's own processes still need kube-proxy, and status says so.
    let status = agent.cli(&["status", "--verbose"]).expect("cellium status");
    assert!(
        status.contains("KubeProxyReplacement: False (bpf-lb-sock off"),
        "{status}"
    );

    let outside = env.external.netns();
    // From outside, Cluster: the backend sees the node's address.
    let seen = wait_for("the IPv4 node port answering from outside", || {
        seen_from(outside, SocketAddr::new(NODE_LINK_IP.into(), cluster)).ok()
    });
    assert_eq!(seen, IpAddr::from(NODE_LINK_IP));
    let seen = seen_from(outside, at(NODE6, cluster)).expect("IPv6 node port from outside");
    assert_eq!(seen, NODE6.parse::<IpAddr>().unwrap());
    // From outside, Local: the client's own address.
    let seen = seen_from(outside, SocketAddr::new(NODE_LINK_IP.into(), local))
        .expect("IPv4 Local node port from outside");
    assert_eq!(seen, IpAddr::from(EXT_LINK_IP));
    let seen = seen_from(outside, at(NODE6, local)).expect("IPv6 Local node port from outside");
    assert_eq!(seen, EXT6.parse::<IpAddr>().unwrap());
    // From a pod, to the node's address and node port: the pod's own address.
    for (node, client) in [
        (IpAddr::from(NODE_LINK_IP), env.client_ips[0]),
        (NODE6.parse().unwrap(), env.client_ips[1]),
    ] {
        for port in [cluster, local] {
            let seen = seen_from(&env.client, SocketAddr::new(node, port))
                .unwrap_or_else(|e| panic!("{node}:{port} from the pod: {e}"));
            assert_eq!(seen, client, "{node}:{port}");
        }
    }
}

#[test]
fn a_local_node_port_without_a_local_backend_refuses() {
    let _serial = serial();
    let env = setup();
    let agent = &env.agent;
    // Its only endpoint is on another node.
    let remote = r#"
apiVersion: v1
kind: Service
metadata: { name: remote }
spec:
  type: NodePort
  externalTrafficPolicy: Local
  ipFamilyPolicy: PreferDualStack
  ports: [ { name: http, port: 80 } ]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: remote-1, labels: { kubernetes.io/service-name: remote } }
addressType: IPv4
endpoints: [ { addresses: [ 10.244.9.9 ] } ]
ports: [ { name: http, port: 8080 } ]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: remote-2, labels: { kubernetes.io/service-name: remote } }
addressType: IPv6
endpoints: [ { addresses: [ "fd00:10:244::99" ] } ]
ports: [ { name: http, port: 8080 } ]
"#;
    agent.objects("apply", remote).expect("apply");
    let port = node_port(agent, "remote");
    let outside = env.external.netns();
    let refused = |ns: &NetNs, to: SocketAddr| {
        ns.run(move || {
            TcpStream::connect_timeout(&to, TIMEOUT)
                .err()
                .map(|e| e.kind())
        })
        .expect("enter the namespace")
    };
    wait_for("a refusal from outside", || {
        (refused(outside, SocketAddr::new(NODE_LINK_IP.into(), port))
            == Some(std::io::ErrorKind::ConnectionRefused))
        .then_some(())
    });
    for (ns, to) in [
        (outside, at(NODE6, port)),
        (&env.client, SocketAddr::new(NODE_LINK_IP.into(), port)),
        (&env.client, at(NODE6, port)),
    ] {
        assert_eq!(
            refused(ns, to),
            Some(std::io::ErrorKind::ConnectionRefused),
            "{to}"
        );
    }
}

#[test]
fn external_and_load_balancer_ips_are_served_at_the_service_port() {
    let _serial = serial();
    let env = setup();
    let agent = &env.agent;
    agent
        .objects(
            "apply",
            &service("ext", "ClusterIP", "  externalIPs: [ 192.0.2.10 ]\n"),
        )
        .expect("apply the external IP service");
    agent
        .objects(
            "apply",
            &format!(
                "{}status: {{ loadBalancer: {{ ingress: [ {{ ip: 192.0.2.20 }} ] }} }}\n",
                service("lb", "LoadBalancer", "  externalTrafficPolicy: Local\n")
            ),
        )
        .expect("apply the LoadBalancer service");
    frontends_of(agent, "ext", "ExternalIP", 1);
    frontends_of(agent, "lb", "LoadBalancer", 1);
    let outside = env.external.netns();
    for ip in ["192.0.2.10", "192.0.2.20"] {
        outside
            .ip(&["route", "add", ip, "via", &NODE_LINK_IP.to_string()])
            .expect("route the IP to the node");
    }
    // Cluster: the source becomes the frontend's address; Local: the client's is kept.
    let seen = wait_for("the external IP answering from outside", || {
        seen_from(outside, at("192.0.2.10", 80)).ok()
    });
    assert_eq!(seen, "192.0.2.10".parse::<IpAddr>().unwrap());
    let seen = seen_from(outside, at("192.0.2.20", 80)).expect("the ingress IP from outside");
    assert_eq!(seen, IpAddr::from(EXT_LINK_IP));
    for ip in ["192.0.2.10", "192.0.2.20"] {
        let seen = seen_from(&env.client, at(ip, 80)).expect("from the pod");
        assert_eq!(seen, env.client_ips[0], "{ip}");
    }
}

#[test]
fn an_allocated_node_port_survives_a_restart_and_a_taken_or_outside_one_is_refused() {
    let _serial = serial();
    let mut env = setup();
    env.agent
        .objects("apply", &service("web", "NodePort", ""))
        .expect("apply");
    let port = node_port(&env.agent, "web");
    env.agent.stop().expect("stop the agent");
    env.agent.start().expect("start the agent again");
    assert_eq!(node_port(&env.agent, "web"), port);

    let taken = service("other", "NodePort", "").replace(
        "targetPort: http }",
        &format!("targetPort: http, nodePort: {port} }}"),
    );
    let err = env.agent.objects("apply", &taken).unwrap_err().to_string();
    assert!(
        err.contains(&format!("spec.ports[0].nodePort: {port}: provided port is already allocated (to service default/web)")),
        "{err}"
    );
    let outside = service("other", "NodePort", "")
        .replace("targetPort: http }", "targetPort: http, nodePort: 8080 }");
    let err = env
        .agent
        .objects("apply", &outside)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.ports[0].nodePort: 8080: provided port is not in the valid range"),
        "{err}"
    );
    assert!(
        frontends(&env.agent)
            .iter()
            .all(|f| f["service"] != "default/other"),
        "nothing of the refused service is programmed"
    );
    assert_eq!(node_port(&env.agent, "web"), port);
    let seen = wait_for("the node port answering from outside", || {
        seen_from(
            env.external.netns(),
            SocketAddr::new(NODE_LINK_IP.into(), port),
        )
        .ok()
    });
    assert_eq!(seen, IpAddr::from(NODE_LINK_IP));
}

/// `GET /` on a health check port from `ns`: the status code and the body.
fn health(ns: &NetNs, to: SocketAddr) -> std::io::Result<(u16, Value)> {
    ns.run(move || -> std::io::Result<(u16, Value)> {
        let mut stream = TcpStream::connect_timeout(&to, TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stream, &mut text)?;
        let bad = || std::io::Error::other(format!("not an HTTP answer: {text:?}"));
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(bad)?;
        let body = text.split("\r\n\r\n").nth(1).ok_or_else(bad)?;
        Ok((code, serde_json::from_str(body).map_err(|_| bad())?))
    })
    .expect("enter the namespace")
}

#[test]
fn the_health_check_node_port_answers_200_with_a_local_endpoint_and_503_without() {
    let _serial = serial();
    let env = setup();
    let agent = &env.agent;
    agent
        .objects(
            "apply",
            &service(
                "lb",
                "LoadBalancer",
                "  externalTrafficPolicy: Local\n  healthCheckNodePort: 31999\n",
            ),
        )
        .expect("apply the LoadBalancer service");
    let outside = env.external.netns();
    let port = SocketAddr::new(NODE_LINK_IP.into(), 31999);
    let expect = |code: u16, local: u64| {
        wait_for(&format!("{code} with {local} local endpoints"), || {
            health(outside, port)
                .ok()
                .filter(|(c, body)| *c == code && body["localEndpoints"] == local)
        })
    };
    let (_, body) = expect(200, 1);
    assert_eq!(body["service"]["namespace"], "default");
    assert_eq!(body["service"]["name"], "lb");
    let (code, _) = health(outside, at(NODE6, 31999)).expect("over IPv6");
    assert_eq!(code, 200);
    // The only endpoint goes: 503, and the node port refuses.
    agent
        .del(&service_bed::container_id("web-0", "np"), &env.web.path())
        .expect("CNI DEL web-0");
    expect(503, 0);
    let nodeport = node_port(agent, "lb");
    let refused = outside
        .run(move || {
            TcpStream::connect_timeout(&SocketAddr::new(NODE_LINK_IP.into(), nodeport), TIMEOUT)
                .err()
                .map(|e| e.kind())
        })
        .expect("enter the namespace");
    assert_eq!(refused, Some(std::io::ErrorKind::ConnectionRefused));
}

#[test]
fn udp_through_a_node_port_comes_back_from_the_node_port_in_both_families() {
    let _serial = serial();
    let env = setup();
    let servers: Vec<cellium_integration::probe::UdpServer> = env
        .web_ips
        .iter()
        .map(|ip| {
            cellium_integration::probe::UdpServer::start(
                &env.web,
                SocketAddr::new(*ip, 5353),
                "web-0",
            )
            .expect("udp server")
        })
        .collect();
    env.agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: dns }\nspec:\n  type: NodePort\n  ipFamilyPolicy: PreferDualStack\n  selector: { app: web }\n  ports: [ { name: dns, port: 53, targetPort: 5353, protocol: UDP } ]\n",
        )
        .expect("apply the UDP service");
    let port = node_port(&env.agent, "dns");
    for node in [IpAddr::from(NODE_LINK_IP), NODE6.parse().unwrap()] {
        let to = SocketAddr::new(node, port);
        let reply = wait_for(&format!("a UDP answer from {to}"), || {
            cellium_integration::probe::udp_request(env.external.netns(), to, TIMEOUT).ok()
        });
        assert_eq!(reply.banner, "web-0");
        assert_eq!(reply.from, to, "the answer comes from the node port");
    }
    drop(servers);
}

/// New connections to `to` from `ns`, one after another until stopped, each a whole exchange
/// ([`probe::tcp_request`]): how many were made and every one that failed, with when.
struct Churn {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<(Instant, String)>)>,
}

impl Churn {
    fn start(ns: &NetNs, to: SocketAddr) -> Churn {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let ns = NetNs::existing(ns.name());
        let thread = std::thread::spawn(move || {
            let (mut made, mut failed) = (0, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                made += 1;
                if let Err(e) = probe::tcp_request(&ns, to, TIMEOUT) {
                    failed.push((Instant::now(), e.to_string()));
                }
            }
            (made, failed)
        });
        Churn { stop, thread }
    }

    fn finish(self) -> (usize, Vec<(Instant, String)>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the churn's thread")
    }
}

#[test]
fn agent_restarts_under_load_on_a_node_port_reset_no_connection() {
    let _serial = serial();
    let mut env = setup();
    let servers: Vec<probe::TcpServer> = env
        .web_ips
        .iter()
        .map(|ip| probe::TcpServer::start(&env.web, SocketAddr::new(*ip, 9090), "web-0"))
        .collect::<Result<_, _>>()
        .expect("echo servers");
    env.agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: load }\nspec:\n  type: NodePort\n  ipFamilyPolicy: PreferDualStack\n  selector: { app: web }\n  ports: [ { name: echo, port: 90, targetPort: 9090 } ]\n",
        )
        .expect("apply the service");
    let port = node_port(&env.agent, "load");
    let outside = env.external.netns();
    let targets = [SocketAddr::new(NODE_LINK_IP.into(), port), at(NODE6, port)];
    for to in targets {
        wait_for(&format!("{to} answering from outside"), || {
            probe::tcp_request(outside, to, TIMEOUT).ok()
        });
    }

    // Per family: two long connections kept busy and new connections back to back.
    let streams: Vec<(SocketAddr, probe::EchoStream)> = targets
        .iter()
        .flat_map(|to| [*to, *to])
        .map(|to| {
            let stream = probe::tcp_connect(outside, to, TIMEOUT).expect("a long connection");
            (to, probe::EchoStream::start(stream))
        })
        .collect();
    let churns: Vec<(SocketAddr, Churn)> = targets
        .iter()
        .map(|to| (*to, Churn::start(outside, *to)))
        .collect();

    let settle = Duration::from_millis(700);
    std::thread::sleep(settle);
    let stopped = Instant::now();
    env.agent.stop().expect("stop the agent");
    std::thread::sleep(settle);
    env.agent.start().expect("start the agent again");
    let restarted = Instant::now();
    node_port_frontends(&env.agent, "load");
    std::thread::sleep(settle);
    let killed = Instant::now();
    env.agent.kill().expect("kill the agent");
    std::thread::sleep(settle);
    env.agent.start().expect("start the agent after the kill");
    node_port_frontends(&env.agent, "load");
    std::thread::sleep(settle);
    let ended = Instant::now();

    for (to, churn) in churns {
        let (made, failed) = churn.finish();
        assert!(
            failed.is_empty(),
            "new connections to {to} failed: {failed:?}"
        );
        assert!(made > 20, "only {made} connections to {to}");
    }
    for (to, stream) in streams {
        let rounds = stream
            .stop()
            .unwrap_or_else(|e| panic!("a long connection to {to} broke: {e}"));
        // It went on through every phase: stopped, restarted, killed, after.
        for (from, until) in [(stopped, restarted), (restarted, killed), (killed, ended)] {
            let during = rounds.iter().filter(|t| **t >= from && **t < until).count();
            assert!(during > 0, "{to}: no round trip between two phases");
        }
    }
    drop(servers);
}

#[test]
fn fragmented_datagrams_through_a_node_port_arrive_and_their_answers_come_back() {
    let _serial = serial();
    let env = setup();
    let servers: Vec<probe::UdpServer> = env
        .web_ips
        .iter()
        .map(|ip| probe::UdpServer::start(&env.web, SocketAddr::new(*ip, 5353), "web-0"))
        .collect::<Result<_, _>>()
        .expect("udp servers");
    env.agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: dns }\nspec:\n  type: NodePort\n  ipFamilyPolicy: PreferDualStack\n  selector: { app: web }\n  ports: [ { name: dns, port: 53, targetPort: 5353, protocol: UDP } ]\n",
        )
        .expect("apply the UDP service");
    let port = node_port(&env.agent, "dns");
    let outside = env.external.netns();
    // The largest unfragmented payload on a 1500-byte link, the smallest fragmented one, and
    // one of six fragments; each answered with the same payload behind the banner.
    for (node, sizes) in [
        (IpAddr::from(NODE_LINK_IP), [1472, 1473, 8000]),
        (NODE6.parse().unwrap(), [1452, 1453, 8000]),
    ] {
        let to = SocketAddr::new(node, port);
        wait_for(&format!("{to} answering"), || {
            probe::udp_request(outside, to, TIMEOUT).ok()
        });
        for size in sizes {
            let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let reply = probe::udp_exchange(outside, to, &payload, TIMEOUT)
                .unwrap_or_else(|e| panic!("{size} bytes to {to}: {e}"));
            assert_eq!(reply.banner, "web-0");
            assert_eq!(reply.from, to, "the answer comes from the node port");
        }
    }
    drop(servers);
}

#[test]
fn an_ipv6_node_port_reached_from_outside_chooses_by_maglev_and_keeps_affinity() {
    let _serial = serial();
    let env = setup();
    let web6 = env.web_ips[1];
    let servers: Vec<probe::TcpServer> = [9080, 9081]
        .into_iter()
        .map(|port| {
            let at = SocketAddr::new(web6, port);
            probe::TcpServer::start(&env.web, at, &at.to_string())
        })
        .collect::<Result<_, _>>()
        .expect("servers");
    // Two backends (web-0's two ports), one slice each.
    let service = |name: &str, extra: &str| {
        let mut yaml = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, annotations: {{ service.cilium.io/lb-algorithm: maglev }} }}\nspec: {{ type: NodePort, ipFamilies: [ IPv6 ], {extra} ports: [ {{ name: http, port: 80 }} ] }}\n"
        );
        for port in [9080, 9081] {
            yaml.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: {name}-{port}, labels: {{ kubernetes.io/service-name: {name} }} }}\naddressType: IPv6\nendpoints: [ {{ addresses: [ \"{web6}\" ] }} ]\nports: [ {{ name: http, port: {port} }} ]\n"
            ));
        }
        yaml
    };
    let agent = &env.agent;
    agent
        .objects("apply", &service("mg", ""))
        .expect("apply mg");
    agent
        .objects(
            "apply",
            &service(
                "aff",
                "sessionAffinity: ClientIP, sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } },",
            ),
        )
        .expect("apply aff");
    let frontend_of = |name: &str| {
        let service = format!("default/{name}");
        wait_for(&format!("{service} on the link with 2 backends"), || {
            frontends(agent).into_iter().find(|f| {
                f["service"] == service.as_str()
                    && f["vip"] == NODE6
                    && f["backends"].as_array().map(Vec::len) == Some(2)
            })
        })
    };
    let (mg, aff) = (frontend_of("mg"), frontend_of("aff"));
    let port_of = |f: &Value| {
        f["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .expect("a port")
    };
    // The backend maglev's table gives a flow from the outside client's port `sport`.
    let predicted = |f: &Value, sport: u16| {
        let addresses: Vec<String> = f["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["address"].as_str().map(String::from))
            .collect();
        let m = cellium_svc_lb::maglev::DEFAULT_TABLE_SIZE;
        let table = cellium_svc_lb::maglev::table(&addresses, m);
        let hash = cellium_svc_lb::maglev::flow_hash(
            SocketAddr::new(EXT6.parse().unwrap(), sport),
            at(NODE6, port_of(f)),
            6,
        );
        let backend: SocketAddr = addresses[table[(hash % m) as usize]]
            .parse()
            .expect("a backend address");
        backend.to_string()
    };
    let outside = env.external.netns();
    let from = |sport: u16, f: &Value| {
        probe::banner_from(outside, sport, at(NODE6, port_of(f)), TIMEOUT)
            .unwrap_or_else(|e| panic!("port {sport}: {e}"))
    };
    wait_for("the node port answering from outside", || {
        probe::banner_from(outside, 42999, at(NODE6, port_of(&mg)), TIMEOUT).ok()
    });
    let mut used = std::collections::BTreeSet::new();
    for sport in 43000..43030 {
        let banner = from(sport, &mg);
        assert_eq!(banner, predicted(&mg, sport), "port {sport}");
        used.insert(banner);
    }
    assert_eq!(used.len(), 2, "30 flows took one backend: {used:?}");
    // Affinity: every new connection of the client takes its first one's backend.
    let chosen = from(43000, &aff);
    let mut overridden = 0;
    for sport in 43001..43021 {
        assert_eq!(from(sport, &aff), chosen, "port {sport}");
        overridden += usize::from(predicted(&aff, sport) != chosen);
    }
    assert!(
        overridden >= 3,
        "only {overridden} flows would have chosen another backend"
    );
    drop(servers);
}

/// The MAC address of `ifname` in `ns`.
fn mac_of(ns: &NetNs, ifname: &str) -> [u8; 6] {
    let text = ns
        .exec("cat", &[&format!("/sys/class/net/{ifname}/address")])
        .expect("address");
    let mut mac = [0u8; 6];
    for (b, part) in mac.iter_mut().zip(text.trim().split(':')) {
        *b = u8::from_str_radix(part, 16).expect("a MAC");
    }
    mac
}

/// The node's own addresses of each family the ipcache names `host` (the pods' gateway's).
fn host_addresses(agent: &Agent) -> (std::net::Ipv4Addr, std::net::Ipv6Addr) {
    let list = agent.cli(&["ipcache", "list"]).expect("ipcache list");
    let hosts: Vec<IpAddr> = list
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [prefix, "1", "host", ..] => prefix.split('/').next()?.parse().ok(),
            _ => None,
        })
        .collect();
    let v4 = hosts.iter().find_map(|ip| match ip {
        IpAddr::V4(ip) => Some(*ip),
        IpAddr::V6(_) => None,
    });
    let v6 = hosts.iter().find_map(|ip| match ip {
        IpAddr::V6(ip) => Some(*ip),
        IpAddr::V4(_) => None,
    });
    v4.zip(v6)
        .unwrap_or_else(|| panic!("a host address of each family:\n{list}"))
}

/// Nothing that arrives from the network is the node itself. A host outside sends, through
/// the node's device, UDP with the node's own address as its source, to a pod whose ingress
/// denies everything but the node (`allow-localhost`), straight and through a node port: taken
/// at its address it would pass as the node; it is the world, denied, counted and reported
/// with the world's identity, and reaches no pod. The node's own processes still reach the pod.
#[test]
fn a_packet_from_outside_with_the_nodes_own_address_is_the_world_not_the_host() {
    let _serial = serial();
    let env = setup();
    let _udp: Vec<probe::UdpServer> = env
        .web_ips
        .iter()
        .map(|ip| {
            probe::UdpServer::start(&env.web, SocketAddr::new(*ip, 5353), "web-0")
                .expect("udp server")
        })
        .collect();
    env.agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: dns }\nspec:\n  type: NodePort\n  ipFamilyPolicy: PreferDualStack\n  selector: { app: web }\n  ports: [ { name: dns, port: 53, targetPort: 5353, protocol: UDP } ]\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: web-no-ingress }\nspec: { podSelector: { matchLabels: { app: web } }, policyTypes: [ Ingress ] }\n",
        )
        .expect("apply the service and the policy");
    let port = node_port(&env.agent, "dns");
    let (IpAddr::V4(web4), IpAddr::V6(web6)) = (env.web_ips[0], env.web_ips[1]) else {
        panic!("IPv4 first: {:?}", env.web_ips);
    };
    let outside = env.external.netns();
    wait_for("the web pod's ingress denies the outside", || {
        probe::udp_request(outside, SocketAddr::new(web4.into(), 5353), TIMEOUT)
            .is_err()
            .then_some(())
    });
    // The node itself is the host: it reaches the pod (through its stack), in both families.
    for ip in &env.web_ips {
        let reply = probe::udp_request(env.agent.node(), SocketAddr::new(*ip, 5353), TIMEOUT)
            .unwrap_or_else(|e| panic!("the node reaches {ip}: {e}"));
        assert_eq!(reply.banner, "web-0");
    }

    // The link to the outside came after the agent: its device takes the program a moment
    // later (node discovery's next pass).
    wait_for("cel_from_netdev on the link", || {
        env.agent
            .node()
            .exec("tc", &["filter", "show", "dev", "celx0", "ingress"])
            .ok()
            .filter(|f| f.contains("cel_from_netdev"))
    });
    let macs = (mac_of(outside, "eth0"), mac_of(env.agent.node(), "celx0"));
    // The sources the packets claim: addresses of the node the ipcache gives host.
    let (host4, host6) = host_addresses(&env.agent);
    // Each case from a source port of its own, to tell its flow from the others'.
    let udp = |sport: u16, dport: u16| {
        let mut d = sport.to_be_bytes().to_vec();
        d.extend_from_slice(&dport.to_be_bytes());
        d.extend_from_slice(&[0, 15, 0, 0]);
        d.extend_from_slice(b"spoofed");
        d
    };
    let spoofed4 = |dst: std::net::Ipv4Addr, sport: u16, dport: u16| {
        frame::Ipv4Packet {
            src: host4,
            dst,
            protocol: 17,
            id: 9,
            offset: 0,
            more: false,
            payload: udp(sport, dport),
        }
        .frame(macs.0, macs.1)
    };
    let mut spoofed6 = frame::Ipv6Packet::udp(host6, web6);
    spoofed6.rest = udp(40003, 5353);
    let capture = frame::Capture::open(&env.web, "eth0").expect("capture in the pod");
    let reason = "policy default deny";
    for (what, node, dst, sport, frame) in [
        (
            "straight to the pod",
            IpAddr::from(host4),
            IpAddr::from(web4),
            40001,
            spoofed4(web4, 40001, 5353),
        ),
        (
            "through the node port",
            IpAddr::from(host4),
            IpAddr::from(web4),
            40002,
            spoofed4(NODE_LINK_IP, 40002, port),
        ),
        (
            "straight to the pod over IPv6",
            IpAddr::from(host6),
            IpAddr::from(web6),
            40003,
            spoofed6.frame(macs.0, macs.1),
        ),
    ] {
        let before = env
            .agent
            .datapath_packets("ingress", reason)
            .expect("metrics");
        wait_for(&format!("{what}: denied as the world"), || {
            frame::send(outside, "eth0", frame.clone()).expect("send");
            (env.agent
                .datapath_packets("ingress", reason)
                .expect("metrics")
                > before)
                .then_some(())
        });
        let flow = wait_for(&format!("{what}: the drop's flow"), || {
            env.agent.dropped_flows().into_iter().find(|f| {
                f["flow"]["IP"]["source"] == node.to_string().as_str()
                    && f["flow"]["IP"]["destination"] == dst.to_string().as_str()
                    && f["flow"]["l4"]["UDP"]["source_port"] == sport
            })
        });
        let identity = flow["flow"]["source"]["identity"].as_u64();
        assert!(
            matches!(identity, Some(2 | 9 | 10)),
            "{what}: the world's identity, not the host's: {flow}"
        );
        assert_eq!(flow["flow"]["drop_reason_desc"], "POLICY_DENIED", "{what}");
    }
    let spoofed_udp = |f: &[u8]| f.windows(7).any(|w| w == b"spoofed");
    assert!(
        capture.next(TIMEOUT, spoofed_udp).is_err(),
        "a packet with the node's address from outside reached the pod"
    );
}

/// web-0 publishing its port 8080 as host port 8081 on every node address, and as 9090 on
/// an address that is not the node's (the external namespace's), which must not be served.
const HOST_PORT_PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: { name: web-0, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 8080, hostPort: 8081 }, { containerPort: 8080, hostPort: 9090, hostIP: 10.98.0.2 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: client, labels: { app: client } }
spec: { containers: [ { name: c } ] }
"#;

#[test]
fn a_pods_host_port_is_served_on_the_nodes_addresses_from_outside_pods_and_the_node() {
    let _serial = serial();
    let cgroup = cellium_integration::TestCgroup::new().expect("a cgroup");
    let bed = ServiceBed::start_with(
        HOST_PORT_PODS,
        "hp",
        vec![
            ("CELLIUM_BPF_LB_SOCK".into(), "true".into()),
            (
                "CELLIUM_CGROUP_ROOT".into(),
                cgroup.path().display().to_string(),
            ),
        ],
    )
    .expect("the service bed");
    let _servers: Vec<PeerServer> = bed
        .web_ips
        .iter()
        .map(|ip| PeerServer::start(&bed.web, SocketAddr::new(*ip, 8080)).expect("server"))
        .collect();
    let fronts = wait_for("web-0's host port frontends on the link", || {
        let found: Vec<Value> = frontends(&bed.agent)
            .into_iter()
            .filter(|f| f["service"] == "default/web-0" && f["kind"] == "HostPort")
            .collect();
        let on = |ip: &str| found.iter().any(|f| f["vip"] == ip && f["port"] == 8081);
        (on(&NODE_LINK_IP.to_string()) && on(NODE6)).then_some(found)
    });
    let foreign = fronts
        .iter()
        .find(|f| f["port"] == 9090)
        .expect("the host port on a foreign address is listed");
    let error = foreign["error"].as_str().unwrap_or_default();
    assert!(error.contains("not an address of this node"), "{foreign}");

    // From outside, on both families: the client keeps its address. The link came after the
    // agent: its device takes the program a moment later.
    let outside = bed.external.netns();
    wait_for("the host port answering from outside", || {
        seen_from(outside, SocketAddr::new(NODE_LINK_IP.into(), 8081)).ok()
    });
    for (node, client) in [
        (IpAddr::from(NODE_LINK_IP), IpAddr::from(EXT_LINK_IP)),
        (NODE6.parse().unwrap(), EXT6.parse().unwrap()),
    ] {
        let seen = seen_from(outside, SocketAddr::new(node, 8081))
            .unwrap_or_else(|e| panic!("{node}:8081 from outside: {e}"));
        assert_eq!(seen, client);
    }
    // From a pod of the node.
    let seen = seen_from(&bed.client, SocketAddr::new(NODE_LINK_IP.into(), 8081))
        .expect("the host port from a pod");
    assert_eq!(seen, bed.client_ips[0]);
    // From the node's own processes (socket-level balancing).
    {
        let _inside = cgroup.enter().expect("enter the cgroup");
        seen_from(bed.agent.node(), SocketAddr::new(NODE_LINK_IP.into(), 8081))
            .expect("the host port from the node");
    }
    let status = bed
        .agent
        .cli(&["status", "--verbose"])
        .expect("cellium status");
    assert!(
        status.contains("KubeProxyReplacement: True") && status.contains("host ports served"),
        "{status}"
    );
    // The foreign address stays the other host's: the pod's connection is not taken to web-0.
    assert!(
        seen_from(&bed.client, SocketAddr::new(EXT_LINK_IP.into(), 9090)).is_err(),
        "a pod's hostIP captured another host's address"
    );
}

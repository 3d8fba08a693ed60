//! How ClusterIP frontends choose backends, end to end: `internalTrafficPolicy: Local`,
//! maglev (`bpf-lb-algorithm: maglev`) against the table the agent computes, on two agents
//! and across a backend's removal.
//!
//! Root, serially, after `cargo build --workspace --bins`:
//! `cargo test -p cellium-integration --test services_selection -- --test-threads=1`.
//!
//! Every test makes its own namespaces and agents, removed through guards, and sends traffic
//! only to addresses inside them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::Duration;

use cellium_integration::lab::service_bed::pods;
use cellium_integration::probe::{self, TcpServer};
use cellium_integration::wait::{container_id as cid, wait_for};
use cellium_integration::{Agent, AgentOptions, NetNs, serial};
use cellium_svc_lb::maglev;
use nix::sys::socket::{setsockopt, sockopt};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(2);

/// An agent with two web pods, each serving TCP on 8080 and 8081 (banners `web-0:8080`, ...),
/// and a client pod.
struct Env {
    // Field order is drop order: servers, then pods, then the agent and its node.
    _servers: Vec<TcpServer>,
    web: Vec<(NetNs, Ipv4Addr)>,
    client: NetNs,
    client_ip: Ipv4Addr,
    agent: Agent,
}

fn setup(env: &[(&str, &str)]) -> Env {
    let agent = Agent::start_new(AgentOptions {
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..AgentOptions::default()
    })
    .expect("start the agent");
    agent
        .objects("apply", &pods(2, false))
        .expect("apply the pods");
    let mut web = Vec::new();
    let mut servers = Vec::new();
    for name in ["web-0", "web-1"] {
        let ns = NetNs::new().expect("pod netns");
        let ip = agent
            .add_pod(&ns, &cid(name), "default", name)
            .expect("CNI ADD");
        for port in [8080, 8081] {
            let banner = format!("{name}:{port}");
            servers
                .push(TcpServer::start(&ns, SocketAddrV4::new(ip, port), &banner).expect("server"));
        }
        web.push((ns, ip));
    }
    let client = NetNs::new().expect("client netns");
    let client_ip = agent
        .add_pod(&client, &cid("client"), "default", "client")
        .expect("CNI ADD client");
    Env {
        _servers: servers,
        web,
        client,
        client_ip,
        agent,
    }
}

/// The frontend of service `default/<name>` once it has `backends` backends.
fn frontend_with(agent: &Agent, name: &str, backends: usize) -> Value {
    let service = format!("default/{name}");
    wait_for(&format!("{service} with {backends} backends"), || {
        agent
            .cli_json(&["service", "list"])
            .ok()?
            .as_array()?
            .iter()
            .find(|f| f["service"] == service.as_str())
            .filter(|f| f["backends"].as_array().map(Vec::len) == Some(backends))
            .cloned()
    })
}

fn backend_addresses(frontend: &Value) -> Vec<String> {
    frontend["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["address"].as_str().map(String::from))
        .collect()
}

/// One TCP connection from `client`'s port `sport` to `to`: the banner of the backend that
/// answered. Closed with a reset (linger 0): neither side keeps the tuple in TIME-WAIT, and the
/// datapath's entry for it is closing, so the next connection from the same tuple is a new
/// one and chooses its backend again.
fn request_from(client: &NetNs, sport: u16, to: impl Into<SocketAddr>) -> String {
    let to = to.into();
    probe::banner_from(client, sport, to, TIMEOUT)
        .unwrap_or_else(|e| panic!("banner from {to} (port {sport}): {e}"))
}

/// Makes closing `stream` send a reset (linger 0).
fn reset_on_close(stream: &TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    setsockopt(stream, sockopt::Linger, &linger).expect("linger");
}

#[test]
fn internal_traffic_policy_local_balances_only_over_this_nodes_endpoints() {
    let _serial = serial();
    let env = setup(&[("CELLIUM_NODE_NAME", "node-a")]);
    let (web0, web1) = (env.web[0].1, env.web[1].1);
    let yaml = |web1_node: &str| {
        format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{ name: local }}
spec: {{ clusterIP: 10.96.0.70, internalTrafficPolicy: Local, ports: [ {{ name: http, port: 80 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: local-1, labels: {{ kubernetes.io/service-name: local }} }}
addressType: IPv4
endpoints:
- {{ addresses: [ {web0} ], nodeName: node-b }}
- {{ addresses: [ {web1} ], nodeName: {web1_node} }}
ports: [ {{ name: http, port: 8080 }} ]
"#
        )
    };
    env.agent
        .objects("apply", &yaml("node-a"))
        .expect("apply the service");
    // web-0 is on another node: only web-1, this node's, serves.
    let fe = frontend_with(&env.agent, "local", 1);
    assert_eq!(backend_addresses(&fe), [format!("{web1}:8080")]);
    let to = SocketAddr::from(SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 70), 80));
    for _ in 0..20 {
        let reply = probe::tcp_request(&env.client, to, TIMEOUT).expect("request to the VIP");
        assert_eq!(reply.banner, "web-1:8080");
    }
    // Both elsewhere: no backend at all, and the connection is refused, not sent away.
    env.agent
        .objects("apply", &yaml("node-b"))
        .expect("move web-1");
    frontend_with(&env.agent, "local", 0);
    let err = env
        .client
        .run(move || {
            TcpStream::connect_timeout(&to, TIMEOUT)
                .err()
                .map(|e| e.kind())
        })
        .expect("run in the client");
    assert_eq!(err, Some(std::io::ErrorKind::ConnectionRefused));
}

/// A service of four backends (both web pods, ports 8080 and 8081, from two slices), or of
/// those without web-1:8081 when `without_one`.
fn four_backends(env: &Env, without_one: bool) -> String {
    let (web0, web1) = (env.web[0].1, env.web[1].1);
    let second = if without_one {
        format!("- {{ addresses: [ {web0} ] }}\n")
    } else {
        format!("- {{ addresses: [ {web0} ] }}\n- {{ addresses: [ {web1} ] }}\n")
    };
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: mg }}
spec: {{ clusterIP: 10.96.0.80, ports: [ {{ name: http, port: 80 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: mg-a, labels: {{ kubernetes.io/service-name: mg }} }}
addressType: IPv4
endpoints:
- {{ addresses: [ {web0} ] }}
- {{ addresses: [ {web1} ] }}
ports: [ {{ name: http, port: 8080 }} ]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: mg-b, labels: {{ kubernetes.io/service-name: mg }} }}
addressType: IPv4
endpoints:
{second}ports: [ {{ name: http, port: 8081 }} ]
"#
    )
}

const MAGLEV: [(&str, &str); 2] = [
    ("CELLIUM_BPF_LB_ALGORITHM", "maglev"),
    ("CELLIUM_BPF_LB_MAGLEV_TABLE_SIZE", "1021"),
];
const TABLE_SIZE: u32 = 1021;
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 80), 80);
/// The client ports of the flows compared.
const PORTS: std::ops::Range<u16> = 41000..41060;

/// The backend the agent's maglev table gives the flow from `client`:`sport` to the VIP, for
/// the backends `addresses` (`ip:port`).
fn predicted(addresses: &[String], client: Ipv4Addr, sport: u16) -> String {
    let table = maglev::table(addresses, TABLE_SIZE);
    let hash = maglev::flow_hash(SocketAddrV4::new(client, sport).into(), VIP.into(), 6);
    let addr = &addresses[table[(hash % TABLE_SIZE) as usize]];
    addr.clone()
}

/// Each flow's backend (as `ip:port`, from its banner) from the client's ports [`PORTS`].
fn flows(env: &Env) -> BTreeMap<u16, String> {
    let ip_of: BTreeMap<String, Ipv4Addr> = [("web-0", env.web[0].1), ("web-1", env.web[1].1)]
        .into_iter()
        .map(|(n, ip)| (n.to_string(), ip))
        .collect();
    PORTS
        .map(|sport| {
            let banner = request_from(&env.client, sport, VIP);
            let (name, port) = banner.split_once(':').expect("banner name:port");
            (sport, format!("{}:{port}", ip_of[name]))
        })
        .collect()
}

#[test]
fn maglev_gives_every_flow_its_tables_backend_on_every_agent_and_moves_few_on_a_removal() {
    let _serial = serial();
    let (first, client, addresses) = {
        let env = setup(&MAGLEV);
        env.agent
            .objects("apply", &four_backends(&env, false))
            .expect("apply the service");
        let fe = frontend_with(&env.agent, "mg", 4);
        let addresses = backend_addresses(&fe);
        let first = flows(&env);
        // Exactly the table's choice, for every flow (and again for the same tuples: new
        // connections, chosen again, alike).
        for (sport, backend) in &first {
            assert_eq!(
                *backend,
                predicted(&addresses, env.client_ip, *sport),
                "port {sport}"
            );
        }
        assert_eq!(flows(&env), first, "the same tuples chose differently");
        let used: std::collections::BTreeSet<&String> = first.values().collect();
        assert_eq!(
            used.len(),
            4,
            "60 flows did not reach all 4 backends: {first:?}"
        );
        (first, env.client_ip, addresses)
    };

    // Another agent, its pods and client at the same addresses: the same backends.
    let env = setup(&MAGLEV);
    assert_eq!(env.client_ip, client, "the second client's address differs");
    env.agent
        .objects("apply", &four_backends(&env, false))
        .expect("apply the service");
    assert_eq!(
        backend_addresses(&frontend_with(&env.agent, "mg", 4)),
        addresses
    );
    assert_eq!(flows(&env), first, "another agent chose other backends");

    // One backend removed: its flows go to the new table's choice; every other flow keeps
    // its backend unless the table moved its entry, which maglev keeps rare.
    let removed = format!("{}:8081", env.web[1].1);
    env.agent
        .objects("apply", &four_backends(&env, true))
        .expect("remove a backend");
    let rest: Vec<String> = addresses
        .iter()
        .filter(|a| **a != removed)
        .cloned()
        .collect();
    assert_eq!(backend_addresses(&frontend_with(&env.agent, "mg", 3)), rest);
    let after = flows(&env);
    let mut moved_others = 0;
    for (sport, backend) in &after {
        assert_eq!(*backend, predicted(&rest, client, *sport), "port {sport}");
        if first[sport] != removed && first[sport] != *backend {
            moved_others += 1;
        }
    }
    assert!(after.values().all(|b| *b != removed));
    eprintln!(
        "{} of {} flows were on the removed backend; {moved_others} others moved",
        first.values().filter(|b| **b == removed).count(),
        after.len()
    );
    assert!(
        moved_others * 20 <= after.len(),
        "{moved_others} of {} flows of kept backends moved",
        after.len()
    );
}

/// The affinity timeout of the test below, in seconds.
const AFFINITY: u64 = 3;

#[test]
fn session_affinity_keeps_a_clients_backend_within_the_timeout_and_lapses_after_it() {
    let _serial = serial();
    // Maglev makes each tuple's own choice known, so that affinity is seen overriding it.
    let env = setup(&MAGLEV);
    let extra = format!(
        "sessionAffinity: ClientIP, sessionAffinityConfig: {{ clientIP: {{ timeoutSeconds: {AFFINITY} }} }},"
    );
    let all: Vec<String> = ["8080", "8081"]
        .iter()
        .flat_map(|port| env.web.iter().map(move |(_, ip)| format!("{ip}:{port}")))
        .collect();
    env.agent
        .objects("apply", &service_of(&all, &extra))
        .expect("apply the service");
    let frontend = frontend_with(&env.agent, "mg", 4);
    // `cellium service list` says how it balances.
    assert_eq!(frontend["algorithm"], "maglev", "{frontend}");
    assert_eq!(frontend["affinity_timeout_seconds"], AFFINITY, "{frontend}");
    let addresses = backend_addresses(&frontend);
    let ip_of = |banner: &str| {
        let (name, port) = banner.split_once(':').expect("banner name:port");
        let ip = if name == "web-0" {
            env.web[0].1
        } else {
            env.web[1].1
        };
        format!("{ip}:{port}")
    };
    let own = |sport: u16| predicted(&addresses, env.client_ip, sport);
    let mut ports = PORTS;
    let first = ports.next().expect("a port");
    let chosen = ip_of(&request_from(&env.client, first, VIP));
    assert_eq!(chosen, own(first), "the first connection is maglev's");

    // Every new connection from the client, whatever its tuple would choose, takes the same
    // backend: each renews the affinity.
    let mut overridden = 0;
    for sport in ports.by_ref().take(40) {
        assert_eq!(
            ip_of(&request_from(&env.client, sport, VIP)),
            chosen,
            "port {sport}"
        );
        overridden += usize::from(own(sport) != chosen);
    }
    assert!(
        overridden >= 10,
        "only {overridden} tuples would have chosen another backend"
    );

    // Idle past the timeout: the next connection chooses on its own again, and the client's
    // affinity follows it.
    std::thread::sleep(Duration::from_secs(AFFINITY) + Duration::from_millis(1500));
    let lapse = ports
        .by_ref()
        .find(|p| own(*p) != chosen)
        .expect("a port whose tuple chooses another backend");
    let next = ip_of(&request_from(&env.client, lapse, VIP));
    assert_eq!(next, own(lapse), "the affinity did not lapse");
    let other = ports
        .find(|p| own(*p) != next)
        .expect("a port whose tuple chooses another backend");
    assert_eq!(ip_of(&request_from(&env.client, other, VIP)), next);

    // The remembered backend leaves the service, while another service keeps it (and its
    // backend id): the client's next connection chooses among those that remain, as its
    // tuple would.
    env.agent
        .objects("apply", &named_service_of("keep", "10.96.0.81", &all, ""))
        .expect("apply the other service");
    frontend_with(&env.agent, "keep", 4);
    let rest: Vec<String> = addresses.iter().filter(|a| **a != next).cloned().collect();
    env.agent
        .objects("apply", &service_of(&rest, &extra))
        .expect("remove the remembered backend");
    assert_eq!(backend_addresses(&frontend_with(&env.agent, "mg", 3)), rest);
    let sport = PORTS.end + 1;
    assert_eq!(
        ip_of(&request_from(&env.client, sport, VIP)),
        predicted(&rest, env.client_ip, sport)
    );
}

/// The service `mg` (10.96.0.80) whose backends are `backends` (`ip:port`, ports 8080 or
/// 8081), with `extra` fields in its spec: one slice per port.
fn service_of(backends: &[String], extra: &str) -> String {
    named_service_of("mg", "10.96.0.80", backends, extra)
}

/// [`service_of`] for the service `name` at `ip`.
fn named_service_of(name: &str, ip: &str, backends: &[String], extra: &str) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name} }}\nspec: {{ clusterIP: {ip}, {extra} ports: [ {{ name: http, port: 80 }} ] }}\n"
    );
    let ports: BTreeSet<&str> = backends
        .iter()
        .filter_map(|b| b.rsplit_once(':').map(|(_, p)| p))
        .collect();
    for port in ports {
        let endpoints: String = backends
            .iter()
            .filter_map(|b| b.strip_suffix(&format!(":{port}")))
            .map(|ip| format!("- {{ addresses: [ {ip} ] }}\n"))
            .collect();
        yaml.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: {name}-{port}, labels: {{ kubernetes.io/service-name: {name} }} }}\naddressType: IPv4\nendpoints:\n{endpoints}ports: [ {{ name: http, port: {port} }} ]\n"
        ));
    }
    yaml
}

/// The programmer on its own against real maps: a maglev table is the one `maglev::table`
/// computes, written only when its backends change, replaced when they do and removed when
/// the frontend stops being balanced by maglev; affinity pairs and the timeout follow the
/// plans.
#[test]
fn the_programmer_writes_tables_and_affinity_pairs_only_when_they_change() {
    use cellium_datapath_bpf::{Datapath, DatapathOptions};
    use cellium_integration::BpffsMount;
    use cellium_resources::{LbAlgorithm, Resources};
    use cellium_svc_lb::desired::{Inputs, plans};
    use cellium_svc_lb::{MaglevTableSize, Programmer};

    let _serial = serial();
    let bpf = BpffsMount::new().expect("bpffs");
    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..DatapathOptions::default()
    })
    .expect("open the datapath");
    let resources = Resources::new();
    let backends = |n: u8| -> Vec<String> { (1..=n).map(|i| format!("10.1.0.{i}:8080")).collect() };
    let apply = |backends: &[String], extra: &str| {
        let endpoints: String = backends
            .iter()
            .map(|b| format!("- {{ addresses: [ {} ] }}\n", b.trim_end_matches(":8080")))
            .collect();
        resources
            .apply(
                "svc.yaml",
                &format!(
                    "apiVersion: v1\nkind: Service\nmetadata: {{ name: mg }}\nspec: {{ clusterIP: 10.96.0.80, {extra} ports: [ {{ port: 80 }} ] }}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: mg-1, labels: {{ kubernetes.io/service-name: mg }} }}\naddressType: IPv4\nendpoints:\n{endpoints}ports: [ {{ port: 8080 }} ]\n"
                ),
            )
            .expect("apply");
    };
    let size = MaglevTableSize::try_from(251).expect("a size");
    let mut programmer = Programmer::with_maglev_table_size(size);
    let pass = |programmer: &mut Programmer, algorithm: LbAlgorithm| {
        let inputs = Inputs {
            lb_algorithm: algorithm,
            ..Inputs::read(&resources, &[], None)
        };
        let report = programmer.sync(&dp, plans(&inputs)).expect("pass");
        let status = programmer.status();
        (report, status[0].rev_nat_id, status[0].backend_ids.clone())
    };
    // The table as the datapath holds it, by backend address.
    let table_of = |rev: u16| -> Option<Vec<String>> {
        let lb = dp.services();
        dp.maglev().get(rev).expect("read the table").map(|t| {
            t.iter()
                .map(|id| {
                    let b = lb.backend(*id).expect("backend").expect("a backend");
                    format!("{}:{}", b.addr, b.port)
                })
                .collect()
        })
    };
    let expected = |names: &[String]| -> Vec<String> {
        maglev::table(names, 251)
            .into_iter()
            .map(|i| names[i].clone())
            .collect()
    };

    apply(&backends(5), "");
    let (report, rev, _) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(report.written, 1, "{report:?}");
    assert_eq!(table_of(rev), Some(expected(&backends(5))));
    let (report, _, _) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(
        report.written, 0,
        "an unchanged frontend's table was rewritten"
    );

    // One backend fewer: a new table, without it.
    apply(&backends(4), "");
    let (report, _, _) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(report.written, 1, "{report:?}");
    assert_eq!(table_of(rev), Some(expected(&backends(4))));

    // Session affinity: a pair per backend, the timeout in slot 0; gone with the affinity.
    apply(
        &backends(4),
        "sessionAffinity: ClientIP, sessionAffinityConfig: { clientIP: { timeoutSeconds: 30 } },",
    );
    let (report, _, ids) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(report.written, 1, "{report:?}");
    let pairs: std::collections::BTreeSet<(u16, u32)> = ids.iter().map(|id| (rev, *id)).collect();
    assert_eq!(dp.affinity_match().entries().expect("pairs"), pairs);
    let frontend = *dp
        .services()
        .services()
        .expect("services")
        .keys()
        .next()
        .expect("one");
    let timeout = |dp: &Datapath| {
        dp.services()
            .service(&frontend)
            .expect("read")
            .expect("the frontend")
            .affinity_timeout
    };
    assert_eq!(timeout(&dp), 30);
    let (report, _, _) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(report.written, 0, "{report:?}");
    apply(&backends(3), "sessionAffinity: ClientIP,");
    pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(timeout(&dp), 10800);
    assert_eq!(dp.affinity_match().entries().expect("pairs").len(), 3);
    apply(&backends(3), "");
    pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(timeout(&dp), 0);
    assert!(dp.affinity_match().entries().expect("pairs").is_empty());

    // A restarted agent (a new programmer adopting the maps) writes the table once, the same.
    let before = table_of(rev);
    let mut programmer = Programmer::with_maglev_table_size(size);
    programmer.adopt(&dp).expect("adopt");
    let (report, again, _) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!((again, report.written), (rev, 1), "{report:?}");
    assert_eq!(table_of(rev), before);
    let (report, _, _) = pass(&mut programmer, LbAlgorithm::Maglev);
    assert_eq!(report.written, 0, "{report:?}");

    // Random again: the table goes.
    let (report, _, _) = pass(&mut programmer, LbAlgorithm::Random);
    assert_eq!(report.written, 0, "{report:?}");
    assert_eq!(table_of(rev), None);
    assert!(dp.maglev().ids().expect("ids").is_empty());
}

/// Maglev and session affinity over IPv6: the datapath's `lb6_hash` is `maglev::flow_hash`'s,
/// and a client's IPv6 affinity holds.
#[test]
fn maglev_and_session_affinity_choose_alike_over_ipv6() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions {
        pod_cidrs: vec!["10.244.0.0/24".into(), "fd00:10:244::/112".into()],
        env: vec![(
            "CELLIUM_SERVICE_CIDR".into(),
            "10.96.0.0/16,fd00:10:96::/108".into(),
        )],
        ..AgentOptions::default()
    })
    .expect("start the agent");
    agent
        .objects("apply", &pods(2, false))
        .expect("apply the pods");
    let mut servers = Vec::new();
    let mut pods = Vec::new();
    let mut ips = Vec::new();
    for name in ["web-0", "web-1", "client"] {
        let ns = NetNs::new().expect("pod netns");
        let call = cellium_integration::CniCall::new("ADD", &cid(name))
            .netns(ns.path())
            .args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
        let (_, result) = agent.add_call(&call).expect("CNI ADD");
        let v6 = cellium_integration::cni::result_ipv6(&result).expect("an IPv6 address");
        if name != "client" {
            for port in [8080, 8081] {
                let banner = format!("{v6}:{port}");
                servers.push(
                    TcpServer::start(&ns, SocketAddr::new(v6.into(), port), &banner)
                        .expect("server"),
                );
            }
        }
        ips.push(v6);
        pods.push(ns);
    }
    let client = &pods[2];
    let endpoints = format!(
        "- {{ addresses: [ \"{}\" ] }}\n- {{ addresses: [ \"{}\" ] }}\n",
        ips[0], ips[1]
    );
    let service = |name: &str, ip: &str, extra: &str| {
        let mut yaml = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, annotations: {{ service.cilium.io/lb-algorithm: maglev }} }}\nspec: {{ ipFamilies: [ IPv6 ], clusterIP: \"{ip}\", {extra} ports: [ {{ name: http, port: 80 }} ] }}\n"
        );
        for port in [8080, 8081] {
            yaml.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: {name}-{port}, labels: {{ kubernetes.io/service-name: {name} }} }}\naddressType: IPv6\nendpoints:\n{endpoints}ports: [ {{ name: http, port: {port} }} ]\n"
            ));
        }
        yaml
    };
    agent
        .objects("apply", &service("mg6", "fd00:10:96::80", ""))
        .expect("apply mg6");
    agent
        .objects(
            "apply",
            &service(
                "aff6",
                "fd00:10:96::81",
                "sessionAffinity: ClientIP, sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } },",
            ),
        )
        .expect("apply aff6");
    let addresses = backend_addresses(&frontend_with(&agent, "mg6", 4));
    frontend_with(&agent, "aff6", 4);
    let own = |vip: &str, sport: u16| {
        let vip = SocketAddr::new(vip.parse().expect("an address"), 80);
        let table = maglev::table(&addresses, maglev::DEFAULT_TABLE_SIZE);
        let hash = maglev::flow_hash(SocketAddr::new(ips[2].into(), sport), vip, 6);
        // Backends are listed as [address]:port, banners as address:port.
        let addr: SocketAddr = addresses[table[(hash % maglev::DEFAULT_TABLE_SIZE) as usize]]
            .parse()
            .expect("a backend address");
        format!("{}:{}", addr.ip(), addr.port())
    };
    let to = |vip: &str| SocketAddr::new(vip.parse().expect("an address"), 80);
    let mut used = std::collections::BTreeSet::new();
    for sport in PORTS.take(30) {
        let banner = request_from(client, sport, to("fd00:10:96::80"));
        assert_eq!(banner, own("fd00:10:96::80", sport), "port {sport}");
        used.insert(banner);
    }
    assert!(used.len() > 1, "30 flows took one backend: {used:?}");
    let first = PORTS.start;
    let chosen = request_from(client, first, to("fd00:10:96::81"));
    assert_eq!(chosen, own("fd00:10:96::81", first));
    let mut overridden = 0;
    for sport in PORTS.skip(1).take(20) {
        assert_eq!(
            request_from(client, sport, to("fd00:10:96::81")),
            chosen,
            "port {sport}"
        );
        overridden += usize::from(own("fd00:10:96::81", sport) != chosen);
    }
    assert!(
        overridden >= 5,
        "only {overridden} tuples would have chosen another backend"
    );
    drop(servers);
}

/// A TCP connection from `client`'s port `sport` to `to`, kept open: its banner is read.
fn open_from(client: &NetNs, sport: u16, to: SocketAddr) -> (TcpStream, String) {
    let stream = connect_from(client, sport, to);
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let mut banner = Vec::new();
    let mut byte = [0u8; 1];
    while !banner.ends_with(b"\n") {
        let n = (&stream)
            .read(&mut byte)
            .unwrap_or_else(|e| panic!("banner from {to} (port {sport}): {e}"));
        assert!(n > 0, "{to} closed before its banner (port {sport})");
        banner.push(byte[0]);
    }
    (
        stream,
        String::from_utf8_lossy(&banner).trim_end().to_string(),
    )
}

/// A TCP connection from `client`'s port `sport` to `to`.
fn connect_from(client: &NetNs, sport: u16, to: SocketAddr) -> TcpStream {
    probe::tcp_connect_from(client, sport, to, TIMEOUT)
        .unwrap_or_else(|e| panic!("connect from port {sport} to {to}: {e}"))
}

/// Sends `text` on `stream` and reads its echo.
fn echo_on(stream: &mut TcpStream, text: &str) {
    use std::io::Write;
    stream.write_all(text.as_bytes()).expect("send");
    let mut back = vec![0u8; text.len()];
    stream.read_exact(&mut back).expect("echo");
    assert_eq!(String::from_utf8_lossy(&back), text);
}

#[test]
fn connections_that_become_the_same_tuple_are_kept_apart() {
    let _serial = serial();
    let env = setup(&[]);
    let web0 = env.web[0].1;
    let one = vec![format!("{web0}:8080")];
    env.agent
        .objects("apply", &named_service_of("a", "10.96.0.90", &one, ""))
        .and_then(|_| {
            env.agent
                .objects("apply", &named_service_of("b", "10.96.0.91", &one, ""))
        })
        .expect("apply the services");
    frontend_with(&env.agent, "a", 1);
    frontend_with(&env.agent, "b", 1);
    let vip = |last: u8| SocketAddr::from(SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, last), 80));

    // One client port to two services of the same backend: both connections live, apart.
    let (mut a, banner_a) = open_from(&env.client, 42000, vip(90));
    let (mut b, banner_b) = open_from(&env.client, 42000, vip(91));
    assert_eq!(
        (banner_a.as_str(), banner_b.as_str()),
        ("web-0:8080", "web-0:8080")
    );
    assert_eq!(a.peer_addr().ok(), Some(vip(90)));
    assert_eq!(b.peer_addr().ok(), Some(vip(91)));
    for round in 0..3 {
        echo_on(&mut a, &format!("to a {round}"));
        echo_on(&mut b, &format!("to b {round}"));
    }

    // The backend directly, then through its cluster IP, from one port.
    let direct = SocketAddr::from(SocketAddrV4::new(web0, 8080));
    let (mut d, banner_d) = open_from(&env.client, 42001, direct);
    let (mut v, banner_v) = open_from(&env.client, 42001, vip(90));
    assert_eq!(
        (banner_d.as_str(), banner_v.as_str()),
        ("web-0:8080", "web-0:8080")
    );
    assert_eq!(v.peer_addr().ok(), Some(vip(90)));
    for round in 0..3 {
        echo_on(&mut d, &format!("direct {round}"));
        echo_on(&mut v, &format!("via the service {round}"));
    }
    // The first connections still flow.
    echo_on(&mut a, "a again");
    echo_on(&mut b, "b again");

    // A closed connection's tuple is free again (as with netfilter): the next connection from
    // its port, through another service of the backend, keeps the port.
    let listener = env.web[0]
        .0
        .run(move || std::net::TcpListener::bind(SocketAddrV4::new(web0, 8090)))
        .expect("run in the pod")
        .expect("listen on 8090");
    let other = vec![format!("{web0}:8090")];
    env.agent
        .objects("apply", &named_service_of("c", "10.96.0.92", &other, ""))
        .and_then(|_| {
            env.agent
                .objects("apply", &named_service_of("d", "10.96.0.93", &other, ""))
        })
        .expect("apply the services");
    frontend_with(&env.agent, "c", 1);
    frontend_with(&env.agent, "d", 1);
    for last in [92, 93] {
        let stream = connect_from(&env.client, 42002, vip(last));
        let (accepted, peer) = listener.accept().expect("accept");
        assert_eq!(peer.port(), 42002, "through {}", vip(last));
        // Reset by both ends: the conntrack entry is closing, nothing waits in TIME_WAIT.
        reset_on_close(&stream);
        reset_on_close(&accepted);
        drop((stream, accepted));
        std::thread::sleep(Duration::from_millis(200));
    }
}

//! ClusterIP services end to end: the real agent in a node namespace, pods through the real
//! `cellium-cni`, objects through `cellium apply`, TCP through the datapath; and the svc-lb
//! programmer against real load-balancing maps.
//!
//! Root, serially, after `cargo build --workspace` (the agent tests run the built binaries):
//! `cargo test -p cellium-integration --test services -- --test-threads=1`.
//!
//! Every test makes its own namespaces (and agent, or bpffs) and removes them through guards,
//! and sends traffic only to addresses inside them: the pods' and the services' cluster IPs,
//! which exist only in the node namespace's datapath.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::Duration;

use cellium_datapath_bpf::abi::CtEntry;
use cellium_datapath_bpf::{CtTuple, Datapath, DatapathOptions, Protocol, ktime_now_ns};
use cellium_integration::frame;
use cellium_integration::lab::service_bed::pods;
use cellium_integration::probe::{self, TcpServer};
use cellium_integration::wait::{container_id as cid, wait_for};
use cellium_integration::{Agent, AgentOptions, BpffsMount, NetNs, TestCgroup, serial};
use cellium_resources::{ObjectKey, Resources};
use cellium_svc_lb::Programmer;
use cellium_svc_lb::desired::{Inputs, LocalEndpoint, plans};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(2);
const SHORT: Duration = Duration::from_millis(700);

/// A service selecting the web pods, their named port as the target.
const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: web }
spec:
  selector: { app: web }
  ports: [ { name: http, port: 80, targetPort: http } ]
"#;

/// An agent with two web pods serving TCP on 8080 and a client pod.
struct Env {
    // Field order is drop order: servers, then pods, then the agent and its node.
    servers: Vec<TcpServer>,
    web: Vec<(NetNs, Ipv4Addr, String)>,
    client: NetNs,
    agent: Agent,
}

fn setup() -> Env {
    let agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    agent
        .objects("apply", &pods(2, true))
        .expect("apply the pods");
    let mut web = Vec::new();
    let mut servers = Vec::new();
    for name in ["web-0", "web-1"] {
        let ns = NetNs::new().expect("pod netns");
        let ip = agent
            .add_pod(&ns, &cid(name), "default", name)
            .expect("CNI ADD");
        servers.push(TcpServer::start(&ns, SocketAddrV4::new(ip, 8080), name).expect("server"));
        web.push((ns, ip, name.to_string()));
    }
    let client = NetNs::new().expect("client netns");
    agent
        .add_pod(&client, &cid("client"), "default", "client")
        .expect("CNI ADD client");
    Env {
        servers,
        web,
        client,
        agent,
    }
}

/// `cellium service list -o json`.
fn frontends(agent: &Agent) -> cellium_integration::Result<Vec<Value>> {
    Ok(agent
        .cli_json(&["service", "list"])?
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// The frontend of service `default/<name>` once it has `backends` backends.
fn frontend_with(agent: &Agent, name: &str, backends: usize) -> Value {
    let service = format!("default/{name}");
    wait_for(&format!("{service} with {backends} backends"), || {
        frontends(agent)
            .ok()?
            .into_iter()
            .find(|f| f["service"] == service.as_str())
            .filter(|f| f["backends"].as_array().map(Vec::len) == Some(backends))
    })
}

fn vip(frontend: &Value) -> SocketAddr {
    let ip = frontend["vip"].as_str().and_then(|s| s.parse().ok());
    let port = frontend["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok());
    match (ip, port) {
        (Some(ip), Some(port)) => SocketAddr::new(ip, port),
        _ => panic!("no vip in {frontend}"),
    }
}

/// Connects to the VIP up to `max` times until every backend in `expect` answered; every
/// connection must see the VIP as its peer. Returns the backends that answered.
fn balance(env: &Env, to: SocketAddr, expect: &[&str], max: usize) -> BTreeSet<String> {
    balance_from(&env.client, to, expect, max)
}

/// [`balance`] from the client in `client`.
fn balance_from(client: &NetNs, to: SocketAddr, expect: &[&str], max: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..max {
        let reply = probe::tcp_request(client, to, TIMEOUT).expect("request to the VIP");
        assert_eq!(reply.peer, to, "the reply did not come from the VIP");
        seen.insert(reply.banner);
        if expect.iter().all(|e| seen.contains(*e)) {
            break;
        }
    }
    seen
}

#[test]
fn a_selector_service_balances_over_its_pods_and_follows_them() {
    let _serial = serial();
    let env = setup();
    env.agent.objects("apply", WEB).expect("apply the service");
    let fe = frontend_with(&env.agent, "web", 2);
    assert_eq!(fe["backends_from"], "selector");
    assert_eq!(fe["target_port"], "http");
    let to = vip(&fe);
    assert!(
        to.to_string().starts_with("10.96."),
        "{to} is not from 10.96.0.0/12"
    );
    let addrs: BTreeSet<String> = fe["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["address"].as_str().map(String::from))
        .collect();
    let expected: BTreeSet<String> = env
        .web
        .iter()
        .map(|(_, ip, _)| format!("{ip}:8080"))
        .collect();
    assert_eq!(addrs, expected);

    let seen = balance(&env, to, &["web-0", "web-1"], 60);
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["web-0", "web-1"]);

    // CNI DEL of web-1: it leaves the backends, and every connection reaches web-0.
    let (web1_ns, _, _) = &env.web[1];
    env.agent
        .del(&cid("web-1"), &web1_ns.path())
        .expect("CNI DEL web-1");
    frontend_with(&env.agent, "web", 1);
    let received = env.servers[1].received();
    for _ in 0..20 {
        let reply = probe::tcp_request(&env.client, to, TIMEOUT).expect("request after DEL");
        assert_eq!(reply.banner, "web-0");
    }
    assert_eq!(
        env.servers[1].received(),
        received,
        "a deleted pod still receives"
    );

    // The service deleted: its frontend goes, and connections to the VIP fail.
    env.agent
        .objects("delete", WEB)
        .expect("delete the service");
    wait_for("the frontend is gone", || {
        frontends(&env.agent).ok().filter(Vec::is_empty)
    });
    assert!(
        probe::tcp_connect(&env.client, to, SHORT).is_err(),
        "a connection to a deleted service's VIP succeeded"
    );
}

#[test]
fn an_endpoint_slice_gives_a_service_without_selector_its_backends() {
    let _serial = serial();
    let env = setup();
    let endpoints: String = env
        .web
        .iter()
        .map(|(_, ip, _)| format!("- {{ addresses: [ {ip} ] }}\n"))
        .collect();
    let client_ip = "10.244.0.250"; // never allocated: listed as not ready, so never chosen
    let yaml = format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: manual }}
spec: {{ clusterIP: 10.96.0.50, ports: [ {{ name: http, port: 8000 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: manual-1, labels: {{ kubernetes.io/service-name: manual }} }}
addressType: IPv4
endpoints:
{endpoints}- {{ addresses: [ {client_ip} ], conditions: {{ ready: false }} }}
ports: [ {{ name: http, port: 8080 }} ]
"#
    );
    env.agent
        .objects("apply", &yaml)
        .expect("apply service and slice");
    let fe = frontend_with(&env.agent, "manual", 2);
    assert_eq!(fe["backends_from"], "endpoint-slices");
    assert_eq!(
        fe["backends"][0]["source"],
        "EndpointSlice default/manual-1"
    );
    let to = vip(&fe);
    assert_eq!(
        to,
        SocketAddr::from(SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 50), 8000))
    );
    let seen = balance(&env, to, &["web-0", "web-1"], 60);
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["web-0", "web-1"]);

    // The table shows the same.
    let table = env.agent.cli(&["service", "list"]).expect("service list");
    assert!(
        table.contains("default/manual") && table.contains("10.96.0.50:8000/TCP"),
        "{table}"
    );
}

#[test]
fn a_frontend_that_cannot_be_programmed_is_reported_with_the_reason() {
    let _serial = serial();
    let env = setup();
    env.agent
        .objects("apply", WEB)
        .expect("apply the web service");
    frontend_with(&env.agent, "web", 2);
    // 66 slices of 1000 ready endpoints: more backends than a frontend has slots for. The
    // addresses only appear in the slices; nothing is sent to them.
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: big}\nspec: {ports: [{port: 80}]}\n",
    );
    for slice in 0..66u32 {
        yaml.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: big-{slice}, labels: {{kubernetes.io/service-name: big}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n"
        ));
        for i in slice * 1000..(slice + 1) * 1000 {
            let [_, a, b, c] = (0x0a64_0000 + i).to_be_bytes();
            yaml.push_str(&format!("- {{addresses: [10.{a}.{b}.{c}]}}\n"));
        }
    }
    env.agent
        .objects("apply", &yaml)
        .expect("apply the big service");
    let status = wait_for("svc-lb degraded", || {
        let text = env.agent.cli(&["status"]).ok()?;
        text.contains("Degraded").then_some(text)
    });
    assert!(
        status.contains("svc-lb Degraded: 1 of 2 frontends not programmed: frontend default/big (")
            && status.contains("66000 backends, more than the 65534 a frontend can hold"),
        "{status}"
    );
    let big = frontend_with(&env.agent, "big", 66000);
    assert!(
        big["error"]
            .as_str()
            .is_some_and(|e| e.contains("66000 backends")),
        "{big}"
    );
    assert_eq!(big["rev_nat_id"], 0);
    // The other service is served all along.
    let web = frontend_with(&env.agent, "web", 2);
    balance(&env, vip(&web), &["web-0", "web-1"], 60);

    env.agent
        .objects("delete", &yaml)
        .expect("delete the big service");
    wait_for("svc-lb OK again", || {
        let text = env.agent.cli(&["status"]).ok()?;
        (!text.contains("Degraded")).then_some(())
    });
}

/// Reads one line from the connection.
fn line(reader: &mut BufReader<TcpStream>) -> String {
    let mut text = String::new();
    reader.read_line(&mut text).expect("read a line");
    text.trim_end().to_string()
}

fn echo(stream: &mut TcpStream, reader: &mut BufReader<TcpStream>, text: &str) {
    stream
        .write_all(format!("{text}\n").as_bytes())
        .expect("send");
    assert_eq!(line(reader), text, "the echo did not come back");
}

#[test]
fn an_agent_restart_keeps_an_established_connection_to_a_service() {
    let _serial = serial();
    let mut env = setup();
    env.agent.objects("apply", WEB).expect("apply the service");
    let before = frontend_with(&env.agent, "web", 2);
    let to = vip(&before);

    let mut stream = probe::tcp_connect(&env.client, to, TIMEOUT).expect("connect to the VIP");
    assert_eq!(stream.peer_addr().ok(), Some(to));
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let backend = line(&mut reader);
    echo(&mut stream, &mut reader, "before");

    env.agent.stop().expect("stop the agent");
    // No agent: the pinned maps and attached programs go on serving.
    echo(&mut stream, &mut reader, "while stopped");
    env.agent.start().expect("start the agent again");
    echo(&mut stream, &mut reader, "after");

    // The restarted agent took over the ids the connection's entries carry.
    let after = frontend_with(&env.agent, "web", 2);
    assert_eq!(after["rev_nat_id"], before["rev_nat_id"]);
    assert_eq!(after["backends"], before["backends"]);
    assert_eq!(vip(&after), to);
    echo(&mut stream, &mut reader, "after the first pass");
    let seen = balance(&env, to, &["web-0", "web-1"], 60);
    assert!(seen.contains(&backend), "{seen:?}");
}

/// A service without selector whose slice lists the two web pods with the given conditions.
fn drain_slice(env: &Env, conditions: [&str; 2]) -> String {
    let endpoints: String = env
        .web
        .iter()
        .zip(conditions)
        .map(|((_, ip, _), c)| format!("- {{ addresses: [ {ip} ], conditions: {c} }}\n"))
        .collect();
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: drain }}
spec: {{ clusterIP: 10.96.0.60, ports: [ {{ name: http, port: 8000 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: drain-1, labels: {{ kubernetes.io/service-name: drain }} }}
addressType: IPv4
endpoints:
{endpoints}ports: [ {{ name: http, port: 8080 }} ]
"#
    )
}

#[test]
fn a_terminating_backend_keeps_its_connections_and_serves_new_ones_only_when_alone() {
    let _serial = serial();
    let env = setup();
    const READY: &str = "{ ready: true }";
    const TERMINATING: &str = "{ ready: false, serving: true, terminating: true }";
    const GONE: &str = "{ ready: false, serving: false, terminating: true }";
    env.agent
        .objects("apply", &drain_slice(&env, [READY, READY]))
        .expect("apply");
    let to = vip(&frontend_with(&env.agent, "drain", 2));
    let mut stream = probe::tcp_connect(&env.client, to, TIMEOUT).expect("connect to the VIP");
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let pinned = line(&mut reader);
    let index = env.web.iter().position(|(_, _, n)| *n == pinned).unwrap();
    let other = &env.web[1 - index].2;

    // Its backend turns terminating (a rolling update): the open connection goes on, new
    // ones go to the other backend only.
    let mut conditions = [READY, READY];
    conditions[index] = TERMINATING;
    env.agent
        .objects("apply", &drain_slice(&env, conditions))
        .expect("apply");
    let fe = frontend_with(&env.agent, "drain", 1);
    assert_eq!(fe["draining"].as_array().map(Vec::len), Some(1), "{fe:#}");
    echo(&mut stream, &mut reader, "still here");
    for _ in 0..20 {
        let reply = probe::tcp_request(&env.client, to, TIMEOUT).expect("request");
        assert_eq!(
            &reply.banner, other,
            "a new connection went to the draining backend"
        );
    }
    echo(
        &mut stream,
        &mut reader,
        "still here after others came and went",
    );

    // The other stops serving: the terminating one, still serving, takes new connections.
    conditions[1 - index] = GONE;
    env.agent
        .objects("apply", &drain_slice(&env, conditions))
        .expect("apply");
    wait_for("the terminating backend serves alone", || {
        let fe = frontends(&env.agent).ok()?;
        let fe = fe.iter().find(|f| f["service"] == "default/drain")?;
        (fe["backends"][0]["address"] == format!("{}:8080", env.web[index].1)).then_some(())
    });
    let reply = probe::tcp_request(&env.client, to, TIMEOUT).expect("request");
    assert_eq!(reply.banner, pinned);
    echo(&mut stream, &mut reader, "to the end");
}

/// The frontends of service `default/<name>` once it has `count` of them, each with `backends`
/// backends.
fn frontends_with(agent: &Agent, name: &str, count: usize, backends: usize) -> Vec<Value> {
    let service = format!("default/{name}");
    wait_for(
        &format!("{service}: {count} frontends of {backends} backends"),
        || {
            let found: Vec<Value> = frontends(agent)
                .ok()?
                .into_iter()
                .filter(|f| f["service"] == service.as_str())
                .collect();
            let complete = found.len() == count
                && found
                    .iter()
                    .all(|f| f["backends"].as_array().map(Vec::len) == Some(backends));
            complete.then_some(found)
        },
    )
}

#[test]
fn a_dual_stack_service_balances_each_family_over_its_backends_and_survives_a_restart() {
    let _serial = serial();
    let mut agent = dual_stack_agent(Vec::new());
    agent
        .objects("apply", &pods(2, true))
        .expect("apply the pods");
    let mut pods = Vec::new();
    let mut servers = Vec::new();
    for name in ["web-0", "web-1", "client"] {
        let ns = NetNs::new().expect("pod netns");
        let call = cellium_integration::CniCall::new("ADD", &cid(name))
            .netns(ns.path())
            .args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
        let (_, result) = agent.add_call(&call).expect("CNI ADD");
        let v6 = cellium_integration::cni::result_ipv6(&result).expect("an IPv6 address");
        if name != "client" {
            let v4 = cellium_integration::cni::result_ipv4(&result).expect("an IPv4 address");
            for ip in [IpAddr::from(v4), v6.into()] {
                servers
                    .push(TcpServer::start(&ns, SocketAddr::new(ip, 8080), name).expect("server"));
            }
        }
        pods.push(ns);
    }
    let client = &pods[2];
    agent
        .objects(
            "apply",
            &WEB.replace("spec:", "spec:\n  ipFamilyPolicy: PreferDualStack"),
        )
        .expect("apply the service");
    let before = frontends_with(&agent, "web", 2, 2);
    let vips: Vec<SocketAddr> = before.iter().map(vip).collect();
    assert!(
        vips[0].is_ipv4() && vips[1].is_ipv6(),
        "one frontend per family, the default family's first: {vips:?}"
    );
    for fe in &before {
        let family_of_vip = vip(fe).is_ipv4();
        for b in fe["backends"].as_array().into_iter().flatten() {
            let addr: SocketAddr = b["address"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .expect("a backend address");
            assert_eq!(addr.is_ipv4(), family_of_vip, "{fe}");
        }
    }
    for to in &vips {
        let seen = balance_from(client, *to, &["web-0", "web-1"], 60);
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["web-0", "web-1"],
            "{to}"
        );
    }

    // An IPv6 connection through the cluster IP across a restart.
    let mut stream = probe::tcp_connect(client, vips[1], TIMEOUT).expect("connect to the VIP");
    assert_eq!(stream.peer_addr().ok(), Some(vips[1]));
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let backend = line(&mut reader);
    echo(&mut stream, &mut reader, "before");
    agent.stop().expect("stop the agent");
    echo(&mut stream, &mut reader, "while stopped");
    agent.start().expect("start the agent again");
    echo(&mut stream, &mut reader, "after");
    let after = frontends_with(&agent, "web", 2, 2);
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(vip(a), vip(b), "the cluster IPs are kept");
        assert_eq!(a["rev_nat_id"], b["rev_nat_id"]);
        assert_eq!(a["backends"], b["backends"]);
    }
    echo(&mut stream, &mut reader, "after the first pass");
    let seen = balance_from(client, vips[1], &["web-0", "web-1"], 60);
    assert!(seen.contains(&backend), "{seen:?}");
    drop(servers);
}

/// The programmer on its own, against the real maps: adopting after a restart keeps every id;
/// stale entries go; a removed frontend's rev-NAT entry stays while a connection carries it.
#[test]
fn the_programmer_keeps_ids_across_restarts_and_rev_nat_entries_for_open_connections() {
    let _serial = serial();
    let bpf = BpffsMount::new().expect("bpffs");
    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..DatapathOptions::default()
    })
    .expect("open the datapath");
    let resources = Resources::new();
    resources
        .apply("pods.yaml", &pods(2, true))
        .and_then(|_| resources.apply("web.yaml", &WEB.replace("spec:", "spec:\n  clusterIP: 10.96.0.10")))
        .and_then(|_| {
            resources.apply(
                "manual.yaml",
                "apiVersion: v1\nkind: Service\nmetadata: {name: manual}\nspec: {clusterIP: 10.96.0.11, ports: [{port: 53, protocol: UDP}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: manual-1, labels: {kubernetes.io/service-name: manual}}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.1]}, {addresses: [10.1.0.2]}]\nports: [{port: 5353, protocol: UDP}]\n",
            )
        })
        .expect("apply");
    let endpoint = |id: u16, pod: &str, last: u8| LocalEndpoint {
        name: format!("endpoint {id} (default/{pod})"),
        pod: Some(ObjectKey::namespaced("default", pod)),
        addresses: vec![Ipv4Addr::new(10, 244, 0, last).into()],
        ready: true,
        port_mappings: Vec::new(),
    };
    let mut inputs = Inputs::read(&resources, &[], None);
    inputs.endpoints = vec![endpoint(1, "web-0", 10), endpoint(2, "web-1", 11)];

    let mut first = Programmer::default();
    let report = first.sync(&dp, plans(&inputs)).expect("first pass");
    assert_eq!((report.programmed, report.written), (2, 2), "{report:?}");
    let lb = dp.services();
    assert_eq!(lb.services().expect("services").len(), 2);
    assert_eq!(lb.backends().expect("backends").len(), 4);
    let again = first.sync(&dp, plans(&inputs)).expect("second pass");
    assert_eq!(again.written, 0, "an unchanged plan rewrote the maps");
    let status = first.status();

    // A new programmer (a restarted agent) adopts every id.
    let mut second = Programmer::default();
    assert_eq!(second.adopt(&dp).expect("adopt"), (2, 4, 0));
    let report = second
        .sync(&dp, plans(&inputs))
        .expect("pass after restart");
    assert_eq!(report.written, 0, "{report:?}");
    assert_eq!(second.status(), status);

    // web-1's endpoint goes: its backend is removed.
    inputs.endpoints.truncate(1);
    let report = second
        .sync(&dp, plans(&inputs))
        .expect("pass without web-1");
    assert_eq!(
        (report.written, report.removed_backends),
        (1, 1),
        "{report:?}"
    );

    // The manual service goes, while a connection through it is open.
    let manual = status
        .iter()
        .find(|s| s.plan.service.name == "manual")
        .expect("manual's status");
    let rev_nat = manual.rev_nat_id;
    let tuple = CtTuple {
        saddr: Ipv4Addr::new(10, 244, 0, 12).into(),
        daddr: Ipv4Addr::new(10, 1, 0, 1).into(),
        sport: 40000,
        dport: 5353,
        protocol: Protocol::Udp,
        service: false,
    };
    let now = ktime_now_ns().expect("clock");
    let entry = CtEntry {
        expires_ns: now + 60_000_000_000,
        created_ns: now,
        rev_nat_id: rev_nat,
        ..CtEntry::default()
    };
    dp.conntrack().put(&tuple, &entry).expect("conntrack entry");
    resources
        .delete(
            "manual.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: manual}\n",
        )
        .expect("delete manual");
    let report = second
        .sync(
            &dp,
            plans(&Inputs {
                endpoints: inputs.endpoints.clone(),
                ..Inputs::read(&resources, &[], None)
            }),
        )
        .expect("pass without manual");
    assert_eq!(
        (report.removed_frontends, report.removed_backends),
        (1, 2),
        "{report:?}"
    );
    assert_eq!(second.collect_rev_nats(&dp).expect("collect"), 0);
    assert!(
        lb.rev_nat(rev_nat).expect("lookup").is_some(),
        "removed while a connection carries it"
    );

    // A frontend created meanwhile does not get the id the connection carries.
    resources
        .apply("other.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: other}\nspec: {clusterIP: 10.96.0.12, ports: [{port: 80}]}\n")
        .expect("apply other");
    let report = second
        .sync(
            &dp,
            plans(&Inputs {
                endpoints: inputs.endpoints.clone(),
                ..Inputs::read(&resources, &[], None)
            }),
        )
        .expect("pass with other");
    assert_eq!(report.written, 1, "{report:?}");
    let other = second
        .status()
        .into_iter()
        .find(|s| s.plan.service.name == "other")
        .expect("other's status");
    assert_ne!(other.rev_nat_id, rev_nat);

    // The connection ends: the entry goes.
    dp.conntrack()
        .delete(&tuple)
        .expect("delete the conntrack entry");
    assert_eq!(second.collect_rev_nats(&dp).expect("collect"), 1);
    assert!(lb.rev_nat(rev_nat).expect("lookup").is_none());
    assert_eq!(second.lingering_rev_nats(), 0);
}

/// A dual-stack service with a TCP and a UDP port and nowhere to take backends from.
const EMPTY: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: empty }
spec:
  ipFamilyPolicy: PreferDualStack
  ports: [ { name: http, port: 80 }, { name: dns, port: 53, protocol: UDP } ]
"#;

/// An agent with pod CIDRs and service ranges of both families, and `env`.
fn dual_stack_agent(mut env: Vec<(String, String)>) -> Agent {
    env.push((
        "CELLIUM_SERVICE_CIDR".into(),
        "10.96.0.0/16,fd00:10:96::/108".into(),
    ));
    Agent::start_new(AgentOptions {
        pod_cidrs: vec!["10.244.0.0/24".into(), "fd00:10:244::/112".into()],
        env,
        ..AgentOptions::default()
    })
    .expect("start the agent")
}

/// A dual-stack agent with one client pod and the service [`EMPTY`]: the client, and the
/// service's frontends (IPv4 TCP, IPv4 UDP, IPv6 TCP, IPv6 UDP).
fn empty_service(env: Vec<(String, String)>) -> (Agent, NetNs, Vec<SocketAddr>) {
    let agent = dual_stack_agent(env);
    agent
        .objects("apply", &pods(2, true))
        .expect("apply the pods");
    let client = NetNs::new().expect("client netns");
    let call = cellium_integration::CniCall::new("ADD", &cid("client"))
        .netns(client.path())
        .args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=client");
    agent.add_call(&call).expect("CNI ADD client");
    agent.objects("apply", EMPTY).expect("apply the service");
    let mut vips: Vec<(SocketAddr, String)> = frontends_with(&agent, "empty", 4, 0)
        .iter()
        .map(|f| {
            (
                vip(f),
                f["protocol"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    vips.sort_by_key(|(a, p)| (a.is_ipv6(), p.clone()));
    let protocols: Vec<&str> = vips.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(protocols, ["TCP", "UDP", "TCP", "UDP"], "{vips:?}");
    (agent, client, vips.into_iter().map(|(a, _)| a).collect())
}

/// A TCP connect() from inside `ns`: how it failed, if it did.
fn connect_error(ns: &NetNs, to: SocketAddr, timeout: Duration) -> Option<std::io::ErrorKind> {
    ns.run(move || {
        TcpStream::connect_timeout(&to, timeout)
            .err()
            .map(|e| e.kind())
    })
    .expect("run in the client")
}

/// [`probe::udp_error`], failing the test if the namespace cannot be entered.
fn udp_error(ns: &NetNs, to: SocketAddr, timeout: Duration) -> Option<std::io::ErrorKind> {
    probe::udp_error(ns, to, timeout).expect("run in the client")
}

/// Checks a captured port unreachable for the packet the client sent to `vip` from `client`:
/// Ethernet type, both checksums (ICMPv6's over its pseudo-header), type and code, the service
/// address as its source, and the quote of the client's own packet (addresses and ports).
fn check_unreachable(frame: &[u8], client: IpAddr, vip: SocketAddr) {
    let quoted_ports = |l4: &[u8]| u16::from_be_bytes([l4[2], l4[3]]);
    match (client, vip.ip()) {
        (IpAddr::V4(client), IpAddr::V4(service)) => {
            assert_eq!(frame.len(), 14 + 20 + 8 + 28, "{frame:?}");
            assert_eq!(&frame[12..14], &[0x08, 0x00]);
            let ip = &frame[14..34];
            assert_eq!(frame::internet_checksum(ip), 0, "IPv4 header checksum");
            assert_eq!(&ip[12..16], &service.octets(), "from the service address");
            assert_eq!(&ip[16..20], &client.octets());
            let icmp = &frame[34..];
            assert_eq!((icmp[0], icmp[1]), (3, 3), "port unreachable");
            assert_eq!(frame::internet_checksum(icmp), 0, "ICMP checksum");
            let quote = &icmp[8..];
            assert_eq!(&quote[12..16], &client.octets());
            assert_eq!(&quote[16..20], &service.octets(), "the untranslated packet");
            assert_eq!(quoted_ports(&quote[20..]), vip.port());
        }
        (IpAddr::V6(client), IpAddr::V6(service)) => {
            assert_eq!(frame.len(), 14 + 40 + 8 + 48, "{frame:?}");
            assert_eq!(&frame[12..14], &[0x86, 0xdd]);
            let ip = &frame[14..54];
            assert_eq!(&ip[8..24], &service.octets(), "from the service address");
            assert_eq!(&ip[24..40], &client.octets());
            let icmp = &frame[54..];
            assert_eq!((icmp[0], icmp[1]), (1, 4), "port unreachable");
            let mut pseudo = ip[8..40].to_vec();
            pseudo.extend((icmp.len() as u32).to_be_bytes());
            pseudo.extend([0, 0, 0, 58]);
            pseudo.extend(icmp);
            assert_eq!(frame::internet_checksum(&pseudo), 0, "ICMPv6 checksum");
            let quote = &icmp[8..];
            assert_eq!(&quote[8..24], &client.octets());
            assert_eq!(&quote[24..40], &service.octets(), "the untranslated packet");
            assert_eq!(quoted_ports(&quote[40..]), vip.port());
        }
        _ => panic!("{client} and {vip} are of two families"),
    }
}

/// Whether a frame is an ICMP or ICMPv6 destination unreachable (no extension headers).
fn is_unreachable(frame: &[u8]) -> bool {
    match frame.get(12..14) {
        Some([0x08, 0x00]) => frame.get(23) == Some(&1) && frame.get(34) == Some(&3),
        Some([0x86, 0xdd]) => frame.get(20) == Some(&58) && frame.get(54) == Some(&1),
        _ => false,
    }
}

/// The client pod's address of `vip`'s family.
fn client_address(client: &NetNs, vip: SocketAddr) -> IpAddr {
    let out = client
        .ip(&["-o", "addr", "show", "dev", "eth0", "scope", "global"])
        .expect("ip addr");
    out.split_whitespace()
        .filter_map(|w| w.split('/').next()?.parse::<IpAddr>().ok())
        .find(|a| a.is_ipv4() == vip.is_ipv4())
        .unwrap_or_else(|| panic!("no address of {vip}'s family in {out}"))
}

#[test]
fn a_service_without_backends_refuses_tcp_and_udp_at_once_in_both_families() {
    let _serial = serial();
    let (agent, client, vips) = empty_service(Vec::new());
    // A timeout long enough that a silent drop would show as one, not as a refusal.
    let timeout = Duration::from_secs(3);
    for &to in &vips {
        let capture = frame::Capture::open(&client, "eth0").expect("capture on eth0");
        let error = if to == vips[0] || to == vips[2] {
            connect_error(&client, to, timeout)
        } else {
            udp_error(&client, to, timeout)
        };
        assert_eq!(
            error,
            Some(std::io::ErrorKind::ConnectionRefused),
            "to {to}"
        );
        let reply = capture
            .next(timeout, is_unreachable)
            .expect("the port unreachable, as the client received it");
        check_unreachable(&reply, client_address(&client, to), to);
    }
    // Each refusal is reported as the drop it is.
    assert!(
        agent
            .datapath_packets("egress", "no service backend")
            .expect("metrics")
            >= 4
    );
    let flows = wait_for("the refusals' flows", || {
        let out = agent
            .cli(&["observe", "--all", "--verdict", "DROPPED", "-o", "json"])
            .ok()?;
        let refused = out
            .lines()
            .filter(|l| l.contains("SERVICE_BACKEND_NOT_FOUND"))
            .count();
        (refused >= 4).then_some(refused)
    });
    assert!(flows >= 4);
}

#[test]
fn with_service_no_backend_response_drop_a_service_without_backends_stays_silent() {
    let _serial = serial();
    let (agent, client, vips) = empty_service(vec![(
        "CELLIUM_SERVICE_NO_BACKEND_RESPONSE".into(),
        "drop".into(),
    )]);
    let timeout = Duration::from_secs(2);
    for (to, error) in [
        (vips[0], connect_error(&client, vips[0], timeout)),
        (vips[2], connect_error(&client, vips[2], timeout)),
    ] {
        assert_eq!(error, Some(std::io::ErrorKind::TimedOut), "to {to}");
    }
    for to in [vips[1], vips[3]] {
        let error = udp_error(&client, to, timeout);
        assert!(
            matches!(
                error,
                Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
            ),
            "to {to}: {error:?}"
        );
    }
    assert!(
        agent
            .datapath_packets("egress", "no service backend")
            .expect("metrics")
            >= 4
    );
}

#[test]
fn a_pod_balanced_to_itself_through_its_service_exchanges_data() {
    let _serial = serial();
    let agent = dual_stack_agent(Vec::new());
    agent
        .objects("apply", &pods(2, true))
        .expect("apply the pods");
    let pod = NetNs::new().expect("pod netns");
    let call = cellium_integration::CniCall::new("ADD", &cid("web-0"))
        .netns(pod.path())
        .args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0");
    let (v4, result) = agent.add_call(&call).expect("CNI ADD");
    let v6 = cellium_integration::cni::result_ipv6(&result).expect("an IPv6 address");
    let mut servers = Vec::new();
    let mut udp = Vec::new();
    for ip in [IpAddr::from(v4), v6.into()] {
        servers.push(TcpServer::start(&pod, SocketAddr::new(ip, 8080), "web-0").expect("server"));
        udp.push(
            probe::UdpServer::start(&pod, SocketAddr::new(ip, 5353), "web-0").expect("server"),
        );
    }
    agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: self }\nspec:\n  ipFamilyPolicy: PreferDualStack\n  selector: { app: web }\n  ports: [ { name: http, port: 80, targetPort: http }, { name: dns, port: 53, protocol: UDP, targetPort: 5353 } ]\n",
        )
        .expect("apply the service");
    // Its own pod is the only backend: every connection comes back to it, in both families.
    let frontends = frontends_with(&agent, "self", 4, 1);
    for fe in &frontends {
        let to = vip(fe);
        if fe["protocol"] == "TCP" {
            for _ in 0..3 {
                let reply = probe::tcp_request(&pod, to, TIMEOUT).expect("hairpin TCP");
                assert_eq!(reply.banner, "web-0");
                assert_eq!(reply.peer, to, "the reply did not come from the VIP");
            }
        } else {
            let reply = probe::udp_request(&pod, to, TIMEOUT).expect("hairpin UDP");
            assert_eq!(reply.banner, "web-0");
            assert_eq!(reply.from, to, "the reply did not come from the VIP");
        }
    }
    drop((servers, udp));
}

/// A dual-stack agent with `bpf-lb-sock` on `cgroup`, a pod `web-0` serving TCP on 8080 and
/// UDP on 5353 in both families, and a service selecting it (HTTP 80 and DNS 53/UDP): the
/// agent, the pod's servers, and the four frontends.
fn sock_lb_agent(cgroup: &TestCgroup) -> (Agent, NetNs, Vec<Box<dyn std::any::Any>>, Vec<Value>) {
    let agent = dual_stack_agent(vec![
        ("CELLIUM_BPF_LB_SOCK".into(), "true".into()),
        (
            "CELLIUM_CGROUP_ROOT".into(),
            cgroup.path().display().to_string(),
        ),
    ]);
    agent
        .objects("apply", &pods(2, true))
        .expect("apply the pods");
    let pod = NetNs::new().expect("pod netns");
    let call = cellium_integration::CniCall::new("ADD", &cid("web-0"))
        .netns(pod.path())
        .args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0");
    let (v4, result) = agent.add_call(&call).expect("CNI ADD");
    let v6 = cellium_integration::cni::result_ipv6(&result).expect("an IPv6 address");
    let mut servers: Vec<Box<dyn std::any::Any>> = Vec::new();
    for ip in [IpAddr::from(v4), v6.into()] {
        let tcp = TcpServer::start(&pod, SocketAddr::new(ip, 8080), "web-0").expect("server");
        let udp =
            probe::UdpServer::start(&pod, SocketAddr::new(ip, 5353), "web-0").expect("server");
        servers.push(Box::new(tcp));
        servers.push(Box::new(udp));
    }
    agent
        .objects(
            "apply",
            "apiVersion: v1\nkind: Service\nmetadata: { name: web }\nspec:\n  ipFamilyPolicy: PreferDualStack\n  selector: { app: web }\n  ports: [ { name: http, port: 80, targetPort: http }, { name: dns, port: 53, protocol: UDP, targetPort: 5353 } ]\n",
        )
        .expect("apply the service");
    let frontends = frontends_with(&agent, "web", 4, 1);
    (agent, pod, servers, frontends)
}

/// From the node's namespace, with sockets made inside `cgroup` (or not): every frontend
/// answered by web-0, the socket seeing the service address as its peer; or why not.
fn from_the_node(
    agent: &Agent,
    cgroup: Option<&TestCgroup>,
    frontends: &[Value],
) -> Result<(), String> {
    let _inside = cgroup.map(|c| c.enter().expect("enter the cgroup"));
    for fe in frontends {
        let to = vip(fe);
        let (banner, peer) = if fe["protocol"] == "TCP" {
            let r = probe::tcp_request(agent.node(), to, TIMEOUT)
                .map_err(|e| format!("{to}/TCP: {e}"))?;
            (r.banner, r.peer)
        } else {
            let r = probe::udp_request(agent.node(), to, TIMEOUT)
                .map_err(|e| format!("{to}/UDP: {e}"))?;
            (r.banner, r.from)
        };
        if banner != "web-0" || peer != to {
            return Err(format!("{to}: answered by {banner:?} from {peer}"));
        }
    }
    Ok(())
}

/// The names under the agent's `<bpf-root>/links`.
fn pinned_links(agent: &Agent) -> Vec<String> {
    std::fs::read_dir(agent.bpf_root().join("links"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_nodes_own_sockets_are_balanced_at_connect_and_sendmsg_in_both_families() {
    let _serial = serial();
    let cgroup = TestCgroup::new().expect("a cgroup");
    let (mut agent, _pod, servers, frontends) = sock_lb_agent(&cgroup);

    // In the cgroup and the node's namespace: translated where the socket names its peer,
    // and the socket is given the service address back (getpeername, recvmsg).
    from_the_node(&agent, Some(&cgroup), &frontends).expect("balanced from the node");
    // The same process outside the cgroup: nothing translates its sockets; the service
    // addresses lead nowhere from the node.
    for fe in &frontends {
        assert!(
            from_the_node(&agent, None, std::slice::from_ref(fe)).is_err(),
            "{} answered outside the cgroup",
            vip(fe)
        );
    }
    let links = pinned_links(&agent);
    assert_eq!(
        links.iter().filter(|l| l.starts_with("cgroup-")).count(),
        8,
        "{links:?}"
    );

    // A restart keeps the pinned links (moved to the new programs).
    agent.stop().expect("stop");
    from_the_node(&agent, Some(&cgroup), &frontends).expect("balanced while stopped");
    agent.start().expect("start again");
    from_the_node(&agent, Some(&cgroup), &frontends).expect("balanced after a restart");

    // Turned off, a restart removes them.
    agent.stop().expect("stop");
    agent
        .options_mut()
        .env
        .retain(|(k, _)| k != "CELLIUM_BPF_LB_SOCK");
    agent.start().expect("start without bpf-lb-sock");
    let links = pinned_links(&agent);
    assert!(!links.iter().any(|l| l.starts_with("cgroup-")), "{links:?}");
    assert!(from_the_node(&agent, Some(&cgroup), &frontends[..1]).is_err());
    drop(servers);
}

/// Who answers `count` new TCP connections to `to` made from the node inside `cgroup`.
fn answers_from_the_node(
    agent: &Agent,
    cgroup: &TestCgroup,
    to: SocketAddr,
    count: usize,
) -> BTreeSet<String> {
    let _inside = cgroup.enter().expect("enter the cgroup");
    (0..count)
        .map(|_| {
            let reply = probe::tcp_request(agent.node(), to, TIMEOUT)
                .unwrap_or_else(|e| panic!("{to} from the node: {e}"));
            assert_eq!(reply.peer, to, "the socket sees the service address");
            reply.banner
        })
        .collect()
}

#[test]
fn the_nodes_own_sockets_keep_their_backend_with_session_affinity() {
    let _serial = serial();
    let cgroup = TestCgroup::new().expect("a cgroup");
    let agent = dual_stack_agent(vec![
        ("CELLIUM_BPF_LB_SOCK".into(), "true".into()),
        (
            "CELLIUM_CGROUP_ROOT".into(),
            cgroup.path().display().to_string(),
        ),
    ]);
    agent
        .objects("apply", &pods(2, true))
        .expect("apply the pods");
    let mut servers = Vec::new();
    let mut pods = Vec::new();
    for name in ["web-0", "web-1"] {
        let pod = NetNs::new().expect("pod netns");
        let call = cellium_integration::CniCall::new("ADD", &cid(name))
            .netns(pod.path())
            .args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
        let (v4, result) = agent.add_call(&call).expect("CNI ADD");
        let v6 = cellium_integration::cni::result_ipv6(&result).expect("an IPv6 address");
        for ip in [IpAddr::from(v4), v6.into()] {
            servers.push(TcpServer::start(&pod, SocketAddr::new(ip, 8080), name).expect("server"));
        }
        pods.push(pod);
    }
    let service = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name} }}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  selector: {{ app: web }}\n  ports: [ {{ name: http, port: 80, targetPort: http }} ]\n{extra}"
        )
    };
    agent
        .objects("apply", &service("sticky", "  sessionAffinity: ClientIP\n"))
        .expect("apply the service with affinity");
    agent
        .objects("apply", &service("plain", ""))
        .expect("apply the service without");
    for fe in frontends_with(&agent, "sticky", 2, 2) {
        let seen = answers_from_the_node(&agent, &cgroup, vip(&fe), 30);
        assert_eq!(
            seen.len(),
            1,
            "{}: the node's sockets took {seen:?}",
            vip(&fe)
        );
    }
    // Without affinity each socket draws: both backends within 30 (all on one: 2^-29).
    for fe in frontends_with(&agent, "plain", 2, 2) {
        let seen = answers_from_the_node(&agent, &cgroup, vip(&fe), 30);
        assert_eq!(
            seen.len(),
            2,
            "{}: the node's sockets took {seen:?}",
            vip(&fe)
        );
    }
    drop(servers);
}

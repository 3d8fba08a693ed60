//! Two nodes in Kubernetes mode: two real agents in two node namespaces joined by an underlay
//! the test makes (a veth pair, 192.0.2.1 and 192.0.2.2), one test API server served on both
//! nodes' loopback, pods through the real `cellium-cni` on each, `routing-mode: native`.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test cluster -- --test-threads=1`.
//!
//! Every test makes its own namespaces, agents and API server and removes them through guards;
//! traffic goes only to addresses inside the namespaces it made.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use cellium_integration::probe::TcpServer;
use cellium_integration::reach::{Outcome, Probe, probe};
use cellium_integration::{Agent, AgentOptions, K8sApi, NetNs};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const PORT: u16 = 8080;
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);
const CONVERGE: Duration = Duration::from_secs(20);

/// The nodes as the API server knows them: addresses on the underlay, a pod CIDR each.
const NODES: &str = r#"
apiVersion: v1
kind: Node
metadata: { name: n1 }
spec: { podCIDRs: [ 10.245.11.0/24 ] }
status: { addresses: [ { type: InternalIP, address: 192.0.2.1 } ] }
---
apiVersion: v1
kind: Node
metadata: { name: n2 }
spec: { podCIDRs: [ 10.245.12.0/24 ] }
status: { addresses: [ { type: InternalIP, address: 192.0.2.2 } ] }
"#;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop }
---
apiVersion: v1
kind: Pod
metadata: { name: client, namespace: shop, labels: { app: client } }
spec: { nodeName: n1, containers: [ { name: c, image: x } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: other, namespace: shop, labels: { app: other } }
spec: { nodeName: n1, containers: [ { name: c, image: x } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { nodeName: n2, containers: [ { name: c, image: x, ports: [ { name: http, containerPort: 8080 } ] } ] }
"#;

/// Only `app: client` pods, wherever they run, may reach web.
const WEB_FROM_CLIENT: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-client, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ], ports: [ { port: http } ] } ]
"#;

/// The underlay: a veth pair between the two node namespaces.
fn underlay(one: &NetNs, two: &NetNs) {
    one.ip(&[
        "link",
        "add",
        "und1",
        "type",
        "veth",
        "peer",
        "name",
        "und2",
        "netns",
        two.name(),
    ])
    .expect("underlay veth");
    one.ip(&["addr", "add", "192.0.2.1/24", "dev", "und1"])
        .expect("addr");
    two.ip(&["addr", "add", "192.0.2.2/24", "dev", "und2"])
        .expect("addr");
    one.ip(&["link", "set", "und1", "up"]).expect("up");
    two.ip(&["link", "set", "und2", "up"]).expect("up");
}

fn reaches(from: &NetNs, ip: Ipv4Addr) -> bool {
    matches!(
        probe(from, None, ip, Probe::Tcp(PORT), PROBE_TIMEOUT),
        Ok(Outcome::Answered)
    )
}

fn eventually(what: &str, agents: &[&Agent], mut ok: impl FnMut() -> bool) {
    let began = Instant::now();
    while !ok() {
        if began.elapsed() > CONVERGE {
            let logs: Vec<String> = agents.iter().map(|a| a.log()).collect();
            panic!(
                "{what}: not so after {CONVERGE:?}\n{}",
                logs.join("\n----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn pods_reach_pods_of_another_node_and_policy_selects_them_by_identity() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let no_cidr = || AgentOptions {
        pod_cidrs: Vec::new(),
        ..AgentOptions::default()
    };
    let mut one = Agent::prepare(no_cidr()).expect("node 1");
    let mut two = Agent::prepare(no_cidr()).expect("node 2");
    underlay(one.node(), two.node());
    let api = K8sApi::start(one.node()).expect("API server");
    api.serve_on(two.node()).expect("served on node 2");
    api.api().apply_yaml(NODES).expect("nodes");
    api.apply(PODS).expect("pods");
    one.options_mut().env = api.agent_env("n1");
    two.options_mut().env = api.agent_env("n2");
    one.start().expect("agent 1");
    two.start().expect("agent 2");

    let (client_ns, other_ns, web_ns) = (
        NetNs::new().expect("netns"),
        NetNs::new().expect("netns"),
        NetNs::new().expect("netns"),
    );
    let client = one
        .add_pod(&client_ns, "cid-client", "shop", "client")
        .expect("ADD client");
    let _other = one
        .add_pod(&other_ns, "cid-other", "shop", "other")
        .expect("ADD other");
    let web = two
        .add_pod(&web_ns, "cid-web", "shop", "web")
        .expect("ADD web");
    assert_eq!(client.octets()[..3], [10, 245, 11]);
    assert_eq!(web.octets()[..3], [10, 245, 12]);
    let _server =
        TcpServer::start(&web_ns, SocketAddr::new(IpAddr::V4(web), PORT), "web").expect("server");

    // Each node routes to the other's pod CIDR over the underlay.
    eventually("node 1 routes to node 2's pods", &[&one, &two], || {
        one.node()
            .ip(&["route", "show", "proto", "206"])
            .is_ok_and(|r| r.contains("10.245.12.0/24 via 192.0.2.2"))
    });
    eventually(
        "client reaches web on the other node",
        &[&one, &two],
        || reaches(&client_ns, web),
    );
    assert!(reaches(&other_ns, web), "no policy yet");

    // Each node knows the other's pods by identity.
    eventually(
        "node 2 has node 1's pods in its ipcache",
        &[&one, &two],
        || {
            two.cli(&["ipcache", "list"]).is_ok_and(|list| {
                list.lines()
                    .any(|l| l.starts_with(&format!("{client}/32")) && l.contains("remote"))
            })
        },
    );

    // A policy on node 2 selects node 1's pods by their labels.
    let before = two.policy_revision().expect("revision");
    api.apply(WEB_FROM_CLIENT).expect("policy");
    two.wait_policy_revision_after(before).expect("taken in");
    two.settle().expect("enforced");
    eventually("other is denied", &[&one, &two], || {
        !reaches(&other_ns, web)
    });
    assert!(reaches(&client_ns, web), "client is still allowed");

    // A remote pod relabelled: its identity changes on its node, the other node follows.
    api.kubectl(
        &[
            "label",
            "pod",
            "other",
            "-n",
            "shop",
            "app=client",
            "--overwrite",
        ],
        "",
    )
    .expect("kubectl label");
    eventually("relabelled other is allowed", &[&one, &two], || {
        reaches(&other_ns, web)
    });

    // A ClusterIP whose backend runs on the other node: translated on the client's node,
    // routed across, and the reply translated back.
    let service = format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec: {{ ports: [ {{ name: http, port: 80, targetPort: {PORT} }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-1, namespace: shop, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
ports: [ {{ name: http, port: {PORT}, protocol: TCP }} ]
endpoints: [ {{ addresses: [ "{web}" ], conditions: {{ ready: true }}, nodeName: n2 }} ]
"#
    );
    api.apply(&service).expect("service with a remote backend");
    let vip: Ipv4Addr = api
        .api()
        .get("v1", "Service", Some("shop"), "web")
        .expect("stored")["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    eventually(
        "client reaches the remote backend through the ClusterIP",
        &[&one, &two],
        || {
            matches!(
                probe(&client_ns, None, vip, Probe::Tcp(80), PROBE_TIMEOUT),
                Ok(Outcome::Answered)
            )
        },
    );
}

#[test]
fn ipam_cluster_pool_registers_the_node_and_waits_for_the_operators_cidrs() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut agent = Agent::prepare(AgentOptions {
        pod_cidrs: Vec::new(),
        ..AgentOptions::default()
    })
    .expect("node");
    let api = K8sApi::start(agent.node()).expect("API server");
    api.api().apply_yaml(NODES).expect("nodes");
    api.apply(PODS).expect("pods");
    let mut env = api.agent_env("n1");
    env.retain(|(k, _)| k != "CELLIUM_IPAM");
    env.push(("CELLIUM_IPAM".into(), "cluster-pool".into()));
    agent.options_mut().env = env;
    agent.launch().expect("agent");

    // The agent creates its CiliumNode with its addresses, and waits for pod CIDRs.
    let began = Instant::now();
    let cn = loop {
        if let Some(cn) = api.api().get("cilium.io/v2", "CiliumNode", None, "n1") {
            break cn;
        }
        assert!(began.elapsed() < CONVERGE, "no CiliumNode\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(cn["spec"]["addresses"][0]["ip"], "192.0.2.1", "{cn}");
    assert!(agent.is_running(), "waits\n{}", agent.log());
    assert!(
        agent.cli(&["status"]).is_err(),
        "not serving before the CIDRs"
    );

    // What the operator says when it has none to give is what the agent says.
    api.kubectl(
        &[
            "patch",
            "ciliumnode",
            "n1",
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"ipam":{"operator-status":{"error":"all pools are exhausted"}}}}"#,
        ],
        "",
    )
    .expect("operator status");
    let began = Instant::now();
    while !agent
        .log()
        .contains("the operator says: all pools are exhausted")
    {
        assert!(
            began.elapsed() < CONVERGE,
            "the operator's error is not reported\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The operator assigns a CIDR: the agent starts and hands out its addresses.
    api.kubectl(
        &[
            "patch",
            "ciliumnode",
            "n1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"ipam":{"podCIDRs":["10.245.20.0/24"]}}}"#,
        ],
        "",
    )
    .expect("operator assigns");
    agent.wait_ready().expect("ready once assigned");
    let ns = NetNs::new().expect("netns");
    let ip = agent
        .add_pod(&ns, "cid-client", "shop", "client")
        .expect("ADD");
    assert_eq!(ip.octets()[..3], [10, 245, 20], "{ip}");
    // The operator's field is left alone by the agent's upkeep.
    let cn = api
        .api()
        .get("cilium.io/v2", "CiliumNode", None, "n1")
        .unwrap();
    assert_eq!(cn["spec"]["ipam"]["podCIDRs"][0], "10.245.20.0/24");
}

/// `cellium-operator` in a node namespace, killed (and waited for) on drop.
struct Operator(std::process::Child);

impl Operator {
    fn start(agent: &Agent, api: &K8sApi) -> Operator {
        let program = agent.binaries().dir().join("cellium-operator");
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net={}", agent.node().path().display()))
            .arg("--")
            .arg(program)
            .args(["run", "--k8s-api-server", &api.url()])
            .args(["--cluster-pool-ipv4-cidr", "10.246.0.0/16"])
            .args(["--cluster-pool-ipv4-mask-size", "24"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("cellium-operator (cargo build --workspace first)");
        Operator(child)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_operator_gives_each_node_its_pod_cidr_and_pods_reach_across() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let no_cidr = || AgentOptions {
        pod_cidrs: Vec::new(),
        ..AgentOptions::default()
    };
    let mut one = Agent::prepare(no_cidr()).expect("node 1");
    let mut two = Agent::prepare(no_cidr()).expect("node 2");
    underlay(one.node(), two.node());
    let api = K8sApi::start(one.node()).expect("API server");
    api.serve_on(two.node()).expect("served on node 2");
    // Nodes without pod CIDRs: the operator's cluster pool gives them.
    let nodes = NODES
        .replace("spec: { podCIDRs: [ 10.245.11.0/24 ] }\n", "")
        .replace("spec: { podCIDRs: [ 10.245.12.0/24 ] }\n", "");
    api.api().apply_yaml(&nodes).expect("nodes");
    api.apply(PODS).expect("pods");
    let _operator = Operator::start(&one, &api);
    for (agent, name) in [(&mut one, "n1"), (&mut two, "n2")] {
        let mut env = api.agent_env(name);
        env.retain(|(k, _)| k != "CELLIUM_IPAM");
        env.push(("CELLIUM_IPAM".into(), "cluster-pool".into()));
        agent.options_mut().env = env;
        agent.start().expect("agent with ipam: cluster-pool");
    }
    let (client_ns, web_ns) = (NetNs::new().expect("netns"), NetNs::new().expect("netns"));
    let client = one
        .add_pod(&client_ns, "cid-client", "shop", "client")
        .expect("ADD client");
    let web = two
        .add_pod(&web_ns, "cid-web", "shop", "web")
        .expect("ADD web");
    assert_eq!(client.octets()[..2], [10, 246], "{client}");
    assert_eq!(web.octets()[..2], [10, 246], "{web}");
    assert_ne!(
        client.octets()[2],
        web.octets()[2],
        "each node has its own /24 of the pool"
    );
    let _server =
        TcpServer::start(&web_ns, SocketAddr::new(IpAddr::V4(web), PORT), "web").expect("server");
    eventually(
        "client reaches web over the operator's CIDRs",
        &[&one, &two],
        || reaches(&client_ns, web),
    );
}

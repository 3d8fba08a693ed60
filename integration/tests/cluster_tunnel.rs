//! Two nodes in `routing-mode: tunnel`: pods' traffic to the other node's pods is
//! encapsulated by the datapath in VXLAN (device `cel_vxlan`) with the source's identity in the
//! VNI, and the receiving node enforces ingress policy with it. The underlay (a veth pair,
//! 192.0.2.1 and 192.0.2.2) routes no pod address it receives, so only the tunnel can carry
//! pod traffic.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test cluster_tunnel -- --test-threads=1`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use cellium_integration::probe::{TcpServer, tcp_connect};
use cellium_integration::reach::{Outcome, Probe, probe};
use cellium_integration::{Agent, AgentOptions, K8sApi, NetNs};

const PORT: u16 = 8080;
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);
const CONVERGE: Duration = Duration::from_secs(20);

const NODES: &str = r#"
apiVersion: v1
kind: Node
metadata: { name: n1 }
spec: { podCIDRs: [ 10.245.21.0/24 ] }
status: { addresses: [ { type: InternalIP, address: 192.0.2.1 } ] }
---
apiVersion: v1
kind: Node
metadata: { name: n2 }
spec: { podCIDRs: [ 10.245.22.0/24 ] }
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

const WEB_FROM_CLIENT: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-client, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ], ports: [ { port: http } ] } ]
"#;

/// The underlay, which routes no pod address it receives: traffic between pods can only cross
/// it encapsulated (addressed to the nodes themselves).
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
    for (ns, dev, addr) in [(one, "und1", "192.0.2.1/24"), (two, "und2", "192.0.2.2/24")] {
        ns.ip(&["addr", "add", addr, "dev", dev]).expect("addr");
        ns.ip(&["link", "set", dev, "up"]).expect("up");
        // Pod addresses arriving on the underlay are refused (ICMP prohibited); packets to
        // the nodes themselves, the tunnel's among them, pass.
        ns.ip(&["rule", "add", "iif", dev, "to", "10.245.0.0/16", "prohibit"])
            .expect("no pod traffic on the underlay");
    }
}

fn reaches(from: &NetNs, ip: Ipv4Addr, port: u16) -> bool {
    matches!(
        probe(from, None, ip, Probe::Tcp(port), PROBE_TIMEOUT),
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

fn apply_and_settle(api: &K8sApi, agent: &Agent, yaml: &str) {
    let before = agent.policy_revision().expect("revision");
    api.apply(yaml).expect("policy");
    agent.wait_policy_revision_after(before).expect("taken in");
    agent.settle().expect("enforced");
}

/// One echo round trip of `len` bytes on an open connection.
fn echo(stream: &mut std::net::TcpStream, len: usize) -> std::io::Result<()> {
    let sent: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    stream.write_all(&sent)?;
    let mut got = vec![0u8; len];
    stream.read_exact(&mut got)?;
    assert_eq!(got, sent, "echo differs");
    Ok(())
}

#[test]
fn pods_reach_across_nodes_only_through_the_tunnel_with_their_identity() {
    let tunnel = || AgentOptions {
        pod_cidrs: Vec::new(),
        ..AgentOptions::default()
    };
    let mut one = Agent::prepare(tunnel()).expect("node 1");
    let mut two = Agent::prepare(tunnel()).expect("node 2");
    underlay(one.node(), two.node());
    let api = K8sApi::start(one.node()).expect("API server");
    api.serve_on(two.node()).expect("served on node 2");
    api.api().apply_yaml(NODES).expect("nodes");
    api.apply(PODS).expect("pods");
    for (agent, name) in [(&mut one, "n1"), (&mut two, "n2")] {
        let mut env = api.agent_env(name);
        env.push(("CELLIUM_ROUTING_MODE".into(), "tunnel".into()));
        agent.options_mut().env = env;
        agent.start().expect("agent");
    }
    for agent in [&one, &two] {
        let link = agent
            .node()
            .ip(&["-d", "link", "show", "cel_vxlan"])
            .expect("device");
        assert!(link.contains("vxlan external"), "{link}");
        assert!(link.contains("dstport 8472"), "{link}");
    }

    let (client_ns, other_ns, web_ns) = (
        NetNs::new().expect("netns"),
        NetNs::new().expect("netns"),
        NetNs::new().expect("netns"),
    );
    let client = one
        .add_pod(&client_ns, "cid-client", "shop", "client")
        .expect("ADD client");
    one.add_pod(&other_ns, "cid-other", "shop", "other")
        .expect("ADD other");
    let web = two
        .add_pod(&web_ns, "cid-web", "shop", "web")
        .expect("ADD web");
    let _server =
        TcpServer::start(&web_ns, SocketAddr::new(IpAddr::V4(web), PORT), "web").expect("server");

    // Pods' MTU leaves room for VXLAN's 50 bytes.
    let eth0 = client_ns.ip(&["link", "show", "eth0"]).expect("eth0");
    assert!(eth0.contains("mtu 1450"), "{eth0}");

    // Node 1 knows web with its node as the tunnel endpoint, and node 2's pod CIDR too.
    eventually("node 1 tunnels to web", &[&one, &two], || {
        one.cli(&["ipcache", "list"]).is_ok_and(|list| {
            list.lines()
                .any(|l| l.starts_with(&format!("{web}/32")) && l.contains("192.0.2.2"))
                && list
                    .lines()
                    .any(|l| l.starts_with("10.245.22.0/24") && l.contains("192.0.2.2"))
        })
    });
    eventually(
        "client reaches web through the tunnel",
        &[&one, &two],
        || reaches(&client_ns, web, PORT),
    );
    assert!(reaches(&other_ns, web, PORT), "no policy yet");
    // Node 1's own traffic takes the tunnel too (its route leads into the device).
    let routes = one
        .node()
        .ip(&["route", "show", "proto", "206"])
        .expect("routes");
    assert!(routes.contains("10.245.22.0/24 dev cel_vxlan"), "{routes}");
    assert!(
        reaches(one.node(), web, PORT),
        "node 1 reaches web through the tunnel"
    );
    // A bulk transfer: segments of the full pod MTU fit in the tunnel.
    let mut stream = tcp_connect(
        &client_ns,
        SocketAddr::new(IpAddr::V4(web), PORT),
        Duration::from_secs(5),
    )
    .expect("connect");
    let mut banner = [0u8; 4];
    stream.read_exact(&mut banner).expect("banner");
    echo(&mut stream, 256 * 1024).expect("bulk echo across the tunnel");

    // Node 2 admits node 1's pods by the identity their packets carry.
    let before = two.policy_revision().expect("revision");
    api.apply(WEB_FROM_CLIENT).expect("policy");
    two.wait_policy_revision_after(before).expect("taken in");
    two.settle().expect("enforced");
    eventually("other is denied", &[&one, &two], || {
        !reaches(&other_ns, web, PORT)
    });
    assert!(reaches(&client_ns, web, PORT), "client is still allowed");
    // The entities, as Cilium means them: node 2 itself is `host` (allowed, as the local node
    // always is); node 1 is `remote-node` (its tunnelled `host` identity), not selected yet.
    assert!(reaches(two.node(), web, PORT), "the local node is allowed");
    assert!(
        !reaches(one.node(), web, PORT),
        "remote-node is not selected"
    );
    apply_and_settle(&api, &two, WEB_FROM_REMOTE_NODES);
    eventually("remote-node is allowed", &[&one, &two], || {
        reaches(one.node(), web, PORT)
    });
    assert!(
        !reaches(&other_ns, web, PORT),
        "remote-node is not its pods"
    );
    apply_and_settle(&api, &two, WEB_FROM_CLUSTER);
    eventually("cluster takes in the remote pods", &[&one, &two], || {
        reaches(&other_ns, web, PORT)
    });
    api.kubectl(
        &[
            "delete",
            "ciliumnetworkpolicy",
            "web-from-cluster",
            "-n",
            "shop",
        ],
        "",
    )
    .expect("kubectl delete");
    eventually("other is denied again", &[&one, &two], || {
        !reaches(&other_ns, web, PORT)
    });
    let flows = two
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

    // The open connection survives a restart of either agent.
    one.stop().expect("stop agent 1");
    one.start().expect("restart agent 1");
    echo(&mut stream, 4096).expect("echo after agent 1 restarted");
    two.stop().expect("stop agent 2");
    two.start().expect("restart agent 2");
    echo(&mut stream, 4096).expect("echo after agent 2 restarted");

    // A ClusterIP whose backend is on the other node: translated here, tunnelled, and the
    // reply translated back as it comes out of the tunnel.
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
    api.apply(&service).expect("service");
    let vip: Ipv4Addr = api
        .api()
        .get("v1", "Service", Some("shop"), "web")
        .expect("stored")["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    eventually(
        "client reaches web through the ClusterIP",
        &[&one, &two],
        || reaches(&client_ns, vip, 80),
    );
    assert!(
        !reaches(&other_ns, vip, 80),
        "policy holds through the service"
    );
    let _ = client;
}

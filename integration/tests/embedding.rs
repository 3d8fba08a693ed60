//! An agent embedded from a subset of the cells: `crates/agent-bin/examples/connectivity_agent.rs`
//! (node-lock, statedir, metrics, api-server, loader, ipam, endpoint-manager; no resources, identity,
//! ipcache, policy-repo or svc-lb) run in a node namespace, serving pods through the real
//! `cellium-cni` with the real datapath.
//!
//! Root, serially, after `cargo build --workspace --all-targets` (the tests run the built
//! example and binaries): `cargo test -p cellium-integration --test embedding -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces and removes them (guards), and sends
//! traffic only to the pods' and the node's addresses inside them.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use cellium_integration::agent::Binaries;
use cellium_integration::probe::{self, TcpServer};
use cellium_integration::wait::container_id as cid;
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use serde_json::Value;

/// The connectivity agent, started in a node namespace of its own.
fn connectivity_agent() -> Agent {
    let program = Binaries::find()
        .and_then(|b| b.example("connectivity_agent"))
        .expect("the example is built");
    Agent::start_new(AgentOptions {
        program: Some(program),
        ..AgentOptions::default()
    })
    .expect("start the connectivity agent")
}

/// The endpoint of `container` as `cellium endpoint list -o json` shows it.
fn endpoint(agent: &Agent, container: &str) -> Option<Value> {
    agent
        .endpoints()
        .expect("endpoint list")
        .into_iter()
        .find(|e| e["container_id"] == container)
}

/// The pool's router: the pods' gateway, on `cellium_host` in the node namespace.
fn router(agent: &Agent) -> Ipv4Addr {
    agent.pools().expect("ipam list")[0]["router"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("a router address")
}

/// Addresses IPAM holds for pods (the router left out).
fn held(agent: &Agent) -> BTreeSet<String> {
    agent
        .pools()
        .expect("ipam list")
        .iter()
        .flat_map(|p| p["allocations"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["owner"] != "router")
        .filter_map(|a| a["ip"].as_str().map(str::to_string))
        .collect()
}

/// The host ends of veth pairs in the node namespace ([`Agent::lxc_links`]).
fn lxc_links(agent: &Agent) -> BTreeSet<String> {
    agent.lxc_links().expect("ip link")
}

/// Packets the datapath's programs forwarded so far (from the agent's metrics).
fn forwarded(agent: &Agent) -> u64 {
    agent
        .metrics()
        .expect("metrics")
        .lines()
        .filter(|l| l.starts_with("cellium_datapath_packets"))
        .filter(|l| l.contains("reason=\"forwarded\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn ping(from: &NetNs, to: Ipv4Addr) -> bool {
    probe::ping(from, to, 1).expect("ping")
}

#[test]
fn an_agent_of_connectivity_only_serves_pods_through_the_cni_plugin() {
    let _serial = serial();
    let agent = connectivity_agent();

    // `cellium status` answers, with the agent's modules and no others; OK once each timer
    // job's first run (at start) has ended.
    let began = std::time::Instant::now();
    let status = loop {
        let status = agent.cli_json(&["status"]).expect("status");
        if status["level"] != "Unknown" || began.elapsed() > Duration::from_secs(10) {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status["level"], "OK", "{status:#}");
    let modules: BTreeSet<&str> = status["modules"]
        .as_array()
        .expect("modules")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(
        modules,
        BTreeSet::from([
            "api-server",
            "endpoint-manager",
            "ipam",
            "loader",
            "metrics",
            "node-lock",
            "statedir"
        ]),
        "{status:#}"
    );
    let endpoint_manager = status["modules"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["id"] == "endpoint-manager")
        .expect("the endpoint manager");
    let scope = endpoint_manager["children"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["id"] == "endpoint-manager.scope")
        .unwrap_or_else(|| panic!("no scope node: {endpoint_manager:#}"));
    let said = scope["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("no policy repository: no direction is enforced"),
        "{said}"
    );
    assert!(
        said.contains("every endpoint has identity 5 (reserved:init)"),
        "{said}"
    );

    // The plugin's STATUS: ready for pods.
    let status_call = CniCall::new("STATUS", "-")
        .unset("CNI_CONTAINERID")
        .unset("CNI_IFNAME")
        .conf(&agent.net_conf("1.1.0"));
    let (exit, out) = agent.cni(&status_call).expect("STATUS");
    assert!(exit.success(), "STATUS: {out}");

    // Pods through the plugin: one named by the runtime as Kubernetes does, one not.
    let pods: Vec<NetNs> = (0..2).map(|_| NetNs::new().expect("pod netns")).collect();
    let (a, b) = (cid("conn-a"), cid("conn-b"));
    let ip_a = agent
        .add_pod(&pods[0], &a, "shop", "web-1")
        .expect("ADD of a");
    let (ip_b, _) = agent.add(&pods[1], &b).expect("ADD of b");
    assert_ne!(ip_a, ip_b);
    let ep_a = endpoint(&agent, &a).expect("a's endpoint");
    assert_eq!(ep_a["state"], "ready", "{ep_a:#}");
    assert_eq!(ep_a["identity"], 5, "{ep_a:#}");
    assert_eq!(ep_a["ingress_enforced"], false, "{ep_a:#}");
    assert_eq!(ep_a["egress_enforced"], false, "{ep_a:#}");
    assert_eq!(
        ep_a["labels"],
        serde_json::json!({
            "k8s:io.kubernetes.pod.namespace": "shop",
            "k8s:io.cilium.k8s.policy.cluster": "default",
        }),
        "only what the runtime named, and the cluster: {ep_a:#}"
    );
    assert_eq!(endpoint(&agent, &b).expect("b's endpoint")["identity"], 5);

    // Real packets: pod to pod through the datapath's programs, pod to node, node to pod.
    let before = forwarded(&agent);
    assert!(probe::ping(&pods[0], ip_b, 2).unwrap(), "a -> b");
    assert!(
        forwarded(&agent) >= before + 4,
        "the echoes went through the programs"
    );
    assert!(ping(&pods[1], ip_a), "b -> a");
    let gw = router(&agent);
    for (i, pod) in pods.iter().enumerate() {
        assert!(ping(pod, gw), "pod {i} -> node ({gw})");
    }
    assert!(ping(agent.node(), ip_a), "node -> a");
    assert!(ping(agent.node(), ip_b), "node -> b");
    let _on_b = TcpServer::start(&pods[1], SocketAddrV4::new(ip_b, 8080), "b").unwrap();
    let reply = probe::tcp_request(
        &pods[0],
        SocketAddrV4::new(ip_b, 8080),
        Duration::from_secs(2),
    )
    .expect("TCP a -> b");
    assert_eq!(reply.banner, "b");
    let _on_node = TcpServer::start(agent.node(), SocketAddrV4::new(gw, 8081), "node").unwrap();
    let reply = probe::tcp_request(
        &pods[0],
        SocketAddrV4::new(gw, 8081),
        Duration::from_secs(2),
    )
    .expect("TCP a -> node");
    assert_eq!(reply.banner, "node");
    assert_eq!(agent.datapath_drops().unwrap(), 0);

    // What the agent does not have, it says it does not serve.
    let err = agent
        .cli(&["policy", "get"])
        .expect_err("no policy here")
        .to_string();
    assert!(
        err.contains("Policy.Get: this agent does not serve it"),
        "{err}"
    );

    // DEL removes everything: endpoints, records, veths, addresses, the pods' interfaces.
    agent.del(&a, &pods[0].path()).expect("DEL of a");
    agent.del(&b, &pods[1].path()).expect("DEL of b");
    assert!(agent.endpoints().unwrap().is_empty());
    assert!(held(&agent).is_empty(), "{:?}", held(&agent));
    assert!(lxc_links(&agent).is_empty(), "{:?}", lxc_links(&agent));
    for pod in &pods {
        assert!(pod.ip(&["link", "show", "eth0"]).is_err(), "eth0 left");
    }
    let records = std::fs::read_dir(agent.state_dir().join("endpoints"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(records, 0, "records left");
}

#[test]
fn a_restarted_connectivity_agent_keeps_its_pods_and_their_traffic() {
    let _serial = serial();
    let mut agent = connectivity_agent();
    let pods: Vec<NetNs> = (0..2).map(|_| NetNs::new().expect("pod netns")).collect();
    let (a, b) = (cid("keep-a"), cid("keep-b"));
    let (ip_a, _) = agent.add(&pods[0], &a).expect("ADD of a");
    let (ip_b, _) = agent.add(&pods[1], &b).expect("ADD of b");
    let id_a = endpoint(&agent, &a).expect("a")["id"].clone();

    let (status, _) = agent.stop().expect("stop");
    assert!(status.success(), "{status}");
    // The pinned programs keep forwarding while no agent runs.
    assert!(ping(&pods[0], ip_b), "a -> b without an agent");
    agent.start().expect("the agent starts again");

    let ep_a = endpoint(&agent, &a).expect("a is restored");
    assert_eq!(ep_a["id"], id_a);
    assert_eq!(ep_a["state"], "ready");
    assert_eq!(ep_a["identity"], 5);
    assert!(endpoint(&agent, &b).is_some(), "b is restored");
    assert_eq!(
        held(&agent),
        BTreeSet::from([ip_a.to_string(), ip_b.to_string()]),
        "their addresses are theirs again"
    );
    assert!(ping(&pods[0], ip_b) && ping(&pods[1], ip_a));
    // A new pod gets another address and reaches the others.
    let c = NetNs::new().expect("pod netns");
    let (ip_c, _) = agent.add(&c, &cid("keep-c")).expect("ADD of c");
    assert!(ip_c != ip_a && ip_c != ip_b, "{ip_c}");
    assert!(ping(&c, ip_a));
}

//! The pod's network namespace as the runtime names it: the plugin opens `CNI_NETNS` where the
//! runtime's path is valid and passes the namespace to the agent, which refuses its own (and the
//! node's) and never opens the path itself.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test cni_netns -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces and removes them (guards); the only
//! traffic is a ping from a pod to its node's router address.

use cellium_api::v1::endpoints_client::EndpointsClient;
use cellium_api::v1::{CreateEndpointRequest, ListEndpointsRequest};
use cellium_integration::wait::container_id as cid;
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, probe, serial};
use serde_json::{Value, json};

fn snapshot(ns: &NetNs) -> String {
    let links = ns.ip(&["-o", "link", "show"]).expect("ip link");
    let addrs = ns.ip(&["-o", "addr", "show"]).expect("ip addr");
    let routes = ns.ip(&["route", "show"]).expect("ip route");
    format!("{links}{addrs}{routes}")
}

/// What a refused call must leave unchanged: the agent's pools and endpoints, and the node.
fn state(agent: &Agent) -> (Vec<Value>, Vec<Value>, String) {
    (
        agent.pools().unwrap(),
        agent.endpoints().unwrap(),
        snapshot(agent.node()),
    )
}

fn failure(agent: &Agent, call: &CniCall) -> (u64, String) {
    let (status, out) = agent.cni(call).unwrap();
    assert!(!status.success(), "succeeded: {out}");
    (
        out["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {out}")),
        out["msg"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn the_nodes_own_namespace_is_refused_and_nothing_is_created() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).unwrap();
    let node = agent.node().path().display().to_string();
    let before = state(&agent);

    // A runtime in the node's namespace passing `/proc/self/ns/net`: the plugin's own namespace,
    // which there is the node's. An agent that opened the path itself would open its own.
    let own = CniCall::new("ADD", &cid("own"))
        .netns("/proc/self/ns/net")
        .via(&["nsenter", &format!("--net={node}"), "--"]);
    let (code, msg) = failure(&agent, &own);
    assert_eq!(code, 101, "{msg}");
    assert!(msg.contains("network namespace refused"), "{msg}");
    assert!(msg.contains("the agent's own network namespace"), "{msg}");
    assert_eq!(state(&agent), before, "a refused ADD changed something");

    // The node's namespace by its bind mount, from a runtime outside it: refused the same way.
    let (code, msg) = failure(&agent, &CniCall::new("ADD", &cid("bind")).netns(&node));
    assert_eq!(code, 101, "{msg}");
    assert!(msg.contains(&format!("{node} is refused")), "{msg}");
    assert_eq!(state(&agent), before, "a refused ADD changed something");
}

#[test]
fn a_namespace_only_the_runtime_can_see_gets_a_pod_that_survives_a_restart() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).unwrap();
    let pod = NetNs::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The runtime's path: a bind mount of the pod's namespace in a private mount namespace of
    // the plugin's. The agent, in the machine's mount namespace, sees an empty file there.
    let hidden = dir.path().join("pod-netns");
    std::fs::write(&hidden, "").unwrap();
    let hidden_text = hidden.display().to_string();
    let pod_path = pod.path().display().to_string();
    let runtime = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount --bind \"$1\" \"$2\" && shift 2 && exec \"$@\"",
        "sh",
        &pod_path,
        &hidden_text,
    ];
    let id = cid("hidden");
    let add = CniCall::new("ADD", &id).netns(&hidden).via(&runtime);
    let (ip, result) = agent.add_call(&add).expect("ADD through the hidden path");
    assert_eq!(
        std::fs::metadata(&hidden).unwrap().len(),
        0,
        "the bind mount leaked"
    );
    assert_eq!(
        result["interfaces"][1]["sandbox"],
        json!(hidden_text),
        "{result}"
    );
    let addrs = pod
        .ip(&["-o", "addr", "show", "eth0"])
        .expect("eth0 in the pod");
    assert!(addrs.contains(&format!("{ip}/32")), "{addrs}");

    // CHECK goes through the namespace passed as well.
    let mut conf = agent.net_conf("1.0.0");
    conf["prevResult"] = result.clone();
    let check = CniCall::new("CHECK", &id)
        .netns(&hidden)
        .conf(&conf)
        .via(&runtime);
    let (status, out) = agent.cni(&check).unwrap();
    assert!(status.success(), "CHECK failed: {out}");

    // A restart cannot reopen the path: the host end of the veth pair proves the pod is there.
    agent.stop().unwrap();
    agent.start().unwrap();
    let endpoints = agent.endpoints().unwrap();
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    assert_eq!(endpoints[0]["netns"], json!(hidden_text));
    let router = agent.pools().unwrap()[0]["router"]
        .as_str()
        .and_then(|s| s.parse::<std::net::IpAddr>().ok())
        .expect("router");
    assert!(
        probe::ping(&pod, router, 1).unwrap(),
        "the pod lost its network"
    );

    let (status, out) = agent.cni(&CniCall::new("DEL", &id).netns(&hidden)).unwrap();
    assert!(status.success(), "DEL failed: {out}");
    assert!(
        pod.ip(&["link", "show", "eth0"]).is_err(),
        "eth0 outlived DEL"
    );
    assert!(agent.endpoints().unwrap().is_empty());
}

#[test]
fn a_namespace_that_is_not_one_or_is_missing_is_refused_naming_it() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).unwrap();
    let before = state(&agent);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-netns");
    std::fs::write(&file, "").unwrap();
    let (code, msg) = failure(&agent, &CniCall::new("ADD", &cid("file")).netns(&file));
    assert_eq!(code, 101, "{msg}");
    assert!(
        msg.contains("not a network namespace but a regular file"),
        "{msg}"
    );
    let gone = dir.path().join("gone");
    let (code, msg) = failure(&agent, &CniCall::new("ADD", &cid("gone")).netns(&gone));
    assert_eq!(code, 102, "{msg}");
    assert!(msg.contains(&gone.display().to_string()), "{msg}");
    assert_eq!(state(&agent), before, "a refused ADD changed something");
}

#[test]
fn a_client_that_passes_no_namespace_is_refused_by_create_and_served_by_the_rest() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).unwrap();
    let pod = NetNs::new().unwrap();
    let before = state(&agent);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (refusal, listed) = runtime.block_on(async {
        let mut client = EndpointsClient::new(cellium_api::connect(agent.socket()).await.unwrap());
        let refusal = client
            .create(CreateEndpointRequest {
                container_id: cid("direct"),
                netns: pod.path().display().to_string(),
                ifname: "eth0".into(),
                network: "cellium".into(),
                ..CreateEndpointRequest::default()
            })
            .await
            .unwrap_err();
        let listed = client.list(ListEndpointsRequest {}).await;
        (refusal, listed)
    });
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        cellium_api::reason_of(&refusal),
        Some(cellium_api::Reason::NetnsNotPassed)
    );
    assert!(
        refusal.message().contains("not passed"),
        "{}",
        refusal.message()
    );
    assert!(listed.is_ok(), "{listed:?}");
    assert_eq!(state(&agent), before);
    assert!(pod.ip(&["link", "show", "eth0"]).is_err());
}

#[test]
fn a_socket_path_that_is_a_file_is_an_io_failure() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).unwrap();
    let pod = NetNs::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.sock");
    std::fs::write(&file, "").unwrap();
    let mut conf = agent.net_conf("1.0.0");
    conf["socket"] = json!(file);
    let call = CniCall::new("ADD", &cid("sock"))
        .netns(pod.path())
        .conf(&conf);
    let (code, msg) = failure(&agent, &call);
    assert_eq!(code, 5, "{msg}");
    assert!(msg.contains("a regular file, not a unix socket"), "{msg}");
}

//! The CNI `portMappings` capability served by the datapath, driven as libcni drives the
//! plugin (the capability's arguments inserted as `runtimeConfig`): the real agent in a node
//! namespace (standalone, its default embedded configuration) with the lab's external network
//! on `celx0` (10.98.0.1, the outside at 10.98.0.2), a container made through the real
//! `cellium-cni` without a pod name, a TCP server in it.
//!
//! Root, serially, after `cargo build --workspace --bins`:
//! `cargo test -p cellium-integration --test port_mappings -- --test-threads=1`.
//!
//! Every namespace, the agent and its directory are removed by guards, also on failure;
//! traffic goes only to addresses inside them.

use std::net::{IpAddr, SocketAddr};

use cellium_integration::lab::External;
use cellium_integration::lab::external::{EXT_LINK_IP, NODE_LINK_IP};
use cellium_integration::lab::service_bed::frontends;
use cellium_integration::probe::{PeerServer, seen_from};
use cellium_integration::wait::{eventually, wait_for};
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use serde_json::{Value, json};

/// The published port, on every node address.
const HOST_PORT: u16 = 18080;
/// A port published on an address that is not the node's (the outside's).
const FOREIGN_PORT: u16 = 19090;
/// Where the container listens.
const CONTAINER_PORT: u16 = 8080;

/// The agent's network configuration with `mappings` as the runtime inserts them.
fn conf(agent: &Agent, mappings: Value) -> Value {
    let mut conf = agent.net_conf("1.0.0");
    conf["runtimeConfig"] = json!({ "portMappings": mappings });
    conf
}

/// The HostPort frontends at `port`.
fn host_ports_at(agent: &Agent, port: u16) -> Vec<Value> {
    frontends(agent)
        .into_iter()
        .filter(|f| f["kind"] == "HostPort" && f["port"] == port)
        .collect()
}

/// `cellium_host_ports_refused{reason="<reason>"}` as the agent's metrics endpoint says.
fn refused(agent: &Agent, reason: &str) -> Option<u64> {
    let sample = format!("cellium_host_ports_refused{{reason=\"{reason}\"}} ");
    agent
        .metrics()
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(&sample)?.trim().parse().ok())
}

/// What the container's server saw as the client's address, reached from outside at the
/// node's address and the host port.
fn from_outside(external: &External) -> std::io::Result<IpAddr> {
    seen_from(
        external.netns(),
        SocketAddr::new(NODE_LINK_IP.into(), HOST_PORT),
    )
}

#[test]
fn port_mappings_are_served_refused_when_foreign_kept_across_a_restart_and_gone_with_del() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let external = External::attach(agent.node(), &["10.244.0.0/24".to_string()])
        .expect("the external network");
    let pod = NetNs::new().expect("the container's namespace");
    let cid = cellium_integration::wait::container_id("pm");

    // Bad mappings are refused by ADD, naming the field, with nothing created.
    for (bad, needle) in [
        (
            json!([{"hostPort": 70000, "containerPort": 80}]),
            "\"hostPort\" 70000 is not a port number",
        ),
        (
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "icmp"}]),
            "\"protocol\" \"icmp\" is not a protocol",
        ),
        (
            json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "node-1"}]),
            "\"hostIP\" \"node-1\" is not an IPv4 or IPv6 address",
        ),
        (json!({"hostPort": 8080}), "is not a list"),
    ] {
        let call = CniCall::new("ADD", &cid)
            .netns(pod.path())
            .conf(&conf(&agent, bad.clone()));
        let (status, out) = agent.cni(&call).expect("the plugin runs");
        assert!(!status.success(), "{bad} was accepted: {out}");
        assert_eq!(out["code"], 7, "{bad}: {out}");
        let msg = out["msg"].as_str().unwrap_or_default();
        assert!(
            msg.contains("\"runtimeConfig.portMappings\"") && msg.contains(needle),
            "{bad}: {out}"
        );
        assert!(agent.endpoints().expect("endpoints").is_empty(), "{bad}");
        assert!(agent.lxc_links().expect("links").is_empty(), "{bad}");
    }

    // A mapping on every node address, and one on the outside's address, which is not the
    // node's.
    let mappings = json!([
        {"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT, "protocol": "TCP"},
        {"HostPort": FOREIGN_PORT, "ContainerPort": CONTAINER_PORT, "Protocol": "tcp",
         "HostIP": EXT_LINK_IP.to_string()}
    ]);
    let call = CniCall::new("ADD", &cid)
        .netns(pod.path())
        .conf(&conf(&agent, mappings));
    let (ip, _) = agent.add_call(&call).expect("ADD with port mappings");
    let _server =
        PeerServer::start(&pod, SocketAddr::new(ip.into(), CONTAINER_PORT)).expect("server");
    let ep = &agent.endpoints().expect("endpoints")[0];
    assert_eq!(
        ep["port_mappings"],
        json!([
            format!("{HOST_PORT}->{CONTAINER_PORT}/TCP"),
            format!("{EXT_LINK_IP}:{FOREIGN_PORT}->{CONTAINER_PORT}/TCP")
        ]),
        "{ep}"
    );

    let published = wait_for("the host port frontend on the link", || {
        host_ports_at(&agent, HOST_PORT)
            .into_iter()
            .find(|f| f["vip"] == NODE_LINK_IP.to_string())
    });
    assert_eq!(published["backends_from"], "port-mappings", "{published}");
    assert_eq!(published["error"], Value::Null, "{published}");
    // Reached from outside at the node's address, the client's address kept. The link came
    // after the agent: its device takes the program a moment later.
    let seen = wait_for("the host port answering from outside", || {
        from_outside(&external).ok()
    });
    assert_eq!(seen, IpAddr::from(EXT_LINK_IP));

    // The foreign hostIP is refused and reported: on the frontend, in the status line, in
    // the metric; and the outside's own address stays the outside's.
    let foreign = wait_for("the foreign host port listed", || {
        host_ports_at(&agent, FOREIGN_PORT).into_iter().next()
    });
    let error = foreign["error"].as_str().unwrap_or_default();
    assert!(error.contains("not an address of this node"), "{foreign}");
    eventually("the refusal counted in svc-lb's status line", || {
        agent
            .cli(&["status", "--verbose"])
            .is_ok_and(|s| s.contains("1 host ports refused (foreign-host-ip 1)"))
    });
    eventually(
        "cellium_host_ports_refused counting the foreign hostIP",
        || refused(&agent, "foreign-host-ip") == Some(1),
    );
    assert_eq!(refused(&agent, "taken-by-service"), Some(0));

    // The mapping survives a restart of the agent: kept on the endpoint's record.
    agent.stop().expect("stop the agent");
    agent.start().expect("start the agent again");
    let ep = &agent.endpoints().expect("endpoints")[0];
    assert_eq!(
        ep["port_mappings"].as_array().map(Vec::len),
        Some(2),
        "{ep}"
    );
    wait_for("the host port frontend after the restart", || {
        host_ports_at(&agent, HOST_PORT)
            .into_iter()
            .find(|f| f["vip"] == NODE_LINK_IP.to_string() && f["error"].is_null())
    });
    let seen = wait_for("the host port answering after the restart", || {
        from_outside(&external).ok()
    });
    assert_eq!(seen, IpAddr::from(EXT_LINK_IP));
    eventually("the refusal counted again after the restart", || {
        refused(&agent, "foreign-host-ip") == Some(1)
    });

    // DEL removes the frontends: the port is nobody's any more.
    agent.del(&cid, &pod.path()).expect("DEL");
    eventually("the host port frontends gone", || {
        frontends(&agent).iter().all(|f| f["kind"] != "HostPort")
    });
    eventually("the host port no longer answering from outside", || {
        from_outside(&external).is_err()
    });
    eventually("no host port refused", || {
        refused(&agent, "foreign-host-ip") == Some(0)
    });
}

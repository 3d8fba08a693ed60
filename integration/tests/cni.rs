//! Pods get networking: the real agent in a node namespace, the real `cellium-cni` run as a
//! runtime runs it, pods as network namespaces.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test cni -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces and removes them (guards), and sends
//! traffic only to the pods' and the node's addresses inside them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use cellium_integration::cni::{CniProcess, result_ipv4};
use cellium_integration::probe::{self, TcpServer};
use cellium_integration::wait::{FLOWING_ROUNDS, container_id};
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use serde_json::Value;

fn agent() -> Agent {
    Agent::start_new(AgentOptions::default()).expect("start the agent")
}

fn pods(n: usize) -> Vec<NetNs> {
    (0..n).map(|_| NetNs::new().expect("pod netns")).collect()
}

/// The IPv4 address of an endpoint as `cellium endpoint list -o json` shows it.
fn ep_ip(ep: &Value) -> Ipv4Addr {
    ep["addresses"][0]
        .as_str()
        .and_then(|a| a.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no address in {ep}"))
}

/// Addresses held by pods, with their owners (the routers left out).
fn allocations(agent: &Agent) -> BTreeMap<Ipv4Addr, String> {
    let mut out = BTreeMap::new();
    for pool in agent.pools().expect("ipam list") {
        for a in pool["allocations"].as_array().into_iter().flatten() {
            let owner = a["owner"].as_str().unwrap_or_default().to_string();
            if owner == "router" {
                continue;
            }
            if let Some(ip) = a["ip"].as_str().and_then(|s| s.parse().ok()) {
                out.insert(ip, owner);
            }
        }
    }
    out
}

fn used(agent: &Agent) -> u64 {
    agent
        .pools()
        .expect("ipam list")
        .iter()
        .map(|p| p["used"].as_u64().unwrap_or(0))
        .sum()
}

fn router(agent: &Agent) -> Ipv4Addr {
    agent.pools().expect("ipam list")[0]["router"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("router address")
}

/// The host ends of veth pairs in the node namespace ([`Agent::lxc_links`]).
fn lxc_links(agent: &Agent) -> BTreeSet<String> {
    agent.lxc_links().expect("ip link")
}

fn has_eth0(pod: &NetNs) -> bool {
    pod.ip(&["link", "show", "eth0"]).is_ok()
}

/// The links and addresses of `ns`, without IPv6 duplicate address detection's passing
/// `tentative` flag: a link-local address of the node's own devices turns from tentative to
/// valid by itself, about a second after the device came up.
fn snapshot(ns: &NetNs) -> String {
    let links = ns.ip(&["-o", "link", "show"]).expect("ip link");
    let addrs = ns.ip(&["-o", "addr", "show"]).expect("ip addr");
    format!("{links}{}", addrs.replace(" tentative", ""))
}

/// The CNI error object's code and message.
fn cni_error(out: &Value) -> (u64, String) {
    (
        out["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {out}")),
        out["msg"].as_str().unwrap_or_default().to_string(),
    )
}

fn wait_all(procs: Vec<CniProcess>) -> Vec<(bool, Value)> {
    procs
        .into_iter()
        .map(|p| {
            let (status, out) = p.wait().expect("plugin");
            (status.success(), out)
        })
        .collect()
}

fn ping(from: &NetNs, to: Ipv4Addr) -> bool {
    probe::ping(from, to, 1).expect("ping")
}

#[test]
fn three_pods_get_unique_addresses_and_reach_each_other_and_the_node() {
    let _serial = serial();
    let agent = agent();
    let pods = pods(3);
    let mut ips = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let (ip, result) = agent
            .add(pod, &container_id(&format!("three{i}")))
            .expect("ADD");
        assert_eq!(result["interfaces"][1]["name"], "eth0", "{result}");
        assert_eq!(
            result["interfaces"][1]["sandbox"],
            pod.path().display().to_string()
        );
        ips.push(ip);
    }
    assert_eq!(ips.iter().collect::<HashSet<_>>().len(), 3, "{ips:?}");

    // The pool's router is the pods' gateway and lives on cellium_host in the node namespace.
    let gw = router(&agent);
    let on_host = agent
        .node()
        .ip(&["-4", "-o", "addr", "show", "dev", "cellium_host"])
        .unwrap();
    assert!(on_host.contains(&format!("{gw}/32")), "{on_host}");

    for (i, from) in pods.iter().enumerate() {
        for (j, to) in ips.iter().enumerate() {
            if i != j {
                assert!(ping(from, *to), "pod {i} -> pod {j} ({to})");
            }
        }
        assert!(ping(from, gw), "pod {i} -> node ({gw})");
        assert!(ping(agent.node(), ips[i]), "node -> pod {i} ({})", ips[i]);
    }
    let _server = TcpServer::start(&pods[2], SocketAddrV4::new(ips[2], 8080), "pod2").unwrap();
    let reply = probe::tcp_request(
        &pods[0],
        SocketAddrV4::new(ips[2], 8080),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(reply.banner, "pod2");
    assert_eq!(agent.datapath_drops().unwrap(), 0);
}

#[test]
fn del_frees_the_address_and_is_idempotent_and_check_reports_a_removed_interface() {
    let _serial = serial();
    let agent = agent();
    let pods = pods(3);

    // DEL frees the address; a second DEL succeeds too.
    let id = container_id("del0");
    let (ip, _) = agent.add(&pods[0], &id).unwrap();
    assert!(allocations(&agent).contains_key(&ip));
    agent.del(&id, &pods[0].path()).expect("DEL");
    assert!(!allocations(&agent).contains_key(&ip), "{ip} still held");
    assert!(!has_eth0(&pods[0]));
    assert!(lxc_links(&agent).is_empty());
    assert!(agent.endpoints().unwrap().is_empty());
    agent.del(&id, &pods[0].path()).expect("second DEL");

    // DEL after the pod's namespace was deleted succeeds and frees everything.
    let gone = NetNs::new().unwrap();
    let gone_path = gone.path();
    let id = container_id("del1");
    let (ip, _) = agent.add(&gone, &id).unwrap();
    drop(gone);
    agent.del(&id, &gone_path).expect("DEL without netns");
    agent
        .cni(&CniCall::new("DEL", &id))
        .map(|(s, _)| assert!(s.success(), "DEL without CNI_NETNS"))
        .unwrap();
    assert!(!allocations(&agent).contains_key(&ip));
    assert!(lxc_links(&agent).is_empty());

    // CHECK passes on an intact pod and reports one whose interface was removed.
    let id = container_id("del2");
    let (ip, result) = agent.add(&pods[1], &id).unwrap();
    let mut conf = agent.net_conf("1.0.0");
    conf["prevResult"] = result;
    let check = CniCall::new("CHECK", &id).netns(pods[1].path()).conf(&conf);
    let (status, out) = agent.cni(&check).unwrap();
    assert!(status.success(), "CHECK of an intact pod: {out}");
    assert_eq!(out, Value::Null);
    // A removed default route is a difference too.
    let gw = router(&agent).to_string();
    pods[1]
        .ip(&["route", "del", "default", "via", &gw, "dev", "eth0"])
        .unwrap();
    let (status, out) = agent.cni(&check).unwrap();
    assert!(!status.success());
    let (code, msg) = cni_error(&out);
    assert_eq!(code, 105, "{out}");
    assert!(msg.contains("default route"), "{msg}");
    pods[1].ip(&["link", "del", "eth0"]).unwrap();
    let (status, out) = agent.cni(&check).unwrap();
    assert!(!status.success());
    let (code, msg) = cni_error(&out);
    assert_eq!(code, 105, "{out}");
    assert_eq!(out["cniVersion"], "1.0.0");
    assert!(msg.contains("eth0"), "{msg}");
    assert!(msg.contains(&pods[1].path().display().to_string()), "{msg}");
    // And the runtime's DEL cleans up after it.
    agent.del(&id, &pods[1].path()).unwrap();
    assert!(!allocations(&agent).contains_key(&ip));
    assert_eq!(used(&agent), 0);
    assert!(agent.endpoints().unwrap().is_empty());
}

#[test]
fn fifty_concurrent_adds_get_fifty_ready_reachable_endpoints() {
    let _serial = serial();
    let agent = agent();
    let pods = pods(50);
    let procs: Vec<CniProcess> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            agent
                .spawn_cni(
                    &CniCall::new("ADD", &container_id(&format!("fifty{i}"))).netns(pod.path()),
                )
                .unwrap()
        })
        .collect();
    let results = wait_all(procs);
    let ips: Vec<Ipv4Addr> = results
        .iter()
        .map(|(ok, out)| {
            assert!(ok, "ADD failed: {out}");
            result_ipv4(out).unwrap()
        })
        .collect();
    assert_eq!(ips.iter().collect::<HashSet<_>>().len(), 50, "{ips:?}");

    let endpoints = agent.endpoints().unwrap();
    assert_eq!(endpoints.len(), 50);
    for ep in &endpoints {
        assert_eq!(ep["state"], "ready", "{ep}");
    }
    let listed: HashSet<Ipv4Addr> = endpoints.iter().map(ep_ip).collect();
    assert_eq!(listed, ips.iter().copied().collect());
    assert_eq!(used(&agent), 50);

    for (i, ip) in ips.iter().enumerate().skip(1) {
        assert!(ping(&pods[0], *ip), "pod 0 -> pod {i} ({ip})");
    }

    // And 50 DELs at once free all of it.
    let procs: Vec<CniProcess> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            agent
                .spawn_cni(
                    &CniCall::new("DEL", &container_id(&format!("fifty{i}"))).netns(pod.path()),
                )
                .unwrap()
        })
        .collect();
    for (ok, out) in wait_all(procs) {
        assert!(ok, "DEL failed: {out}");
    }
    assert_eq!(used(&agent), 0);
    assert!(agent.endpoints().unwrap().is_empty());
    assert!(lxc_links(&agent).is_empty());
}

#[test]
fn an_agent_killed_in_a_burst_of_adds_restarts_with_every_endpoint_whole_or_gone() {
    let _serial = serial();
    let mut agent = agent();
    const N: usize = 40;
    let pods = pods(N);
    let mut procs: Vec<Option<CniProcess>> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            Some(
                agent
                    .spawn_cni(
                        &CniCall::new("ADD", &container_id(&format!("kill{i}"))).netns(pod.path()),
                    )
                    .unwrap(),
            )
        })
        .collect();
    // Kill as soon as a few ADDs have been answered: the rest are in flight, some half-way.
    let began = Instant::now();
    while agent
        .endpoints()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["state"] == "ready")
        .count()
        < 3
    {
        assert!(began.elapsed() < Duration::from_secs(60), "no ADD finished");
        std::thread::sleep(Duration::from_millis(2));
    }
    agent.kill().unwrap();
    let outcomes: Vec<(bool, Value)> = procs
        .iter_mut()
        .map(|p| {
            let (status, out) = p.take().unwrap().wait().unwrap();
            (status.success(), out)
        })
        .collect();
    let failed: Vec<usize> = (0..N).filter(|i| !outcomes[*i].0).collect();
    assert!(!failed.is_empty(), "the kill landed after the burst");
    for i in &failed {
        let (code, msg) = cni_error(&outcomes[*i].1);
        assert_eq!(code, 11, "an interrupted ADD is 'try again later': {msg}");
    }

    agent.start().expect("restart");
    let endpoints = agent.endpoints().unwrap();
    let by_container: BTreeMap<String, &Value> = endpoints
        .iter()
        .map(|e| (e["container_id"].as_str().unwrap().to_string(), e))
        .collect();
    // Every answered ADD is there with the address it was given; no address twice.
    for (i, (ok, out)) in outcomes.iter().enumerate() {
        if *ok {
            let ep = by_container
                .get(&container_id(&format!("kill{i}")))
                .unwrap_or_else(|| panic!("answered ADD {i} lost"));
            assert_eq!(Some(ep_ip(ep)), result_ipv4(out));
        }
    }
    let ips: Vec<Ipv4Addr> = endpoints.iter().map(ep_ip).collect();
    assert_eq!(
        ips.iter().collect::<HashSet<_>>().len(),
        ips.len(),
        "{ips:?}"
    );
    // Leaked addresses are reclaimed: IPAM holds exactly the endpoints' addresses.
    let held = allocations(&agent);
    assert_eq!(
        held.keys().copied().collect::<BTreeSet<_>>(),
        ips.iter().copied().collect::<BTreeSet<_>>()
    );
    assert_eq!(used(&agent) as usize, endpoints.len());
    // Host ends exist for exactly the endpoints.
    let hosts: BTreeSet<String> = endpoints
        .iter()
        .map(|e| e["host_ifname"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(lxc_links(&agent), hosts);

    let reachable_from = endpoints
        .first()
        .and_then(|e| {
            pods.iter()
                .position(|p| p.path().display().to_string() == e["netns"])
        })
        .expect("at least the answered endpoints");
    for (i, pod) in pods.iter().enumerate() {
        match by_container.get(&container_id(&format!("kill{i}"))) {
            Some(ep) => {
                assert_eq!(ep["state"], "ready", "{ep}");
                let ip = ep_ip(ep);
                let addrs = pod
                    .ip(&["-4", "-o", "addr", "show", "dev", "eth0"])
                    .unwrap();
                assert!(addrs.contains(&format!("{ip}/32")), "pod {i}: {addrs}");
                if i != reachable_from {
                    assert!(
                        ping(&pods[reachable_from], ip),
                        "pod {i} ({ip}) unreachable"
                    );
                }
            }
            None => assert!(!has_eth0(pod), "pod {i} has an eth0 but no endpoint"),
        }
    }
    // The restart had debris to clear: records of creates the kill interrupted.
    let status = agent.cli_json(&["status"]).unwrap().to_string();
    let summary = status
        .split('"')
        .find(|s| s.contains("endpoints restored"))
        .unwrap_or_default()
        .to_string();
    eprintln!(
        "{} endpoints whole, {} cleanly absent, {} ADDs failed; restore: {summary}",
        endpoints.len(),
        N - endpoints.len(),
        failed.len()
    );
    assert!(!summary.contains(" 0 removed, 0 leftovers"), "{summary}");

    // The runtime's DEL of every failed ADD succeeds, and frees what the agent finished.
    for i in &failed {
        agent
            .del(&container_id(&format!("kill{}", *i)), &pods[*i].path())
            .expect("DEL of a failed ADD");
    }
    let answered = N - failed.len();
    assert_eq!(agent.endpoints().unwrap().len(), answered);
    assert_eq!(used(&agent) as usize, answered);

    // A new pod after the restart gets an address nobody holds.
    let current: HashSet<Ipv4Addr> = agent.endpoints().unwrap().iter().map(ep_ip).collect();
    let extra = NetNs::new().unwrap();
    let (ip, _) = agent.add(&extra, &container_id("kill99")).unwrap();
    assert!(!current.contains(&ip), "{ip} handed out twice");
    assert_eq!(used(&agent) as usize, answered + 1);
}

#[test]
fn a_restart_keeps_endpoints_and_a_tcp_stream_flowing() {
    let _serial = serial();
    let mut agent = agent();
    let pods = pods(2);
    let (ip1, _) = agent.add(&pods[0], &container_id("restart0")).unwrap();
    let (ip2, _) = agent.add(&pods[1], &container_id("restart1")).unwrap();
    let before: Vec<(Value, Value, Value)> = agent
        .endpoints()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].clone(),
                e["addresses"].clone(),
                e["host_ifname"].clone(),
            )
        })
        .collect();
    let _ = ip1;

    let server = TcpServer::start(&pods[1], SocketAddrV4::new(ip2, 8080), "pod1").unwrap();
    let stream = probe::tcp_connect(
        &pods[0],
        SocketAddrV4::new(ip2, 8080),
        Duration::from_secs(5),
    )
    .unwrap();
    let retrans_before = (
        pods[0].tcp_loss_retransmissions().unwrap(),
        pods[1].tcp_loss_retransmissions().unwrap(),
    );
    let drops_before = agent.datapath_drops().unwrap();
    let client = probe::EchoStream::start(stream);

    client.wait_rounds(FLOWING_ROUNDS);
    let down_at = Instant::now();
    let (status, _) = agent.stop().unwrap();
    assert!(status.success(), "{status}");
    client.wait_rounds(FLOWING_ROUNDS);
    agent.start().expect("restart");
    let up_at = Instant::now();
    client.wait_rounds(FLOWING_ROUNDS);
    let rounds = client.stop().expect("the stream broke");

    let after: Vec<(Value, Value, Value)> = agent
        .endpoints()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].clone(),
                e["addresses"].clone(),
                e["host_ifname"].clone(),
            )
        })
        .collect();
    assert_eq!(after, before, "endpoints not restored as they were");
    let status = agent.cli_json(&["status"]).unwrap().to_string();
    assert!(
        status.contains("2 endpoints restored, 0 removed"),
        "{status}"
    );

    // Bytes flowed before, while the agent was down, and after.
    assert!(rounds.iter().any(|t| *t < down_at), "nothing before");
    assert!(
        rounds.iter().any(|t| *t > down_at && *t < up_at),
        "nothing while the agent was down"
    );
    assert!(rounds.iter().any(|t| *t > up_at), "nothing after");
    let max_gap = probe::max_gap(&rounds);
    assert!(
        max_gap < Duration::from_millis(200),
        "stream stalled for {max_gap:?}"
    );
    assert!(server.received() >= rounds.len() as u64 * probe::ECHO_ROUND_BYTES as u64);
    let retrans_after = (
        pods[0].tcp_loss_retransmissions().unwrap(),
        pods[1].tcp_loss_retransmissions().unwrap(),
    );
    assert_eq!(
        retrans_after, retrans_before,
        "TCP retransmitted a lost segment"
    );
    assert_eq!(
        agent.datapath_drops().unwrap(),
        drops_before,
        "datapath drops"
    );
    assert_eq!(drops_before, 0);
}

/// `(module, hook)` of every "<phase> hook done" line of the log, in order.
fn hooks_done(log: &str, phase: &str) -> Vec<(String, String)> {
    let needle = format!("{phase} hook done");
    log.lines()
        .filter(|l| l.contains(&needle))
        .map(|l| {
            let field = |name: &str| {
                l.split(&format!("{name}="))
                    .nth(1)
                    .and_then(|rest| rest.split([' ', '}']).next())
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_string()
            };
            (field("module"), field("hook"))
        })
        .collect()
}

#[test]
fn sigterm_stops_the_agent_cleanly_and_in_reverse_start_order() {
    let _serial = serial();
    let mut agent = agent();
    let pod = NetNs::new().unwrap();
    agent.add(&pod, &container_id("term0")).unwrap();
    let (status, took) = agent.stop().unwrap();
    assert!(status.success(), "exit status {status}");
    assert_eq!(status.code(), Some(0));
    assert!(took < Duration::from_secs(1), "stopping took {took:?}");
    assert!(!agent.socket().exists(), "the API socket is left behind");

    let log = agent.log();
    let started = hooks_done(&log, "start");
    let stopped = hooks_done(&log, "stop");
    assert!(started.len() >= 5, "{log}");
    assert!(
        stopped.iter().any(|(_, h)| h == "serve-api")
            && stopped.iter().any(|(_, h)| h == "lock-state-dir"),
        "{log}"
    );
    // Stop hooks are the started hooks that have one, in exactly the reverse order.
    let reversed: Vec<&(String, String)> = started
        .iter()
        .rev()
        .filter(|h| stopped.contains(h))
        .collect();
    assert_eq!(reversed, stopped.iter().collect::<Vec<_>>(), "{log}");
    assert_eq!(
        stopped.first().map(|(m, _)| m.as_str()),
        Some("api-server"),
        "the API stops first"
    );
    // And the pod's networking outlives the agent.
    assert!(has_eth0(&pod));
}

/// What a bad call must leave unchanged.
fn state(agent: &Agent, pod: &NetNs) -> (Vec<Value>, Vec<Value>, String, String) {
    (
        agent.pools().unwrap(),
        agent.endpoints().unwrap(),
        snapshot(pod),
        snapshot(agent.node()),
    )
}

#[test]
fn bad_input_is_refused_with_the_spec_code_and_changes_nothing() {
    let _serial = serial();
    let mut agent = agent();
    let pods = pods(2);
    agent.add(&pods[0], &container_id("bad0")).unwrap();
    let pod = &pods[1];
    let id = container_id("bad1");
    let add = || CniCall::new("ADD", &id).netns(pod.path());
    let cases: Vec<(&str, CniCall, u64, Vec<String>)> = vec![
        (
            "malformed JSON",
            add().stdin(r#"{"cniVersion": "1.0.0", "name": "#),
            6,
            vec!["not valid JSON".into(), "line 1".into()],
        ),
        (
            "missing variables",
            CniCall::new("ADD", &id).unset("CNI_CONTAINERID"),
            4,
            vec!["CNI_CONTAINERID".into(), "CNI_NETNS".into()],
        ),
        (
            "unsupported cniVersion",
            add().version("0.2.0"),
            1,
            vec!["\"0.2.0\"".into(), "1.1.0".into()],
        ),
        (
            "address outside the pod CIDR",
            add().args("IgnoreUnknown=1;IP=10.99.0.5"),
            101,
            vec!["10.99.0.5".into(), "10.244.0.0/24".into()],
        ),
        (
            "malformed address",
            add().args("IgnoreUnknown=1;IP=10.244.0.300"),
            4,
            vec!["IP=\"10.244.0.300\"".into()],
        ),
        (
            "malformed CIDR",
            add().args("IgnoreUnknown=1;IP=10.244.0.7/33"),
            4,
            vec!["10.244.0.7/33".into()],
        ),
    ];
    for (name, call, code, words) in cases {
        let before = state(&agent, pod);
        let (status, out) = agent.cni(&call).unwrap();
        assert!(!status.success(), "{name}: succeeded: {out}");
        let (got, msg) = cni_error(&out);
        assert_eq!(got, code, "{name}: {out}");
        for w in &words {
            assert!(msg.contains(w.as_str()), "{name}: {w:?} not in {msg:?}");
        }
        assert_eq!(state(&agent, pod), before, "{name} changed something");
    }

    // The agent not running: try again later, naming the socket.
    let before = state(&agent, pod);
    agent.stop().unwrap();
    let (status, out) = agent.cni(&add()).unwrap();
    assert!(!status.success());
    let (code, msg) = cni_error(&out);
    assert_eq!(code, 11, "{out}");
    assert!(msg.contains("not running"), "{msg}");
    assert!(msg.contains(&agent.socket().display().to_string()), "{msg}");
    agent.start().unwrap();
    assert_eq!(
        state(&agent, pod),
        before,
        "a call to a stopped agent changed something"
    );
}

#[test]
fn a_full_pool_refuses_the_sixth_pod_and_changes_nothing() {
    let _serial = serial();
    // A /29: network, broadcast and router leave five addresses for pods.
    let agent = Agent::start_new(AgentOptions::with_pod_cidr("10.244.7.0/29")).unwrap();
    let pods = pods(6);
    for (i, pod) in pods.iter().take(5).enumerate() {
        agent
            .add(pod, &container_id(&format!("full{i}")))
            .expect("one of the first five");
    }
    let before = state(&agent, &pods[5]);
    let (status, out) = agent
        .cni(&CniCall::new("ADD", &container_id("full5")).netns(pods[5].path()))
        .unwrap();
    assert!(!status.success(), "{out}");
    let (code, msg) = cni_error(&out);
    assert_eq!(code, 103, "{out}");
    assert!(
        msg.contains("10.244.7.0/29") && msg.contains("address pool exhausted"),
        "{msg}"
    );
    // The agent said why in its own terms, not only with a gRPC code.
    let details = out["details"].as_str().unwrap_or_default();
    assert!(details.contains("REASON_POOL_EXHAUSTED"), "{details}");
    assert_eq!(state(&agent, &pods[5]), before);
    assert!(!has_eth0(&pods[5]));
    assert_eq!(used(&agent), 5);
}

#[test]
fn a_malformed_pod_cidr_fails_the_start_naming_key_and_value() {
    let _serial = serial();
    let err = Agent::start_new(AgentOptions::with_pod_cidr("10.244.0.0/33"))
        .expect_err("started with a malformed --pod-cidr")
        .to_string();
    assert!(err.contains("exited"), "{err}");
    assert!(
        err.contains("--pod-cidr") && err.contains("10.244.0.0/33"),
        "{err}"
    );

    let opts = AgentOptions {
        pod_cidrs: Vec::new(),
        env: vec![("CELLIUM_POD_CIDR".into(), "[\"10.244.0.0/33\"]".into())],
        ..AgentOptions::default()
    };
    let err = Agent::start_new(opts)
        .expect_err("started with a malformed CELLIUM_POD_CIDR")
        .to_string();
    assert!(err.contains("exited"), "{err}");
    assert!(
        err.contains("pod-cidr") && err.contains("10.244.0.0/33"),
        "{err}"
    );
}

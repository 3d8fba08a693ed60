//! The endpoint manager's state under faults, with the real agent, kernel and datapath: a DEL
//! whose record cannot be written, a record that cannot be read at restart, a pod CIDR that
//! changed under running pods, a regeneration that fails on a full policy map.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test endpoints -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces and removes them (guards), and sends
//! traffic only to the pods' addresses inside them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use cellium_datapath_bpf::{Datapath, DatapathOptions, Direction, L4Match, PolicyEntry, Verdict};
use cellium_integration::probe::TcpServer;
use cellium_integration::reach::{self, Outcome, Probe};
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, ReadOnlyDir, probe, serial};
use serde_json::Value;

/// A container id unique to this test process.
fn cid(tag: &str) -> String {
    format!("{tag}x{}", std::process::id())
}

/// The endpoint of `container` as `cellium endpoint list -o json` shows it.
fn endpoint(agent: &Agent, container: &str) -> Option<Value> {
    agent
        .endpoints()
        .expect("endpoint list")
        .into_iter()
        .find(|e| e["container_id"] == container)
}

/// Who IPAM says holds `ip`.
fn holder(agent: &Agent, ip: Ipv4Addr) -> Option<String> {
    agent
        .pools()
        .expect("ipam list")
        .iter()
        .flat_map(|p| p["allocations"].as_array().cloned().unwrap_or_default())
        .find(|a| a["ip"] == ip.to_string())
        .and_then(|a| a["owner"].as_str().map(str::to_string))
}

/// The host ends of veth pairs in the node namespace ([`Agent::lxc_links`]).
fn lxc_links(agent: &Agent) -> std::collections::BTreeSet<String> {
    agent.lxc_links().expect("ip link")
}

/// The health node whose id ends with `suffix`, as (level, message).
fn health(agent: &Agent, suffix: &str) -> Option<(String, String)> {
    fn find(nodes: &[Value], suffix: &str) -> Option<(String, String)> {
        nodes.iter().find_map(|n| {
            if n["id"].as_str().is_some_and(|id| id.ends_with(suffix)) {
                return Some((
                    n["level"].as_str().unwrap_or_default().to_string(),
                    n["message"].as_str().unwrap_or_default().to_string(),
                ));
            }
            find(n["children"].as_array().map_or(&[], Vec::as_slice), suffix)
        })
    }
    let status = agent.cli_json(&["status"]).expect("status");
    find(status["modules"].as_array()?, suffix)
}

/// Polls `f` every 50 ms until it holds or `limit` passes; returns whether it held.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let began = Instant::now();
    while began.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
fn a_del_whose_record_cannot_be_written_changes_nothing_and_a_retried_del_removes_it() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let pod = NetNs::new().unwrap();
    let container = cid("rodel");
    let (ip, _) = agent.add(&pod, &container).unwrap();
    let host = endpoint(&agent, &container).unwrap()["host_ifname"]
        .as_str()
        .unwrap()
        .to_string();
    let router: Ipv4Addr = agent.pools().unwrap()[0]["router"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let records = agent.state_dir().join("endpoints");
    let readonly = ReadOnlyDir::new(&records).expect("make the records read-only");
    let (status, out) = agent
        .cni(&CniCall::new("DEL", &container).netns(pod.path()))
        .unwrap();
    assert!(!status.success(), "DEL must fail: {out}");
    assert!(out.to_string().contains("Read-only file system"), "{out}");
    // Nothing changed: ready, its address, its interfaces, its connectivity.
    let ep = endpoint(&agent, &container).expect("still there");
    assert_eq!(ep["state"], "ready", "{ep}");
    let owner = holder(&agent, ip).unwrap_or_default();
    assert!(
        owner.starts_with(&format!("endpoint {} ", ep["id"])),
        "{owner}"
    );
    assert!(lxc_links(&agent).contains(&host));
    assert!(
        probe::ping(&pod, router, 1).unwrap(),
        "the pod lost its network"
    );

    drop(readonly);
    agent.del(&container, &pod.path()).expect("the retried DEL");
    assert!(endpoint(&agent, &container).is_none());
    assert_eq!(holder(&agent, ip), None);
    assert!(!lxc_links(&agent).contains(&host));
    assert!(
        pod.ip(&["link", "show", "eth0"]).is_err(),
        "the pod's interface is gone"
    );
}

#[test]
fn an_unreadable_record_at_restart_leaves_its_pod_alone_and_the_module_degraded() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let pods: Vec<NetNs> = (0..2).map(|_| NetNs::new().unwrap()).collect();
    let (a, b) = (cid("unread-a"), cid("unread-b"));
    let (ip_a, _) = agent.add(&pods[0], &a).unwrap();
    let (ip_b, _) = agent.add(&pods[1], &b).unwrap();
    let ep_a = endpoint(&agent, &a).unwrap();
    let id_a = ep_a["id"].as_u64().unwrap();
    let host_a = ep_a["host_ifname"].as_str().unwrap().to_string();
    assert!(probe::ping(&pods[0], ip_b, 1).unwrap());

    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
    let file = agent.state_dir().join(format!("endpoints/{id_a}.json"));
    std::fs::write(&file, b"{\"id\": 1, \"state\": \"rea").unwrap();
    agent.start().expect("the agent starts");

    let (level, message) = health(&agent, "endpoint-manager.restore").expect("restore health");
    assert_eq!(level, "Degraded", "{message}");
    assert!(
        message.contains(&format!(
            "endpoint record endpoints/{id_a}.json cannot be read"
        )),
        "{message}"
    );
    let (level, _) = health(&agent, "endpoint-manager").unwrap();
    assert_eq!(level, "Degraded", "the module shows it");
    // The pod whose record is unreadable keeps its interface, its address and its traffic.
    assert!(
        lxc_links(&agent).contains(&host_a),
        "{:?}",
        lxc_links(&agent)
    );
    let addrs = pods[0]
        .ip(&["-4", "-o", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addrs.contains(&format!("{ip_a}/32")), "{addrs}");
    assert!(probe::ping(&pods[0], ip_b, 1).unwrap(), "a reaches b");
    assert!(probe::ping(&pods[1], ip_a, 1).unwrap(), "b reaches a");
    assert_eq!(
        holder(&agent, ip_a).as_deref(),
        Some(format!("endpoint {id_a} (record unreadable)").as_str())
    );
    assert!(endpoint(&agent, &b).is_some(), "b is restored");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"{\"id\": 1, \"state\": \"rea"
    );

    // A new pod gets neither its address nor its id.
    let c = NetNs::new().unwrap();
    let (ip_c, _) = agent.add(&c, &cid("unread-c")).unwrap();
    assert!(ip_c != ip_a && ip_c != ip_b, "{ip_c}");
    let ep_c = endpoint(&agent, &cid("unread-c")).unwrap();
    assert_ne!(ep_c["id"].as_u64(), Some(id_a));
    assert!(probe::ping(&c, ip_a, 1).unwrap(), "c reaches a");
}

#[test]
fn a_changed_pod_cidr_refuses_to_start_naming_the_endpoints_and_the_key_removes_them() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let pod = NetNs::new().unwrap();
    let container = cid("cidr");
    let (ip, _) = agent.add(&pod, &container).unwrap();
    let ep = endpoint(&agent, &container).unwrap();
    let host = ep["host_ifname"].as_str().unwrap().to_string();
    agent.stop().unwrap();

    agent.options_mut().pod_cidrs = vec!["10.245.0.0/24".into()];
    let err = agent.start().expect_err("the start is refused").to_string();
    assert!(
        err.contains(&format!(
            "restored endpoints hold addresses outside the configured pod CIDRs (10.245.0.0/24): endpoint {} (container {}) at {ip}",
            ep["id"],
            &container[..container.len().min(12)]
        )),
        "{err}"
    );
    assert!(err.contains("remove-endpoints-outside-pod-cidr"), "{err}");
    // The pod kept everything.
    assert!(lxc_links(&agent).contains(&host));
    let addrs = pod
        .ip(&["-4", "-o", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addrs.contains(&format!("{ip}/32")), "{addrs}");
    assert!(
        agent
            .state_dir()
            .join(format!("endpoints/{}.json", ep["id"]))
            .exists()
    );

    agent.options_mut().env.push((
        "CELLIUM_REMOVE_ENDPOINTS_OUTSIDE_POD_CIDR".into(),
        "true".into(),
    ));
    agent.start().expect("the key lets it start");
    assert!(agent.endpoints().unwrap().is_empty());
    assert!(lxc_links(&agent).is_empty(), "{:?}", lxc_links(&agent));
    assert!(
        pod.ip(&["link", "show", "eth0"]).is_err(),
        "the pod's interface is removed"
    );
    let (level, message) = health(&agent, "endpoint-manager").unwrap();
    assert_eq!(level, "OK", "{message}");
    // New pods get addresses of the new CIDR.
    let (new_ip, _) = agent.add(&NetNs::new().unwrap(), &cid("cidr-new")).unwrap();
    assert!(new_ip.to_string().starts_with("10.245.0."), "{new_ip}");
}

const PODS: &str = "apiVersion: v1
kind: Pod
metadata: {name: a, namespace: default, labels: {app: a}}
spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: default, labels: {app: b}}
spec: {containers: [{name: c, ports: [{containerPort: 8080}]}]}
";

/// b accepts only TCP 80 from 192.0.2.0/24: a's connections to b are dropped once it holds.
const ONLY_FROM_TEST_NET: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-test-net, namespace: default}
spec:
  podSelector: {matchLabels: {app: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 192.0.2.0/24}}]
    ports: [{port: 80, protocol: TCP}]
";

#[test]
fn a_regeneration_that_fails_on_a_full_policy_map_is_retried_until_it_succeeds() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    agent.objects("apply", PODS).expect("apply the pods");
    let pods: Vec<NetNs> = (0..2).map(|_| NetNs::new().unwrap()).collect();
    let ip_a = agent
        .add_pod(&pods[0], &cid("full-a"), "default", "a")
        .unwrap();
    let ip_b = agent
        .add_pod(&pods[1], &cid("full-b"), "default", "b")
        .unwrap();
    let id_b = endpoint(&agent, &cid("full-b")).unwrap()["id"].clone();
    let _server = TcpServer::start(&pods[1], SocketAddrV4::new(ip_b, 8080), "b").unwrap();
    let a_to_b = || {
        reach::probe(
            &pods[0],
            Some(ip_a.into()),
            ip_b,
            Probe::Tcp(8080),
            Duration::from_millis(500),
        )
        .unwrap()
    };
    assert_eq!(a_to_b(), Outcome::Answered);

    // Fill b's own policy map to its last entry with egress entries (b enforces no egress,
    // so they change nothing), as a policy grown past the map's size would.
    let dp = Datapath::open(DatapathOptions {
        bpf_root: agent.bpf_root(),
        ..DatapathOptions::default()
    })
    .expect("open the agent's datapath");
    let own: u16 = id_b
        .as_u64()
        .and_then(|i| u16::try_from(i).ok())
        .expect("b's id");
    let mut fillers = Vec::new();
    for identity in 1u32.. {
        let entry = PolicyEntry {
            endpoint_id: own,
            direction: Direction::Egress,
            identity,
            l4: L4Match::Any,
        };
        if dp.policy().put(&entry, Verdict::Allow).is_err() {
            break;
        }
        fillers.push(entry);
    }
    assert!(
        fillers.len() > 1000,
        "the map took only {} entries",
        fillers.len()
    );

    agent
        .objects("apply", ONLY_FROM_TEST_NET)
        .expect("apply the policy");
    let mut seen = String::new();
    let degraded = eventually(Duration::from_secs(20), || {
        let (level, message) = health(&agent, "endpoint-manager.regenerate").unwrap_or_default();
        seen = message.clone();
        level == "Degraded" && message.contains("retrying in")
    });
    assert!(degraded, "never Degraded: {seen}");
    eprintln!("{} filler entries; while full: {seen}", fillers.len());
    assert!(
        seen.contains(&format!("endpoint {id_b} (default/b): ")),
        "{seen}"
    );
    assert!(seen.contains("cel_policy"), "{seen}");
    assert_eq!(
        a_to_b(),
        Outcome::Answered,
        "the old policy holds meanwhile"
    );

    // Room again: nothing else changes, the retry alone enforces the policy.
    for entry in &fillers {
        dp.policy().delete(entry).expect("remove a filler");
    }
    let healed = eventually(Duration::from_secs(60), || {
        let (level, message) = health(&agent, "endpoint-manager.regenerate").unwrap_or_default();
        seen = message;
        level == "OK"
    });
    assert!(healed, "the retry never succeeded: {seen}");
    eprintln!("after the fillers went: {seen}");
    let ep = endpoint(&agent, &cid("full-b")).unwrap();
    assert_eq!(ep["ingress_enforced"], true, "{ep}");
    assert_eq!(a_to_b(), Outcome::Dropped, "the policy is enforced");
}

const TENANT_PODS: &str = "apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default, labels: {app: client}}
spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: small, namespace: default, labels: {app: small}}
spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: late, namespace: default, labels: {app: small}}
spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: big, namespace: default, labels: {app: big}}
spec: {containers: [{name: c}]}
";

/// A NetworkPolicy letting anyone into `app` on `ports` (each its own policy map entry).
fn ingress_ports(app: &str, ports: &[u16]) -> String {
    let list: Vec<String> = ports.iter().map(|p| format!("{{port: {p}}}")).collect();
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {app}, namespace: default}}\nspec:\n  podSelector: {{matchLabels: {{app: {app}}}}}\n  policyTypes: [Ingress]\n  ingress: [{{ports: [{}]}}]\n",
        list.join(", ")
    )
}

/// `n` ports from 1000, two apart: no two merge into one port block.
fn spread_ports(n: u16) -> Vec<u16> {
    (0..n).map(|i| 1000 + 2 * i).collect()
}

/// The per-endpoint limit the test agent runs with.
const POLICY_MAP_MAX: u16 = 64;

#[test]
fn a_policy_over_the_per_endpoint_limit_locks_its_endpoint_alone_down() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions {
        env: vec![(
            "CELLIUM_BPF_POLICY_MAP_MAX".into(),
            POLICY_MAP_MAX.to_string(),
        )],
        ..AgentOptions::default()
    })
    .expect("start the agent");
    agent.objects("apply", TENANT_PODS).expect("apply the pods");
    let ns: Vec<NetNs> = (0..4).map(|_| NetNs::new().unwrap()).collect();
    let client = agent
        .add_pod(&ns[0], &cid("tenant-client"), "default", "client")
        .unwrap();
    let small = agent
        .add_pod(&ns[1], &cid("tenant-small"), "default", "small")
        .unwrap();
    let big = agent
        .add_pod(&ns[2], &cid("tenant-big"), "default", "big")
        .unwrap();
    let id_big = endpoint(&agent, &cid("tenant-big")).unwrap()["id"].clone();
    let _servers: Vec<TcpServer> = [(&ns[1], small, 1000), (&ns[1], small, 1002)]
        .into_iter()
        .chain([(&ns[2], big, 1000)])
        .map(|(ns, ip, port)| TcpServer::start(ns, SocketAddrV4::new(ip, port), "s").unwrap())
        .collect();
    let probe = |ip: Ipv4Addr, port: u16| {
        reach::probe(
            &ns[0],
            Some(client.into()),
            ip,
            Probe::Tcp(port),
            Duration::from_millis(500),
        )
        .unwrap()
    };

    agent
        .apply_policy(&ingress_ports("small", &[1000]))
        .expect("the small policy");
    assert_eq!(probe(small, 1002), Outcome::Dropped);
    let before = agent.policy_revision().unwrap();
    agent
        .objects(
            "apply",
            &ingress_ports("big", &spread_ports(POLICY_MAP_MAX + 36)),
        )
        .expect("apply the policy over the limit");
    agent.wait_policy_revision_after(before).unwrap();

    // The other tenant's policy changes still apply, and a new pod's ADD works.
    agent
        .objects("apply", &ingress_ports("small", &[1000, 1002]))
        .expect("apply a change of the small policy");
    let applied = eventually(Duration::from_secs(20), || {
        probe(small, 1002) == Outcome::Answered
    });
    assert!(applied, "the other tenant's change never applied");
    assert_eq!(probe(small, 1000), Outcome::Answered);
    let late = agent
        .add_pod(&ns[3], &cid("tenant-late"), "default", "late")
        .expect("a new pod's ADD");
    let _late_server = TcpServer::start(&ns[3], SocketAddrV4::new(late, 1000), "late").unwrap();
    assert_eq!(probe(late, 1000), Outcome::Answered);
    assert_eq!(probe(late, 1004), Outcome::Dropped, "its policy applies");
    agent
        .settle()
        .expect("every endpoint enforces the current revision");
    let (level, message) = health(&agent, "endpoint-manager.regenerate").unwrap_or_default();
    assert_eq!(level, "OK", "{message}");

    // The endpoint over the limit is closed both ways, and says why.
    assert_eq!(probe(big, 1000), Outcome::Dropped, "locked down");
    let ep = endpoint(&agent, &cid("tenant-big")).unwrap();
    assert_eq!(ep["ingress_enforced"], true, "{ep}");
    assert_eq!(ep["egress_enforced"], true, "{ep}");
    let why = ep["status_message"].as_str().unwrap_or_default();
    assert!(
        why.starts_with(&format!(
            "locked down: its policy needs 101 policy map entries, more than bpf-policy-map-max ({POLICY_MAP_MAX})"
        )),
        "{ep}"
    );
    let (level, message) = health(&agent, "endpoint-manager.policy-maps").unwrap_or_default();
    assert_eq!(level, "OK", "new pods' ADD is not stopped: {message}");
    assert!(
        message.contains(&format!("endpoint {id_big} needs 101")),
        "{message}"
    );
    let metrics = agent.metrics().expect("metrics");
    assert!(
        metrics.contains("cellium_endpoint_policy_map_overflow 1\n"),
        "{metrics}"
    );

    // The policy shrinks under the limit: the endpoint enforces it.
    agent
        .apply_policy(&ingress_ports("big", &spread_ports(10)))
        .expect("the shrunk policy");
    assert_eq!(probe(big, 1000), Outcome::Answered, "unlocked");
    let ep = endpoint(&agent, &cid("tenant-big")).unwrap();
    assert_eq!(ep["egress_enforced"], false, "{ep}");
    assert!(ep.get("status_message").is_none(), "{ep}");
    let (_, message) = health(&agent, "endpoint-manager.policy-maps").unwrap_or_default();
    assert!(
        message.starts_with("every endpoint's policy fits"),
        "{message}"
    );
    let metrics = agent.metrics().expect("metrics");
    assert!(
        metrics.contains("cellium_endpoint_policy_map_overflow 0\n"),
        "{metrics}"
    );
}

/// Endpoints whose policies each fill their own map to the per-endpoint limit.
const FULL_TENANTS: usize = 4;

#[test]
fn endpoints_each_at_the_per_endpoint_limit_all_enforce_their_policy() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions {
        env: vec![(
            "CELLIUM_BPF_POLICY_MAP_MAX".into(),
            POLICY_MAP_MAX.to_string(),
        )],
        ..AgentOptions::default()
    })
    .expect("start the agent");
    let apps: Vec<String> = (0..FULL_TENANTS).map(|i| format!("full{i}")).collect();
    let pods: Vec<String> = std::iter::once("client".to_string())
        .chain(apps.iter().cloned())
        .map(|app| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {app}, namespace: default, labels: {{app: {app}}}}}\nspec: {{containers: [{{name: c}}]}}\n"
            )
        })
        .collect();
    agent
        .objects("apply", &pods.join("---\n"))
        .expect("apply the pods");
    let ns: Vec<NetNs> = (0..=FULL_TENANTS).map(|_| NetNs::new().unwrap()).collect();
    let client = agent
        .add_pod(&ns[0], &cid("limit-client"), "default", "client")
        .unwrap();
    // One port under the limit's worth: with the entry every policy has, each map is full.
    let ports = spread_ports(POLICY_MAP_MAX - 1);
    let last = *ports.last().unwrap();
    let mut servers = Vec::new();
    let mut tenants = Vec::new();
    for (i, app) in apps.iter().enumerate() {
        let ip = agent
            .add_pod(&ns[i + 1], &cid(&format!("limit-{app}")), "default", app)
            .unwrap();
        for port in [1000, last, last + 2] {
            servers.push(TcpServer::start(&ns[i + 1], SocketAddrV4::new(ip, port), "s").unwrap());
        }
        agent
            .apply_policy(&ingress_ports(app, &ports))
            .expect("apply the policy at the limit");
        tenants.push((app, ip));
    }

    let dp = Datapath::open(DatapathOptions {
        bpf_root: agent.bpf_root(),
        ..DatapathOptions::default()
    })
    .expect("open the agent's datapath");
    for (app, ip) in &tenants {
        let ep = endpoint(&agent, &cid(&format!("limit-{app}"))).unwrap();
        assert!(ep.get("status_message").is_none(), "not locked down: {ep}");
        let id = ep["id"]
            .as_u64()
            .and_then(|i| u16::try_from(i).ok())
            .unwrap();
        let held = dp.policy().endpoint_entries(id).unwrap().len();
        assert_eq!(held, usize::from(POLICY_MAP_MAX), "{app}'s own map is full");
        assert_eq!(
            dp.policy().endpoint_map_max(id).unwrap(),
            Some(u32::from(POLICY_MAP_MAX)),
            "{app}'s map is the limit's size"
        );
        let probe = |port: u16| {
            reach::probe(
                &ns[0],
                Some(client.into()),
                *ip,
                Probe::Tcp(port),
                Duration::from_millis(500),
            )
            .unwrap()
        };
        assert_eq!(probe(1000), Outcome::Answered, "{app}");
        assert_eq!(probe(last), Outcome::Answered, "{app}");
        assert_eq!(probe(last + 2), Outcome::Dropped, "{app}");
    }
    // A change of a full map's policy applies: revocations make the room for the new entries.
    let (app, ip) = tenants[0];
    let mut moved = ports.clone();
    moved[0] = last + 2;
    agent
        .apply_policy(&ingress_ports(app, &moved))
        .expect("move a port of a full policy");
    let probe = |port: u16| {
        reach::probe(
            &ns[0],
            Some(client.into()),
            ip,
            Probe::Tcp(port),
            Duration::from_millis(500),
        )
        .unwrap()
    };
    assert_eq!(probe(last + 2), Outcome::Answered);
    assert_eq!(probe(1000), Outcome::Dropped);
    let (level, message) = health(&agent, "endpoint-manager.regenerate").unwrap_or_default();
    assert_eq!(level, "OK", "{message}");
}

#[test]
fn the_policy_map_of_an_endpoint_gone_while_the_agent_was_down_is_removed_at_restore() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    agent.objects("apply", PODS).expect("apply the pods");
    let pod = NetNs::new().unwrap();
    agent.add_pod(&pod, &cid("gone-a"), "default", "a").unwrap();
    let id = endpoint(&agent, &cid("gone-a")).unwrap()["id"]
        .as_u64()
        .and_then(|i| u16::try_from(i).ok())
        .expect("a's id");
    agent.stop().expect("stop the agent");

    // A map of an endpoint the agent has no record of, empty as a new endpoint's is.
    let stray = 4242;
    let bpf_root = agent.bpf_root();
    let open = || {
        Datapath::open(DatapathOptions {
            bpf_root: bpf_root.clone(),
            ..DatapathOptions::default()
        })
        .expect("open the agent's datapath")
    };
    open().policy().sync_endpoint(stray, &[]).unwrap();
    let pin = bpf_root.join(format!("maps/cel_policy_{stray}"));
    assert!(pin.exists());

    agent.start().expect("restart the agent");
    let mut ids = Vec::new();
    let swept = eventually(Duration::from_secs(20), || {
        ids = open().policy().endpoint_ids().unwrap();
        !ids.contains(&stray)
    });
    assert!(swept, "the stray map is still there: {ids:?}");
    assert!(
        ids.contains(&id),
        "the restored endpoint keeps its map: {ids:?}"
    );
    assert!(!pin.exists());
}

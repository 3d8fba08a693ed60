//! Three nodes in kvstore mode: three real agents in three node namespaces, joined by an
//! underlay the test makes (a bridge in a switch namespace, the nodes at 192.0.2.1-3), one test
//! API server served on each node's loopback (pods, nodes, policies), and a real etcd on the
//! switch (192.0.2.254) for identities and ip entries (`identity-allocation-mode: kvstore`).
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test kvstore_cluster -- --test-threads=1`.
//!
//! Every test makes its own namespaces, agents, API server and etcd and removes them through
//! guards; traffic goes only to addresses inside the namespaces it made.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use cellium_integration::k8s::node_yaml;
use cellium_integration::probe::TcpServer;
use cellium_integration::reach::{Outcome, Probe, probe};
use cellium_integration::shop::{CLIENT_TO_WEB_HTTP, WEB_FROM_CLIENT};
use cellium_integration::{Agent, AgentOptions, Etcd, K8sApi, NetNs, wait};
use cellium_kvstore::keys;

const PORT: u16 = 8080;
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);
/// Short, so that a dead node is forgotten within the test.
const LEASE_TTL: &str = "4s";
const ALLOCATION_TIMEOUT: &str = "3s";

/// The Nodes n1, n2 and n3: pod CIDR `10.245.2<i>.0/24`, address `192.0.2.<i>`.
fn nodes() -> String {
    (1..=3)
        .map(|i| {
            node_yaml(
                &format!("n{i}"),
                &format!("10.245.2{i}.0/24"),
                &[("InternalIP", &format!("192.0.2.{i}"))],
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn pod(name: &str, node: &str, app: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: shop, labels: {{ app: {app} }} }}
spec: {{ nodeName: {node}, containers: [ {{ name: c, image: x, ports: [ {{ name: http, containerPort: {PORT} }} ] }} ] }}
"#
    )
}

/// `cellium-operator` with `kvstore: etcd` in a node's namespace (its GC every 500 ms),
/// killed on drop; its log is printed then.
struct KvOperator {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl KvOperator {
    fn start(node: &Agent, api: &K8sApi, etcd: &Etcd) -> KvOperator {
        let program = node.binaries().dir().join("cellium-operator");
        let log = node.state_dir().with_file_name("kvstore-operator.log");
        let out = std::fs::File::create(&log).expect("operator log");
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net={}", node.node().path().display()))
            .arg("--")
            .arg(&program)
            .args([
                "run",
                "--k8s-api-server",
                &api.url(),
                "--operator-id",
                "op-1",
            ])
            .env("CELLIUM_KVSTORE", "etcd")
            .env("CELLIUM_KVSTORE_ENDPOINTS", etcd.url())
            .env("CELLIUM_IDENTITY_GC_INTERVAL", "500ms")
            .env("CELLIUM_LEADER_ELECTION_LEASE_DURATION", "3s")
            .env("CELLIUM_LEADER_ELECTION_RENEW_DEADLINE", "2s")
            .env("CELLIUM_LEADER_ELECTION_RETRY_PERIOD", "200ms")
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start cellium-operator");
        KvOperator { child, log }
    }
}

impl Drop for KvOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- operator log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// The underlay: a bridge in `switch` (192.0.2.254, where etcd listens) and a veth from it to
/// each node (`und` at 192.0.2.<i+1>).
fn underlay(switch: &NetNs, nodes: &[&NetNs]) {
    switch
        .ip(&["link", "add", "br0", "type", "bridge"])
        .expect("bridge");
    switch
        .ip(&["addr", "add", "192.0.2.254/24", "dev", "br0"])
        .expect("addr");
    switch.ip(&["link", "set", "br0", "up"]).expect("up");
    for (i, node) in nodes.iter().enumerate() {
        let port = format!("port{i}");
        switch
            .ip(&[
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "und",
                "netns",
                node.name(),
            ])
            .expect("underlay veth");
        switch
            .ip(&["link", "set", &port, "master", "br0", "up"])
            .expect("port up");
        node.ip(&[
            "addr",
            "add",
            &format!("192.0.2.{}/24", i + 1),
            "dev",
            "und",
        ])
        .expect("addr");
        node.ip(&["link", "set", "und", "up"]).expect("up");
    }
}

/// Nodes n1, n2, ... in kvstore mode: etcd on the switch, the test API server (on node 1)
/// served on every node, the Nodes of [`nodes`]. Bound field by field in this order, the agents
/// drop last.
struct KvNodes<const N: usize> {
    agents: [Agent; N],
    switch: NetNs,
    etcd: Etcd,
    api: K8sApi,
}

impl<const N: usize> KvNodes<N> {
    /// Applies the Pod objects `pods` (name, node name, app) in namespace `shop`, then starts
    /// every agent with the settings `extra`.
    fn start(pods: &[(&str, &str, &str)], extra: &[(&str, &str)]) -> KvNodes<N> {
        let mut agents: [Agent; N] = std::array::from_fn(|i| {
            Agent::prepare(AgentOptions {
                pod_cidrs: Vec::new(),
                ..AgentOptions::default()
            })
            .unwrap_or_else(|e| panic!("node {}: {e}", i + 1))
        });
        let switch = NetNs::new().expect("switch");
        underlay(&switch, &agents.each_ref().map(Agent::node));
        let etcd = Etcd::start(&switch, "192.0.2.254".parse().unwrap()).expect("etcd");
        let api = K8sApi::start(agents[0].node()).expect("API server");
        for agent in &agents[1..] {
            api.serve_on(agent.node()).expect("served on the node");
        }
        api.api().apply_yaml(&nodes()).expect("nodes");
        let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: { name: shop }\n");
        for (name, node, app) in pods {
            yaml.push_str("---\n");
            yaml.push_str(&pod(name, node, app));
        }
        api.apply(&yaml).expect("pods");
        for (i, agent) in agents.iter_mut().enumerate() {
            start_in_kvstore_mode(agent, &format!("n{}", i + 1), &api, &etcd, extra);
        }
        KvNodes {
            agents,
            switch,
            etcd,
            api,
        }
    }
}

/// Pod `name` of `shop` made on `agent` through the CNI (container `cid-<name>`): its
/// namespace and address.
fn add_pod(agent: &Agent, name: &str) -> (NetNs, Ipv4Addr) {
    let ns = NetNs::new().expect("netns");
    let ip = agent
        .add_pod(&ns, &format!("cid-{name}"), "shop", name)
        .unwrap_or_else(|e| panic!("ADD {name}: {e}"));
    (ns, ip)
}

/// Applies `yaml` and waits until each of `agents` enforces it.
fn apply_policy(api: &K8sApi, agents: &[&Agent], yaml: &str) {
    let before: Vec<u64> = agents
        .iter()
        .map(|a| a.policy_revision().expect("revision"))
        .collect();
    api.apply(yaml).expect("policy");
    for (agent, before) in agents.iter().zip(before) {
        agent.wait_policy_revision_after(before).expect("taken in");
        agent.settle().expect("enforced");
    }
}

fn reaches(from: &NetNs, ip: Ipv4Addr) -> bool {
    matches!(
        probe(from, None, ip, Probe::Tcp(PORT), PROBE_TIMEOUT),
        Ok(Outcome::Answered)
    )
}

fn eventually(what: &str, agents: &[&Agent], ok: impl FnMut() -> bool) {
    let logs = || {
        agents
            .iter()
            .map(|a| a.log())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    wait::eventually_or(what, logs, ok);
}

/// The identity `ip` has in `agent`'s ipcache, with its source.
fn ipcache_entry(agent: &Agent, ip: Ipv4Addr) -> Option<String> {
    let list = agent.cli(&["ipcache", "list"]).ok()?;
    list.lines()
        .find(|l| l.starts_with(&format!("{ip}/32")))
        .map(String::from)
}

/// The `ID` of `ip`'s entry in etcd.
fn etcd_id(etcd: &Etcd, ip: Ipv4Addr) -> Option<u64> {
    let out = etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("cilium/state/ip/v1/default/{ip}"),
        ])
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).ok()?;
    v["ID"].as_u64()
}

#[test]
fn three_nodes_share_identities_and_ip_entries_through_etcd_and_survive_its_faults() {
    let KvNodes {
        agents: [mut one, two, mut three],
        switch: _switch,
        etcd,
        api,
    } = KvNodes::start(
        &[
            ("client", "n1", "client"),
            ("other", "n1", "other"),
            ("web", "n2", "web"),
            ("client3", "n3", "client"),
            ("late", "n1", "client"),
            ("new1", "n1", "brand-new"),
            ("slow", "n1", "client"),
        ],
        &[
            ("CELLIUM_KVSTORE_LEASE_TTL", LEASE_TTL),
            ("CELLIUM_KVSTORE_ALLOCATION_TIMEOUT", ALLOCATION_TIMEOUT),
        ],
    );
    let (client_ns, client) = add_pod(&one, "client");
    let (other_ns, _other) = add_pod(&one, "other");
    let (web_ns, web) = add_pod(&two, "web");
    let (client3_ns, client3) = add_pod(&three, "client3");
    let _server =
        TcpServer::start(&web_ns, SocketAddr::new(IpAddr::V4(web), PORT), "web").expect("server");

    // Identities and ip entries are in etcd, in Cilium's layout; the API server has no
    // CiliumEndpoints nor CiliumIdentities.
    eventually("ip entries in etcd", &[&one, &two, &three], || {
        [client, web, client3]
            .iter()
            .all(|ip| etcd_id(&etcd, *ip).is_some())
    });
    let client_id = etcd_id(&etcd, client).unwrap();
    assert_eq!(
        etcd_id(&etcd, client3),
        Some(client_id),
        "the same labels on two nodes: one number"
    );
    let id_value = etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("cilium/state/identities/v1/id/{client_id}"),
        ])
        .unwrap();
    let id_value = id_value.trim();
    assert!(
        id_value.starts_with("k8s:app=client;")
            && id_value.contains("k8s:io.kubernetes.pod.namespace=shop;")
            && id_value.ends_with(';'),
        "{id_value}"
    );
    assert!(api.api().list("cilium.io/v2", "CiliumEndpoint").is_empty());
    assert!(api.api().list("cilium.io/v2", "CiliumIdentity").is_empty());

    // Each node is in etcd with its address and pod CIDR, on its lease; a node known only
    // there is routed to and in the ipcache, and forgotten when its entry goes.
    eventually("node entries in etcd", &[&one, &two, &three], || {
        (1..=3).all(|i| {
            node_entry(&etcd, &format!("n{i}")).is_some_and(|e| {
                e.contains(&format!(r#"{{"Type":"InternalIP","IP":"192.0.2.{i}"}}"#))
                    && e.contains(&format!(
                        r#""IPv4AllocCIDR":{{"IP":"10.245.2{i}.0","Mask":"////AA=="}}"#
                    ))
            })
        })
    });
    etcd.etcdctl(&[
        "put",
        "cilium/state/nodes/v1/default/n9",
        r#"{"Name":"n9","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"192.0.2.9"}],"IPv4AllocCIDR":{"IP":"10.245.29.0","Mask":"////AA=="}}"#,
    ])
    .unwrap();
    let routes_of = |agent: &Agent| {
        agent
            .node()
            .ip(&["route", "show", "proto", "206"])
            .unwrap_or_default()
    };
    eventually("node 1 routes to n9's pods", &[&one, &two, &three], || {
        routes_of(&one).contains("10.245.29.0/24 via 192.0.2.9")
    });
    assert!(
        ipcache_entry(&one, "192.0.2.9".parse().unwrap()).is_some_and(|l| l.contains("remote")),
        "n9's address is a remote node's"
    );
    etcd.etcdctl(&["del", "cilium/state/nodes/v1/default/n9"])
        .unwrap();
    eventually("node 1 forgets n9", &[&one, &two, &three], || {
        !routes_of(&one).contains("10.245.29.0/24")
    });

    // Each node knows the others' pods by identity, from etcd.
    eventually(
        "node 2 has node 1's client as remote",
        &[&one, &two, &three],
        || {
            ipcache_entry(&two, client)
                .is_some_and(|l| l.contains("remote") && l.contains(&client_id.to_string()))
        },
    );
    eventually(
        "client reaches web on node 2",
        &[&one, &two, &three],
        || reaches(&client_ns, web),
    );
    assert!(reaches(&other_ns, web), "no policy yet");

    // A policy on node 2 selects node 1's and node 3's pods by their labels.
    apply_policy(&api, &[&two], WEB_FROM_CLIENT);
    eventually("other is denied", &[&one, &two, &three], || {
        !reaches(&other_ns, web)
    });
    assert!(reaches(&client_ns, web), "client is allowed");
    eventually("client on node 3 is allowed", &[&one, &two, &three], || {
        reaches(&client3_ns, web)
    });

    // An egress rule of node 1's client naming a port: the number is the remote web pod's,
    // from its ip entry's named ports (no pod on node 1 has them).
    apply_policy(&api, &[&one], CLIENT_TO_WEB_HTTP);
    eventually(
        "client reaches web by its port's name",
        &[&one, &two, &three],
        || reaches(&client_ns, web),
    );

    // The operator's GC on this etcd: an identity no node uses goes (in two rounds), those in
    // use stay.
    let _operator = KvOperator::start(&one, &api, &etcd);
    let ghost = "cilium/state/identities/v1/id/65000";
    etcd.etcdctl(&["put", ghost, "k8s:app=ghost;"])
        .expect("put");
    eventually(
        "the operator deletes the unused identity",
        &[&one, &two, &three],
        || {
            etcd.etcdctl(&["get", "--print-value-only", ghost])
                .is_ok_and(|v| v.trim().is_empty())
        },
    );
    let in_use = format!("cilium/state/identities/v1/id/{client_id}");
    let kept = etcd
        .etcdctl(&["get", "--print-value-only", &in_use])
        .unwrap();
    assert!(kept.starts_with("k8s:app=client;"), "{kept}");

    // etcd killed: cached state keeps being enforced; a pod whose labels have a number
    // works; a pod with new labels fails its ADD within the allocation timeout, naming etcd.
    etcd.kill();
    assert!(reaches(&client_ns, web), "still allowed without etcd");
    assert!(!reaches(&other_ns, web), "still denied without etcd");
    let late_ns = NetNs::new().expect("netns");
    let late = one
        .add_pod(&late_ns, "cid-late", "shop", "late")
        .expect("a pod with known labels works without etcd");
    let new_ns = NetNs::new().expect("netns");
    let err = one
        .add_pod(&new_ns, "cid-new1", "shop", "new1")
        .expect_err("new labels without etcd");
    let text = err.to_string();
    assert!(
        text.contains("etcd") && text.contains("kvstore-allocation-timeout"),
        "{text}"
    );
    let status = one.cli(&["status"]).expect("status");
    assert!(status.contains("kvstore etcd unreachable"), "{status}");

    // etcd back: everything converges; the pod with new labels gets its number.
    etcd.restart().expect("etcd restarts");
    eventually(
        "the late pod's entry reaches etcd",
        &[&one, &two, &three],
        || etcd_id(&etcd, late) == Some(client_id),
    );
    eventually("new labels are numbered", &[&one, &two, &three], || {
        one.add_pod(&new_ns, "cid-new1", "shop", "new1").is_ok()
    });
    eventually("late client reaches web", &[&one, &two, &three], || {
        reaches(&late_ns, web)
    });
    let status = one.cli(&["status"]).expect("status");
    assert!(status.contains("kvstore etcd connected"), "{status}");

    // Someone deletes node 1's entry: node 1 writes it again.
    etcd.etcdctl(&["del", &format!("cilium/state/ip/v1/default/{client}")])
        .unwrap();
    eventually(
        "client's entry written again",
        &[&one, &two, &three],
        || etcd_id(&etcd, client) == Some(client_id),
    );

    // etcd answering nothing for a while (paused: every request waits, as with an etcd too
    // busy to answer): enforcement goes on, a pod whose labels have a number comes up, and its
    // entry reaches etcd once it answers again.
    etcd.pause();
    assert!(reaches(&client_ns, web), "still allowed while etcd waits");
    assert!(!reaches(&other_ns, web), "still denied while etcd waits");
    let slow_ns = NetNs::new().expect("netns");
    let slow = one
        .add_pod(&slow_ns, "cid-slow", "shop", "slow")
        .expect("a pod with known labels works while etcd waits");
    etcd.resume();
    eventually(
        "the slow pod's entry reaches etcd",
        &[&one, &two, &three],
        || etcd_id(&etcd, slow) == Some(client_id),
    );

    // An agent restart keeps its identities and ip entries.
    one.stop().expect("agent 1 stops");
    assert_eq!(
        etcd_id(&etcd, client),
        Some(client_id),
        "kept while it is down"
    );
    one.start().expect("agent 1 again");
    eventually(
        "client keeps its entry after the restart",
        &[&one, &two, &three],
        || etcd_id(&etcd, client) == Some(client_id),
    );
    assert!(
        reaches(&client_ns, web),
        "client still allowed after the restart"
    );

    // Node 3 cut off from etcd by its underlay (a blackhole route to etcd's address): it
    // says so, keeps enforcing; once the partition heals it converges (its entries written
    // again if its lease expired meanwhile) and its client reaches web again.
    three
        .node()
        .ip(&["route", "add", "blackhole", "192.0.2.254/32"])
        .expect("partition");
    eventually(
        "node 3 sees etcd unreachable",
        &[&one, &two, &three],
        || {
            three
                .cli(&["status"])
                .is_ok_and(|s| s.contains("kvstore etcd unreachable"))
        },
    );
    three
        .node()
        .ip(&["route", "del", "blackhole", "192.0.2.254/32"])
        .expect("heal");
    eventually("node 3 connected again", &[&one, &two, &three], || {
        three
            .cli(&["status"])
            .is_ok_and(|s| s.contains("kvstore etcd connected"))
    });
    eventually(
        "client3's entry in etcd after the partition",
        &[&one, &two, &three],
        || etcd_id(&etcd, client3) == Some(client_id),
    );
    eventually(
        "client on node 3 reaches web after the partition",
        &[&one, &two, &three],
        || reaches(&client3_ns, web),
    );

    // Node 3's agent killed: when its lease expires, the others drop its pods.
    three.kill().expect("agent 3 killed");
    eventually(
        "node 3's entries expire with its lease",
        &[&one, &two, &three],
        || etcd_id(&etcd, client3).is_none(),
    );
    eventually("node 2 forgets node 3's pod", &[&one, &two, &three], || {
        ipcache_entry(&two, client3).is_none_or(|l| !l.contains("remote"))
    });
    assert!(
        node_entry(&etcd, "n3").is_none(),
        "node 3's own entry went with its lease"
    );
}

/// Starts `agent` as node `name` in kvstore mode (identities and ip entries in `etcd`), with
/// `extra` settings.
fn start_in_kvstore_mode(
    agent: &mut Agent,
    name: &str,
    api: &K8sApi,
    etcd: &Etcd,
    extra: &[(&str, &str)],
) {
    let mut env = api.agent_env(name);
    env.retain(|(k, _)| k != "CELLIUM_IDENTITY_ALLOCATION_MODE");
    env.extend([
        ("CELLIUM_IDENTITY_ALLOCATION_MODE".into(), "kvstore".into()),
        ("CELLIUM_KVSTORE".into(), "etcd".into()),
        ("CELLIUM_KVSTORE_ENDPOINTS".into(), etcd.url()),
    ]);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    agent.options_mut().env = env;
    agent.start().expect("agent");
}

/// The value of node `name`'s entry in etcd.
fn node_entry(etcd: &Etcd, name: &str) -> Option<String> {
    let value = etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("cilium/state/nodes/v1/default/{name}"),
        ])
        .ok()?;
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

/// The identity of `ip`'s entry in `agent`'s ipcache, if it has one from another node.
fn remote_identity(agent: &Agent, ip: Ipv4Addr) -> Option<u64> {
    let line = ipcache_entry(agent, ip)?;
    let mut columns = line.split_whitespace();
    let identity = columns.nth(1)?.parse().ok()?;
    (columns.next() == Some("remote")).then_some(identity)
}

/// The value of `agent`'s counter sample `sample` (`name{labels}`), 0 when absent.
fn counter(agent: &Agent, sample: &str) -> u64 {
    let text = agent.metrics().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0)
}

/// An ip entry as another node would write it.
fn ip_entry(ip: &str, host_ip: &str, id: u64, pod: &str) -> String {
    format!(
        r#"{{"IP":"{ip}","HostIP":"{host_ip}","ID":{id},"Key":0,"Metadata":"cilium-global:default:n9:1","K8sNamespace":"shop","K8sPodName":"{pod}"}}"#
    )
}

/// Forged entries in etcd: an address belongs to the node whose pod CIDRs hold it, an entry
/// is only its own key's, identities come from the cluster's range; each refusal counted and
/// in `cellium status`, the victim's identity and the policy unchanged. An `id/` key of a
/// number a node holds, rewritten with other labels, is put back by that node.
#[test]
fn forged_ip_entries_and_identity_keys_in_etcd_change_no_pods_identity() {
    let _serial = cellium_integration::serial();
    let nodes = TwoNodes::start();
    let (one, two, etcd) = (&nodes.one, &nodes.two, &nodes.etcd);
    let (client_ns, other_ns) = (&nodes.client_ns, &nodes.other_ns);
    let (client, other, web) = (nodes.client, nodes.other, nodes.web);
    let (client_id, other_id, web_id) = (
        etcd_id(etcd, client).unwrap(),
        etcd_id(etcd, other).unwrap(),
        etcd_id(etcd, web).unwrap(),
    );
    eventually("node 2 knows other", &[one, two], || {
        remote_identity(two, other) == Some(other_id)
    });
    nodes.apply_policy(WEB_FROM_CLIENT);
    eventually("other is denied", &[one, two], || !reaches(other_ns, web));
    assert!(reaches(client_ns, web), "client is allowed");

    // A node known only by its kvstore entry, n9 (pod CIDR 10.245.29.0/24), with one pod.
    etcd.etcdctl(&[
        "put",
        "cilium/state/nodes/v1/default/n9",
        r#"{"Name":"n9","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"192.0.2.9"}],"IPv4AllocCIDR":{"IP":"10.245.29.0","Mask":"////AA=="}}"#,
    ])
    .unwrap();
    let key = |k: &str| format!("cilium/state/ip/v1/default/{k}");
    let other_ip = other.to_string();
    let forged = [
        // Under a key that is not its address: other's address as client, named to come first.
        (
            key("zzz"),
            ip_entry(&other_ip, "192.0.2.1", client_id, "aaa"),
        ),
        // n9 claims an address of node 1's pod CIDR.
        (
            key("10.245.21.250"),
            ip_entry("10.245.21.250", "192.0.2.9", client_id, "x1"),
        ),
        // A HostIP no node has.
        (
            key("10.245.29.251"),
            ip_entry("10.245.29.251", "192.0.2.77", client_id, "x2"),
        ),
        // The host identity, and a node-local number.
        (
            key("10.245.29.252"),
            ip_entry("10.245.29.252", "192.0.2.9", 1, "x3"),
        ),
        (
            key("10.245.29.253"),
            ip_entry("10.245.29.253", "192.0.2.9", (1 << 24) + 1, "x4"),
        ),
    ];
    for (k, v) in &forged {
        etcd.etcdctl(&["put", k, v]).unwrap();
    }
    // n9's own pod, written last: once node 2 has it, it has seen every forged entry.
    etcd.etcdctl(&[
        "put",
        &key("10.245.29.254"),
        &ip_entry("10.245.29.254", "192.0.2.9", client_id, "x5"),
    ])
    .unwrap();
    eventually("node 2 takes n9's own pod", &[one, two], || {
        remote_identity(two, "10.245.29.254".parse().unwrap()) == Some(client_id)
    });
    assert_eq!(
        remote_identity(two, other),
        Some(other_id),
        "other keeps its identity on node 2"
    );
    for refused in [
        "10.245.21.250",
        "10.245.29.251",
        "10.245.29.252",
        "10.245.29.253",
    ] {
        assert_eq!(
            remote_identity(two, refused.parse().unwrap()),
            None,
            "{refused} is refused"
        );
    }
    assert!(!reaches(other_ns, web), "other is still denied");
    assert!(reaches(client_ns, web), "client is still allowed");
    for reason in [
        "key-mismatch",
        "foreign-address",
        "unknown-node",
        "reserved-identity",
        "not-cluster-identity",
    ] {
        let sample = format!("cellium_remote_claims_refused_total{{reason=\"{reason}\"}}");
        eventually(&format!("{reason} counted"), &[one, two], || {
            counter(two, &sample) == 1
        });
    }
    let status = two.cli(&["status"]).expect("status");
    assert!(
        status.contains("5 remote claims refused")
            && status.contains("key-mismatch 1")
            && status.contains("e.g. "),
        "{status}"
    );

    // web's number rewritten with client's labels: node 2, which holds it, puts it back.
    let id_key = format!("cilium/state/identities/v1/id/{web_id}");
    let labels = etcd
        .etcdctl(&["get", "--print-value-only", &id_key])
        .unwrap();
    let labels = labels.trim().to_string();
    assert!(labels.starts_with("k8s:app=web;"), "{labels}");
    let client_labels = etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("cilium/state/identities/v1/id/{client_id}"),
        ])
        .unwrap();
    etcd.etcdctl(&["put", &id_key, client_labels.trim()])
        .unwrap();
    eventually("node 2 puts web's labels back", &[one, two], || {
        etcd.etcdctl(&["get", "--print-value-only", &id_key])
            .is_ok_and(|v| v.trim() == labels)
            && counter(two, "cellium_kvstore_identities_restored_total") == 1
    });
    assert!(reaches(client_ns, web), "client is still allowed");
    assert!(!reaches(other_ns, web), "other is still denied");
}

/// Two nodes in kvstore mode: etcd on the switch, the test API server served on both, the
/// Nodes n1 and n2, and pods `client` and `other` on node 1 and `web` (a server on [`PORT`])
/// on node 2, each in `shop` with its name as `app`. Fields drop in order: the server and the
/// pods before the agents.
struct TwoNodes {
    _server: TcpServer,
    client_ns: NetNs,
    other_ns: NetNs,
    _web_ns: NetNs,
    client: Ipv4Addr,
    other: Ipv4Addr,
    web: Ipv4Addr,
    api: K8sApi,
    etcd: Etcd,
    _switch: NetNs,
    two: Agent,
    one: Agent,
}

impl TwoNodes {
    fn start() -> TwoNodes {
        let KvNodes {
            agents: [one, two],
            switch,
            etcd,
            api,
        } = KvNodes::start(
            &[
                ("client", "n1", "client"),
                ("other", "n1", "other"),
                ("web", "n2", "web"),
            ],
            &[],
        );
        let (client_ns, client) = add_pod(&one, "client");
        let (other_ns, other) = add_pod(&one, "other");
        let (web_ns, web) = add_pod(&two, "web");
        let server = TcpServer::start(&web_ns, SocketAddr::new(IpAddr::V4(web), PORT), "web")
            .expect("server");
        eventually("ip entries in etcd", &[&one, &two], || {
            [client, other, web]
                .iter()
                .all(|ip| etcd_id(&etcd, *ip).is_some())
        });
        TwoNodes {
            _server: server,
            client_ns,
            other_ns,
            _web_ns: web_ns,
            client,
            other,
            web,
            api,
            etcd,
            _switch: switch,
            two,
            one,
        }
    }

    /// Applies `yaml` and waits until both nodes enforce it.
    fn apply_policy(&self, yaml: &str) {
        apply_policy(&self.api, &[&self.one, &self.two], yaml);
    }
}

/// kvstore mode: a pod inside an ipBlock of some policy has a node-local identity on its own
/// node, but its ip entry in etcd carries its cluster identity, and the other node derives
/// its own local identity of the same labels: policy there still selects it by its labels
/// (and by the receiving node's ipBlocks), as in CRD mode (`cluster.rs`).
#[test]
fn a_pod_inside_an_ipblock_is_published_with_its_cluster_identity() {
    let _serial = cellium_integration::serial();
    let nodes = TwoNodes::start();
    let (one, two) = (&nodes.one, &nodes.two);
    nodes.apply_policy(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: wide, namespace: shop }\n\
         spec: { podSelector: { matchLabels: { app: nobody } }, policyTypes: [ Egress ], egress: [ { to: [ { ipBlock: { cidr: 10.0.0.0/8 } } ] } ] }\n",
    );
    nodes.apply_policy(WEB_FROM_CLIENT);
    eventually("client reaches web", &[one, two], || {
        reaches(&nodes.client_ns, nodes.web)
    });
    assert!(!reaches(&nodes.other_ns, nodes.web), "other is denied");
    let published = etcd_id(&nodes.etcd, nodes.client).expect("client's entry");
    assert!((256..65536).contains(&published), "{published}");
    let here = remote_identity(two, nodes.client).expect("node 2 has client");
    assert!(
        here >= u64::from(cellium_identity::LOCAL_IDENTITY_FLAG),
        "node 2's own local identity for client: {here}"
    );
    nodes.apply_policy(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{ name: web-from-other, namespace: shop }}\n\
         spec: {{ podSelector: {{ matchLabels: {{ app: web }} }}, ingress: [ {{ from: [ {{ ipBlock: {{ cidr: {}/32 }} }} ] }} ] }}\n",
        nodes.other
    ));
    eventually("other reaches web by its address", &[one, two], || {
        reaches(&nodes.other_ns, nodes.web)
    });
    assert!(
        reaches(&nodes.client_ns, nodes.web),
        "client is still allowed"
    );
}

/// The value of `key` in etcd, empty when absent.
fn etcd_value(etcd: &Etcd, key: &str) -> String {
    etcd.etcdctl(&["get", "--print-value-only", key])
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// An app label whose label set (`labels_key` with its app changed) another node would number
/// `n` first, once `n` is free.
fn app_probing_first(labels_key: &str, n: u32) -> String {
    (0..10_000_000)
        .map(|i| format!("t{i}"))
        .find(|app| {
            let key = labels_key.replace("k8s:app=client;", &format!("k8s:app={app};"));
            let key = keys::labels_key(&keys::parse_labels_key(&key).expect("labels"));
            keys::probe_sequence(&key).next() == Some(n)
        })
        .expect("some app is probed first at n")
}

/// A partition longer than the lease: node 1 is cut off from etcd, its references expire,
/// the GC frees its client's number, and node 2 takes that number for another pod's labels.
/// Once the partition heals node 1 finds the number taken: its client gets a new number
/// (counted, in `cellium status`), node 2's pod keeps the number, and policy on both nodes
/// goes on deciding on the right labels: client allowed to web on both nodes, the other pod
/// denied on both.
#[test]
fn a_number_taken_during_a_partition_longer_than_the_lease_moves_the_pods_that_had_it() {
    let _serial = cellium_integration::serial();
    let KvNodes {
        agents: [one, two],
        switch: _switch,
        etcd,
        api,
    } = KvNodes::start(
        &[
            ("client", "n1", "client"),
            ("web1", "n1", "web"),
            ("web", "n2", "web"),
        ],
        &[("CELLIUM_KVSTORE_LEASE_TTL", LEASE_TTL)],
    );
    let _operator = KvOperator::start(&two, &api, &etcd);
    let (client_ns, client) = add_pod(&one, "client");
    let (web1_ns, web1) = add_pod(&one, "web1");
    let (web_ns, web) = add_pod(&two, "web");
    let taker_ns = NetNs::new().expect("netns");
    let _servers = [(&web_ns, web, "web"), (&web1_ns, web1, "web1")].map(|(ns, ip, name)| {
        TcpServer::start(ns, SocketAddr::new(IpAddr::V4(ip), PORT), name).expect("server")
    });
    eventually("ip entries in etcd", &[&one, &two], || {
        [client, web1, web]
            .iter()
            .all(|ip| etcd_id(&etcd, *ip).is_some())
    });
    let number = etcd_id(&etcd, client).unwrap();
    let id_key = format!("cilium/state/identities/v1/id/{number}");
    let client_labels = etcd_value(&etcd, &id_key);
    assert!(
        client_labels.starts_with("k8s:app=client;"),
        "{client_labels}"
    );
    apply_policy(&api, &[&one, &two], WEB_FROM_CLIENT);
    eventually("client reaches web on both nodes", &[&one, &two], || {
        reaches(&client_ns, web) && reaches(&client_ns, web1)
    });

    // Node 1 cut off from etcd for longer than its lease: its references expire, and the
    // operator's GC deletes the number no node uses any more.
    let taker_app = app_probing_first(&client_labels, u32::try_from(number).unwrap());
    api.apply(&pod("taker", "n2", &taker_app))
        .expect("taker pod");
    one.node()
        .ip(&["route", "add", "blackhole", "192.0.2.254/32"])
        .expect("partition");
    let references = format!("cilium/state/identities/v1/value/{client_labels}/192.0.2.1");
    eventually(
        "node 1's reference expires with its lease",
        &[&one, &two],
        || etcd.keys(&references).is_ok_and(|k| k.is_empty()),
    );
    eventually("the GC frees the number", &[&one, &two], || {
        etcd_value(&etcd, &id_key).is_empty()
    });
    // Node 2 takes it for a pod with other labels.
    let taker = two
        .add_pod(&taker_ns, "cid-taker", "shop", "taker")
        .expect("ADD taker");
    eventually(
        "node 2 numbers its pod with the freed number",
        &[&one, &two],
        || etcd_id(&etcd, taker) == Some(number),
    );
    let taker_labels = etcd_value(&etcd, &id_key);
    assert!(
        taker_labels.starts_with(&format!("k8s:app={taker_app};")),
        "{taker_labels}"
    );

    // The partition heals: node 1 finds the number taken and moves its client to a new one.
    one.node()
        .ip(&["route", "del", "blackhole", "192.0.2.254/32"])
        .expect("heal");
    eventually("client gets a new number", &[&one, &two], || {
        etcd_id(&etcd, client).is_some_and(|n| n != number)
    });
    let moved = etcd_id(&etcd, client).unwrap();
    assert_eq!(
        etcd_value(&etcd, &format!("cilium/state/identities/v1/id/{moved}")),
        client_labels
    );
    assert_eq!(
        etcd_value(&etcd, &id_key),
        taker_labels,
        "the number stays the taker's"
    );
    assert_eq!(
        etcd_id(&etcd, taker),
        Some(number),
        "the taker keeps its number"
    );
    eventually(
        "node 2 knows client by its new number",
        &[&one, &two],
        || remote_identity(&two, client) == Some(moved),
    );
    eventually(
        "node 1 knows the taker by the number",
        &[&one, &two],
        || remote_identity(&one, taker) == Some(number),
    );
    eventually(
        "client still reaches web on both nodes",
        &[&one, &two],
        || reaches(&client_ns, web) && reaches(&client_ns, web1),
    );
    eventually(
        "the taker reaches web on neither node",
        &[&one, &two],
        || !reaches(&taker_ns, web) && !reaches(&taker_ns, web1),
    );
    eventually("counted", &[&one, &two], || {
        counter(&one, "cellium_kvstore_identity_reallocated_total") == 1
    });
    let status = one.cli(&["status"]).expect("status");
    assert!(status.contains(", 1 identities re-allocated"), "{status}");
    assert!(
        one.log().contains(&format!("old={number} new={moved} ")),
        "the move is logged with both numbers"
    );
}

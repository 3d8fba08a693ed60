//! CiliumEndpoint objects end to end: the real agent in Kubernetes mode writes one per pod it
//! sets up (through the real `cellium-cni`), in the test API server on the node's loopback,
//! follows the endpoint's identity and the node's IP, writes back what someone deleted,
//! deletes it on DEL, deletes a restarted node's stale ones, takes over another node's object
//! of a pod that landed here, and catches up after the API server was away.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test k8s_endpoints -- --test-threads=1`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use cellium_integration::k8s::node_yaml;
use cellium_integration::{Agent, AgentOptions, K8sApi, NetNs, serial};
use serde_json::{Value, json};

const NODE: &str = "n1";
/// The label the agent marks its objects with (`cellium_k8s_watchers::NODE_LABEL`).
const NODE_LABEL: &str = "cellium.io/node";
/// How long an endpoint change may take to reach its object.
const CONVERGE: Duration = Duration::from_secs(15);
/// How long a change made by someone else may take to be undone: the agent's resync
/// interval (30 s) and a margin.
const RESYNC: Duration = Duration::from_secs(45);

const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { nodeName: n1, containers: [ { name: c, image: web } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: db, namespace: shop, labels: { app: db } }
spec: { nodeName: n1, containers: [ { name: c, image: db } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web-2, namespace: shop, labels: { app: web } }
spec: { nodeName: n1, containers: [ { name: c, image: web } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: ghost, namespace: shop, labels: { app: ghost } }
spec: { nodeName: n1, containers: [ { name: c, image: ghost } ] }
"#;

/// A node with its API server and its agent in Kubernetes mode; pods are added by name.
struct Node {
    // Dropped first: the API server stops before its node goes.
    api: K8sApi,
    pods: Vec<(String, NetNs, Ipv4Addr)>,
    agent: Agent,
}

impl Node {
    fn start() -> Node {
        let mut agent = Agent::prepare(AgentOptions {
            pod_cidrs: Vec::new(),
            ..AgentOptions::default()
        })
        .expect("node");
        let api = K8sApi::start(agent.node()).expect("API server");
        // Straight into the store: a create through the API keeps the status, and kubectl
        // apply would too, but this names the node's address without a status update.
        let node = node_yaml(
            NODE,
            "10.245.9.0/24",
            &[("Hostname", NODE), ("InternalIP", "192.168.77.1")],
        );
        api.api().apply_yaml(&node).expect("node object");
        api.apply(APP).expect("pods");
        agent.options_mut().env = api.agent_env(NODE);
        agent.start().expect("agent in Kubernetes mode");
        Node {
            api,
            pods: Vec::new(),
            agent,
        }
    }

    fn add(&mut self, name: &str) -> Ipv4Addr {
        let ns = NetNs::new().expect("pod netns");
        let ip = self
            .agent
            .add_pod(&ns, &format!("cid-{name}"), "shop", name)
            .expect("CNI ADD");
        self.pods.push((name.to_string(), ns, ip));
        ip
    }

    fn del(&mut self, name: &str) {
        let at = self.pods.iter().position(|p| p.0 == name).expect("pod");
        let (_, ns, _) = self.pods.remove(at);
        self.agent
            .del(&format!("cid-{name}"), &ns.path())
            .expect("CNI DEL");
    }

    /// The CiliumEndpoint `shop/name`, if the API server has it.
    fn cep(&self, name: &str) -> Option<Value> {
        self.api
            .api()
            .get("cilium.io/v2", "CiliumEndpoint", Some("shop"), name)
    }

    /// The agent's endpoint of pod `name`, as `cellium endpoint list` gives it.
    fn endpoint(&self, name: &str) -> Value {
        let endpoints = self.agent.endpoints().expect("endpoints");
        endpoints
            .into_iter()
            .find(|e| e["pod"] == format!("shop/{name}"))
            .unwrap_or_else(|| panic!("no endpoint of {name}"))
    }

    /// Waits until `f` holds of the CiliumEndpoint `shop/name` (or its absence); panics with
    /// what the server holds and the agent's log otherwise.
    fn wait_cep(
        &self,
        name: &str,
        within: Duration,
        why: &str,
        f: impl Fn(Option<&Value>) -> bool,
    ) {
        let began = Instant::now();
        loop {
            let cep = self.cep(name);
            if f(cep.as_ref()) {
                return;
            }
            if began.elapsed() > within {
                panic!(
                    "{why}: CiliumEndpoint shop/{name} after {within:?}: {cep:#?}\n{}",
                    self.agent.log()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the CiliumEndpoint of pod `name` says what its endpoint does now.
    fn wait_in_line(&self, name: &str, ip: Ipv4Addr, why: &str) {
        let ep = self.endpoint(name);
        let mut want_labels: Vec<String> = ep["labels"]
            .as_object()
            .expect("labels")
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some("") | None => k.clone(),
                Some(v) => format!("{k}={v}"),
            })
            .collect();
        want_labels.sort();
        self.wait_cep(name, CONVERGE, why, |cep| {
            let Some(cep) = cep else { return false };
            let s = &cep["status"];
            cep["metadata"]["labels"][NODE_LABEL] == NODE
                && s["id"] == ep["id"]
                && s["identity"]["id"] == ep["identity"]
                && sorted(&s["identity"]["labels"]) == want_labels
                && s["networking"]["addressing"] == json!([{ "ipv4": ip.to_string() }])
                && s["networking"]["node"] == "192.168.77.1"
                && s["state"] == "ready"
        });
    }

    /// The health node of the job that writes the objects.
    fn job_health(&self) -> Value {
        let status = self
            .agent
            .cli_json(&["status", "--verbose"])
            .expect("status");
        find_node(&status["modules"], "ciliumendpoints")
            .unwrap_or_else(|| panic!("no ciliumendpoints job in {status:#}"))
    }
}

/// The strings of a JSON array, sorted.
fn sorted(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = (v.as_array().into_iter().flatten())
        .filter_map(|s| s.as_str().map(String::from))
        .collect();
    out.sort();
    out
}

/// The health node `name`, or whose id ends with `.name`.
fn find_node(nodes: &Value, name: &str) -> Option<Value> {
    for node in nodes.as_array()? {
        if node["id"]
            .as_str()
            .is_some_and(|id| id == name || id.ends_with(&format!(".{name}")))
        {
            return Some(node.clone());
        }
        if let Some(found) = find_node(&node["children"], name) {
            return Some(found);
        }
    }
    None
}

#[test]
fn each_pod_has_a_ciliumendpoint_that_follows_its_endpoint() {
    let _serial = serial();
    let mut n = Node::start();
    let web = n.add("web");
    let db = n.add("db");
    n.wait_in_line("web", web, "written after ADD");
    n.wait_in_line("db", db, "written after ADD");
    assert!(
        n.cep("web").unwrap()["status"]["identity"]["labels"]
            .as_array()
            .unwrap()
            .contains(&json!("k8s:app=web")),
        "{:#}",
        n.cep("web").unwrap()
    );

    // A label changed with kubectl: a new identity, shown in the object.
    n.api
        .label_pod("shop", "web", "tier=front")
        .expect("kubectl label");
    n.wait_cep("web", CONVERGE, "the new label reaches the object", |cep| {
        cep.is_some_and(|c| {
            c["status"]["identity"]["labels"]
                .as_array()
                .is_some_and(|l| l.contains(&json!("k8s:tier=front")))
        })
    });
    n.wait_in_line("web", web, "the new identity reaches the object");

    // Deleted by someone else: written again.
    n.api
        .kubectl(&["delete", "ciliumendpoint", "web", "-n", "shop"], "")
        .expect("kubectl delete");
    n.wait_cep("web", CONVERGE, "a deleted object is written again", |c| {
        c.is_some()
    });
    n.wait_in_line("web", web, "written again as it was");

    // DEL: gone, the other pod's kept.
    n.del("db");
    n.wait_cep("db", CONVERGE, "deleted on DEL", |c| c.is_none());
    assert!(n.cep("web").is_some());
    let health = n.job_health();
    assert_eq!(health["level"], "OK", "{health:#}");

    // The node's address changes: every object follows.
    n.api
        .kubectl(
            &[
                "patch",
                "node",
                NODE,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"addresses":[{"type":"InternalIP","address":"192.168.77.2"}]}}"#,
            ],
            "",
        )
        .expect("kubectl patch");
    n.wait_cep(
        "web",
        CONVERGE,
        "the node's new IP reaches the object",
        |c| c.is_some_and(|c| c["status"]["networking"]["node"] == "192.168.77.2"),
    );
}

#[test]
fn a_restarted_agent_deletes_its_nodes_stale_ciliumendpoints() {
    let _serial = serial();
    let mut n = Node::start();
    let web = n.add("web");
    n.wait_in_line("web", web, "written after ADD");

    n.agent.stop().expect("stop the agent");
    // While it is away: an object for a pod of this node that has no endpoint (left by a
    // crash between a DEL and the delete, say), another node's object, an object of this
    // node's pod changed by hand, and one nobody marked.
    let stale = |name: &str, node: &str| {
        json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumEndpoint",
            "metadata": { "name": name, "namespace": "shop", "labels": { NODE_LABEL: node } },
            "status": { "id": 999, "state": "ready" },
        })
    };
    n.api.api().create(stale("ghost", NODE)).expect("stale");
    n.api
        .api()
        .create(stale("elsewhere", "n2"))
        .expect("other node's");
    let mut unmarked = stale("unmarked", NODE);
    unmarked["metadata"]["labels"] = json!({});
    n.api.api().create(unmarked).expect("unmarked");
    let mut changed = n.cep("web").unwrap();
    changed["status"]["id"] = json!(999);
    n.api
        .api()
        .apply_yaml(&serde_json::to_string(&changed).unwrap())
        .expect("changed by hand");

    n.agent.launch().expect("start the agent again");
    n.agent.wait_ready().expect("ready");
    n.wait_cep(
        "ghost",
        CONVERGE,
        "the stale object is deleted at start",
        |c| c.is_none(),
    );
    n.wait_in_line(
        "web",
        web,
        "the restored endpoint's object is put back in line",
    );
    assert_eq!(n.cep("elsewhere").unwrap()["status"]["id"], 999);
    assert_eq!(n.cep("unmarked").unwrap()["status"]["id"], 999);

    // A pod whose name another node's object still has (a pod of that name ran there)
    // lands here: the object is taken over.
    n.api.api().create(stale("db", "n2")).expect("other node's");
    let db = n.add("db");
    n.wait_in_line(
        "db",
        db,
        "the other node's object of this pod is taken over",
    );
}

#[test]
fn objects_written_while_the_api_server_was_away_arrive_after() {
    let _serial = serial();
    let mut n = Node::start();
    let web = n.add("web");
    n.wait_in_line("web", web, "written after ADD");

    // Away: the pod is known from the tables and its labels have an identity number
    // already (web's), so ADD works; its object cannot be written, and the job says so.
    n.api.stop();
    let db = n.add("web-2");
    let began = Instant::now();
    loop {
        let health = n.job_health();
        if health["level"] == "Degraded" {
            assert!(
                health["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("retrying in")),
                "{health:#}"
            );
            break;
        }
        assert!(
            began.elapsed() < CONVERGE,
            "the job is not degraded while the API server is away: {health:#}\n{}",
            n.agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Back: the object arrives within the backoff's longest delay, and the job is OK again.
    n.api.restart().expect("API server back");
    n.wait_in_line("web-2", db, "written once the API server is back");
    let began = Instant::now();
    while n.job_health()["level"] != "OK" {
        assert!(began.elapsed() < RESYNC, "{:#}", n.job_health());
        std::thread::sleep(Duration::from_millis(200));
    }
}

//! Kubernetes mode end to end: the real agent in a node namespace, fed by the test API server
//! (the real list/watch protocol) on that node's loopback, objects made with `kubectl`, pods
//! through the real `cellium-cni` naming them in `CNI_ARGS`, traffic through the datapath.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test k8s -- --test-threads=1`.
//!
//! Every test makes its own namespaces, agent and API server and removes them through guards;
//! traffic goes only to addresses inside the namespaces it made.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use cellium_integration::cluster::{Cluster as Nodes, ClusterOptions};
use cellium_integration::k8s::node_yaml;
use cellium_integration::lab::External;
use cellium_integration::lab::external::EXT_ADDRS;
use cellium_integration::probe::{TcpServer, tcp_request};
use cellium_integration::reach::{Outcome, Probe, probe};
use cellium_integration::shop::WEB_FROM_CLIENT;
use cellium_integration::wait::{eventually_or, poll_until, wait_for};
use cellium_integration::{Agent, AgentOptions, CniCall, K8sApi, NetNs, serial};

const NODE: &str = "n1";
const PORT: u16 = 8080;
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);
/// How long a change made at the API server may take to reach the datapath.
const CONVERGE: Duration = Duration::from_secs(20);

/// The node's pod CIDR, as the controller manager would have given it.
const POD_CIDR: &str = "10.245.7.0/24";

const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { nodeName: n1, containers: [ { name: c, image: web, ports: [ { name: http, containerPort: 8080 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: client, namespace: shop, labels: { app: client } }
spec: { nodeName: n1, serviceAccountName: shopper, containers: [ { name: c, image: client } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: other, namespace: shop, labels: { app: other } }
spec: { nodeName: n1, containers: [ { name: c, image: other } ] }
"#;

/// Denies web's ingress from `role: banned` pods, whatever else allows.
const DENY_BANNED: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: deny-banned, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  ingressDeny: [ { fromEndpoints: [ { matchLabels: { role: banned } } ] } ]
"#;

/// Only pods of the ServiceAccount `shopper` may reach web.
const WEB_FROM_SHOPPER: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-from-shopper, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  ingress: [ { fromEndpoints: [ { matchLabels: { io.cilium.k8s.policy.serviceaccount: shopper } } ] } ]
"#;

const WEB_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: shop }
spec:
  selector: { app: web }
  ports: [ { name: http, port: 80, targetPort: http } ]
"#;

/// A node with its API server, its agent in Kubernetes mode (`ipam: kubernetes`), and the
/// pods of [`APP`] created through the CNI plugin, web serving on its port.
struct Cluster {
    // Dropped first: the API server stops before its node goes.
    api: K8sApi,
    pods: Vec<(String, NetNs, Ipv4Addr)>,
    _servers: Vec<TcpServer>,
    agent: Agent,
}

impl Cluster {
    fn start() -> Cluster {
        let mut agent = Agent::prepare(AgentOptions {
            pod_cidrs: Vec::new(),
            ..AgentOptions::default()
        })
        .expect("node");
        let api = K8sApi::start(agent.node()).expect("API server");
        api.apply(&node_yaml(NODE, POD_CIDR, &[]))
            .expect("node object");
        api.apply(APP).expect("pods");
        agent.options_mut().env = api.agent_env(NODE);
        agent.start().expect("agent in Kubernetes mode");
        let mut cluster = Cluster {
            api,
            pods: Vec::new(),
            _servers: Vec::new(),
            agent,
        };
        for name in ["web", "client", "other"] {
            cluster.add(name);
        }
        let web = cluster.ip("web");
        let ns = cluster.netns("web");
        cluster._servers.push(
            TcpServer::start(ns, SocketAddr::new(IpAddr::V4(web), PORT), "web").expect("server"),
        );
        cluster
    }

    fn add(&mut self, name: &str) {
        let ns = NetNs::new().expect("pod netns");
        let ip = self
            .agent
            .add_pod(&ns, &format!("cid-{name}"), "shop", name)
            .expect("CNI ADD");
        self.pods.push((name.to_string(), ns, ip));
    }

    fn ip(&self, name: &str) -> Ipv4Addr {
        self.pods.iter().find(|p| p.0 == name).expect("pod").2
    }

    fn netns(&self, name: &str) -> &NetNs {
        &self.pods.iter().find(|p| p.0 == name).expect("pod").1
    }

    /// Whether `from` reaches `ip:port` over TCP.
    fn reaches(&self, from: &str, ip: Ipv4Addr, port: u16) -> bool {
        self.answered(self.netns(from), None, ip, port)
    }

    /// Waits until `ok` holds, for [`CONVERGE`]; panics with the agent's log otherwise.
    fn eventually(&self, what: &str, ok: impl FnMut() -> bool) {
        if let Err(e) = poll_until(what, CONVERGE, ok) {
            panic!("{e}\n{}", self.agent.log());
        }
    }

    /// Waits until `from` reaching web is `want`; panics with the agent's log otherwise.
    fn expect_web(&self, from: &str, want: bool, why: &str) {
        let web = self.ip("web");
        let verdict = if want { "allowed" } else { "denied" };
        self.eventually(&format!("{why}: {from} -> web {verdict}"), || {
            self.reaches(from, web, PORT) == want
        });
    }

    /// The ClusterIP the API server gave Service `shop/name`.
    fn cluster_ip(&self, name: &str) -> Ipv4Addr {
        let svc = self
            .api
            .api()
            .get("v1", "Service", Some("shop"), name)
            .expect("stored service");
        svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap()
    }

    /// Whether a TCP connection from `ns` (from `src` when given) to `dst:port` is answered.
    fn answered(&self, ns: &NetNs, src: Option<Ipv4Addr>, dst: Ipv4Addr, port: u16) -> bool {
        match probe(
            ns,
            src.map(IpAddr::V4),
            dst,
            Probe::Tcp(port),
            PROBE_TIMEOUT,
        ) {
            Ok(Outcome::Answered) => true,
            Ok(_) => false,
            Err(e) => panic!("probe {src:?} -> {dst}:{port}: {e}"),
        }
    }

    /// Waits until a TCP connection from `ns` (from `src`) to `dst:port` is answered as `want`.
    fn expect_tcp(
        &self,
        ns: &NetNs,
        src: Option<Ipv4Addr>,
        dst: Ipv4Addr,
        port: u16,
        want: bool,
        why: &str,
    ) {
        let verdict = if want { "allowed" } else { "denied" };
        eventually_or(
            &format!("{why}: {src:?} -> {dst}:{port} {verdict}"),
            || self.agent.log(),
            || self.answered(ns, src, dst, port) == want,
        );
    }

    /// `kubectl apply` of policies; waits until the agent's repository has taken them in and
    /// every endpoint enforces them.
    fn apply_policy(&self, yaml: &str) {
        let before = self.agent.policy_revision().expect("revision");
        self.api.apply(yaml).expect("kubectl apply");
        self.agent
            .wait_policy_revision_after(before)
            .expect("the policy reaches the agent");
        self.agent.settle().expect("enforced");
    }

    /// The labels of the endpoint of pod `name`, as `source:key=value`.
    fn labels(&self, name: &str) -> Vec<String> {
        let endpoints = self.agent.endpoints().expect("endpoints");
        let ep = endpoints
            .iter()
            .find(|e| {
                e["pod"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("/{name}")))
            })
            .unwrap_or_else(|| panic!("no endpoint of {name}: {endpoints:?}"));
        ep["labels"]
            .as_object()
            .map(|l| {
                l.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[test]
fn pods_get_their_labels_addresses_and_policy_from_the_api_server() {
    let _serial = serial();
    let mut c = Cluster::start();
    for (name, _, ip) in &c.pods {
        assert!(
            ip.octets()[..3] == [10, 245, 7],
            "{name} got {ip}, outside the Node's spec.podCIDRs"
        );
    }
    assert!(
        c.labels("web").contains(&"k8s:app=web".to_string()),
        "{:?}",
        c.labels("web")
    );
    c.expect_web("other", true, "no policy yet");

    c.apply_policy(WEB_FROM_CLIENT);
    c.expect_web("client", true, "the NetworkPolicy allows client");
    c.expect_web("other", false, "the NetworkPolicy selects web, not other");

    // A label changed with kubectl moves the pod to a new identity and policy.
    c.api
        .label_pod("shop", "other", "app=client")
        .expect("kubectl label");
    c.expect_web("other", true, "other is labelled app=client now");
    assert!(c.labels("other").contains(&"k8s:app=client".to_string()));

    // A CiliumNetworkPolicy applied, updated and deleted with kubectl.
    c.apply_policy(DENY_BANNED);
    c.api
        .kubectl(&["label", "pod", "other", "-n", "shop", "role=banned"], "")
        .expect("kubectl label");
    c.expect_web("other", false, "the CiliumNetworkPolicy denies role=banned");
    c.apply_policy(&DENY_BANNED.replace("role: banned", "role: nobody"));
    c.expect_web(
        "other",
        true,
        "the updated CiliumNetworkPolicy denies someone else",
    );
    c.api
        .kubectl(&["delete", "cnp", "deny-banned", "-n", "shop"], "")
        .expect("kubectl delete");
    c.api
        .kubectl(&["delete", "netpol", "web-from-client", "-n", "shop"], "")
        .expect("kubectl delete");
    c.expect_web("client", true, "no policy left");
    c.expect_web("other", true, "no policy left");

    // A Service from the API server gives a working ClusterIP, with the address the API
    // server allocated.
    c.api.apply(WEB_SERVICE).expect("service");
    let vip = c.cluster_ip("web");
    c.eventually(&format!("the ClusterIP {vip} reaches web"), || {
        c.reaches("client", vip, 80)
    });

    // A Service without a selector takes its backends from the EndpointSlice naming it.
    let manual = selectorless_service("manual", c.ip("web"));
    c.api.apply(&manual).expect("service and slice");
    let vip = c.cluster_ip("manual");
    c.eventually(
        &format!("the EndpointSlice's backend behind {vip} is reached"),
        || c.reaches("client", vip, 81),
    );

    // A pod created after the agent started, added right away: its labels are there.
    c.api
        .apply(
            &APP.replace("name: other", "name: late")
                .replace("app: other", "app: late"),
        )
        .expect("late pod");
    c.add("late");
    assert!(c.labels("late").contains(&"k8s:app=late".to_string()));
}

#[test]
fn a_policy_selects_pods_by_their_service_account() {
    let _serial = serial();
    let c = Cluster::start();
    assert!(
        c.labels("client")
            .contains(&"k8s:io.cilium.k8s.policy.serviceaccount=shopper".to_string()),
        "{:?}",
        c.labels("client")
    );
    assert!(
        c.labels("other")
            .contains(&"k8s:io.cilium.k8s.policy.cluster=default".to_string()),
        "{:?}",
        c.labels("other")
    );
    c.apply_policy(WEB_FROM_SHOPPER);
    c.expect_web("client", true, "client runs as the ServiceAccount shopper");
    c.expect_web("other", false, "other runs as the ServiceAccount default");
}

#[test]
fn what_the_api_server_owns_is_refused_and_an_unknown_pod_fails_the_add() {
    let _serial = serial();
    let c = Cluster::start();
    let err = c
        .agent
        .objects("apply", WEB_FROM_CLIENT)
        .expect_err("cellium apply in Kubernetes mode");
    let text = err.to_string();
    assert!(
        text.contains("Kubernetes mode") && text.contains("NetworkPolicy shop/web-from-client"),
        "{text}"
    );
    assert!(
        c.agent.policy_revision().is_ok(),
        "the agent answers after a refusal"
    );

    let ghost = NetNs::new().expect("netns");
    let call = CniCall::new("ADD", "cid-ghost")
        .netns(ghost.path())
        .args("K8S_POD_NAMESPACE=shop;K8S_POD_NAME=ghost");
    let (status, out) = c.agent.cni(&call).expect("plugin ran");
    assert!(!status.success());
    assert_eq!(out["code"], 11, "try again later: {out}");
    let msg = format!("{} {}", out["msg"], out["details"]);
    assert!(
        msg.contains("shop/ghost") && msg.contains("no such pod"),
        "{msg}"
    );
    assert!(
        c.agent
            .endpoints()
            .unwrap()
            .iter()
            .all(|e| e["pod"] != "shop/ghost"),
        "nothing is left of the refused ADD"
    );
}

#[test]
fn the_agent_keeps_enforcing_while_the_api_server_is_away_and_converges_after() {
    let _serial = serial();
    let c = Cluster::start();
    c.apply_policy(WEB_FROM_CLIENT);
    c.expect_web("other", false, "policy in force");

    // Killed: the agent keeps its last state; a deletion made meanwhile arrives after.
    let failures = || c.agent.log().matches("list or watch failed").count();
    let before = failures();
    c.api.stop();
    c.api
        .api()
        .delete(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            Some("shop"),
            "web-from-client",
        )
        .expect("delete while away");
    c.eventually("the agent finds the API server gone", || {
        failures() > before
    });
    assert!(
        !c.reaches("other", c.ip("web"), PORT),
        "the last state is enforced while the API server is away"
    );
    assert!(c.reaches("client", c.ip("web"), PORT));
    c.api.restart().expect("restart");
    c.expect_web("other", true, "the deletion made during the outage arrives");

    // Every watch expires (an in-stream 410 when they resume): the relist brings a policy
    // created meanwhile.
    c.api.stop();
    c.api.api().apply_yaml(WEB_FROM_CLIENT).expect("policy");
    c.api.api().expire_watches();
    c.api.restart().expect("restart");
    c.expect_web("other", false, "the relist after 410 brings the new policy");
    c.api
        .kubectl(&["delete", "netpol", "web-from-client", "-n", "shop"], "")
        .expect("kubectl delete");
    c.expect_web("other", true, "deleted again");

    // A slow API server: changes still arrive.
    c.api.api().set_latency(Duration::from_millis(400));
    c.api.api().drop_watches();
    c.api.apply(WEB_FROM_CLIENT).expect("kubectl apply");
    c.expect_web("other", false, "a slow API server still delivers");
    c.api.api().set_latency(Duration::ZERO);

    // Watches dropped mid-stream: they resume and bring a deletion.
    c.api.api().drop_watches();
    c.api
        .kubectl(&["delete", "netpol", "web-from-client", "-n", "shop"], "")
        .expect("kubectl delete");
    c.expect_web("other", true, "the watch resumed after a drop");
}

#[test]
fn a_restart_while_the_api_server_is_away_keeps_enforcing_and_waits_for_it() {
    let _serial = serial();
    let mut c = Cluster::start();
    c.apply_policy(WEB_FROM_CLIENT);
    c.expect_web("other", false, "policy in force");
    c.agent.stop().expect("stop the agent");
    c.api.stop();
    c.agent.launch().expect("start the agent again");
    c.eventually("the agent says what it waits for", || {
        let log = c.agent.log();
        log.contains("waiting for the API server's first complete lists")
            || log.contains("list or watch failed")
    });
    assert!(
        c.agent.is_running(),
        "the agent waits for the API server\n{}",
        c.agent.log()
    );
    assert!(
        !c.reaches("other", c.ip("web"), PORT) && c.reaches("client", c.ip("web"), PORT),
        "the datapath keeps enforcing the last policy while the agent waits"
    );
    c.api.restart().expect("API server back");
    c.agent.wait_ready().expect("the agent starts once synced");
    c.agent.settle().expect("enforced");
    assert!(!c.reaches("other", c.ip("web"), PORT));
    assert!(c.reaches("client", c.ip("web"), PORT));
    assert_eq!(
        c.agent.endpoints().unwrap().len(),
        3,
        "every endpoint restored"
    );
}

/// Objects of a newer API, stored as the API server holds them (not through kubectl, which
/// would validate them): a Service with fields this version does not know is served for what
/// it knows, the fields named in status; a NetworkPolicy with one in its rules is not put in
/// force and locks down its namespace (what it allows cannot be told without it) until it is
/// deleted.
#[test]
fn objects_with_fields_this_version_does_not_know() {
    let _serial = serial();
    let c = Cluster::start();
    let newer = WEB_SERVICE.replace("spec:\n", "spec:\n  futureField: 1\n");
    c.api.api().apply_yaml(&newer).expect("service");
    let vip = c.cluster_ip("web");
    c.eventually(&format!("the ClusterIP {vip} reaches web"), || {
        c.reaches("client", vip, 80)
    });
    let status = c.agent.cli(&["status", "--verbose"]).expect("status");
    assert!(
        status.contains(
            "in force without the fields this version does not know: Service shop/web (spec.futureField)"
        ),
        "{status}"
    );
    c.api
        .api()
        .apply_yaml(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: future, namespace: shop }\n\
             spec: { podSelector: { matchLabels: { app: web } }, ingress: [ { from: [ { podSelector: {} } ], futureAction: Deny } ] }\n",
        )
        .expect("policy");
    c.expect_web("client", false, "shop is locked down");
    let status = c.agent.cli(&["status", "--verbose"]).expect("status");
    assert!(
        status.contains("NetworkPolicy shop/future")
            && status.contains("spec.ingress[0].futureAction"),
        "{status}"
    );
    c.api
        .api()
        .delete(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            Some("shop"),
            "future",
        )
        .expect("delete");
    c.expect_web("client", true, "the lockdown ends with the policy");
}

/// Selects client, with a field this version does not enforce: the API server holds it, the
/// agent cannot put it in force.
const UNENFORCEABLE_FOR_CLIENT: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: client-to-github, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: client } }
  egress: [ { toFQDNs: [ { matchName: api.github.com } ] } ]
"#;

/// A policy the agent cannot enforce locks down only the endpoints it selects: the pod it
/// names fails closed, every other pod keeps its own policy, and status says which and why.
#[test]
fn a_policy_the_agent_cannot_enforce_locks_down_only_what_it_selects() {
    let _serial = serial();
    let c = Cluster::start();
    c.expect_web("client", true, "no policy yet");
    c.expect_web("other", true, "no policy yet");

    c.apply_policy(UNENFORCEABLE_FOR_CLIENT);
    c.expect_web(
        "client",
        false,
        "client is locked down: its egress policy is not in force",
    );
    // web and other are not selected: their traffic is as before (a lockdown of every
    // endpoint would drop this at web's ingress).
    assert!(c.reaches("other", c.ip("web"), PORT), "other -> web");
    let status = c.agent.cli(&["status", "--verbose"]).expect("status");
    assert!(status.contains("client-to-github"), "{status}");
    assert!(
        status.contains("locks down the endpoints it selects in namespace shop"),
        "{status}"
    );
    // The node still takes new pods: the policy is its own problem, not the node's. A
    // Degraded module would fail CNI STATUS, and the runtime would take the node's network
    // for not ready: one tenant's object would stop every pod of the node.
    let status_call = CniCall::new("STATUS", "-")
        .unset("CNI_CONTAINERID")
        .unset("CNI_IFNAME")
        .conf(&c.agent.net_conf("1.1.0"));
    let (exit, out) = c.agent.cni(&status_call).expect("CNI STATUS");
    assert!(
        exit.success(),
        "CNI STATUS with a policy not in force: {out}"
    );
    let extra = NetNs::new().expect("pod netns");
    c.agent
        .add(&extra, "cid-extra")
        .expect("a new pod's ADD with a policy not in force");

    c.api
        .kubectl(&["delete", "-f", "-"], UNENFORCEABLE_FOR_CLIENT)
        .expect("kubectl delete");
    c.expect_web("client", true, "the lockdown lifts with the policy gone");
}

/// A Pod force-deleted while its container runs keeps its labels, and so its policy, until
/// the runtime's DEL: dropped to its namespace's labels, web would leave the NetworkPolicy that
/// admits only client, and be open to every pod.
#[test]
fn a_force_deleted_pod_keeps_its_labels_and_its_policy_until_del() {
    let _serial = serial();
    let c = Cluster::start();
    c.apply_policy(WEB_FROM_CLIENT);
    c.expect_web("client", true, "the NetworkPolicy allows client");
    c.expect_web("other", false, "the NetworkPolicy selects web");
    // `resources`' health says "<N> objects in force, from the API server ...".
    let in_force = || -> Option<u64> {
        let status = c.agent.cli(&["status", "--verbose"]).expect("status");
        let at = status.find(" objects in force")?;
        let digits = status[..at]
            .rsplit(|ch: char| !ch.is_ascii_digit())
            .next()?;
        digits.parse().ok()
    };
    let before = in_force();
    c.api
        .kubectl(
            &[
                "delete",
                "pod",
                "web",
                "-n",
                "shop",
                "--force",
                "--grace-period=0",
            ],
            "",
        )
        .expect("kubectl delete --force");
    // The agent has taken the delete in once its count of objects in force changed.
    c.eventually("the delete reaches the agent", || in_force() != before);
    c.agent.settle().expect("settled");
    assert!(
        c.labels("web").contains(&"k8s:app=web".to_string()),
        "{:?}",
        c.labels("web")
    );
    assert!(!c.reaches("other", c.ip("web"), PORT), "other reached web");
    assert!(c.reaches("client", c.ip("web"), PORT), "client -> web");
}

fn spread_pods() -> String {
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: { name: shop }\n");
    for (name, app, node) in [
        ("web-a", "web", "n1"),
        ("web-b", "web", "n2"),
        ("db-a", "db", "n1"),
        ("db-b", "db", "n2"),
    ] {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, namespace: shop, labels: {{ app: {app} }} }}\nspec: {{ nodeName: {node}, containers: [ {{ name: c, image: x }} ] }}\n"
        ));
    }
    yaml
}

#[test]
fn two_agents_on_two_nodes_agree_on_identity_numbers() {
    let _serial = serial();
    let mut cluster = Nodes::start(ClusterOptions::default()).expect("two nodes");
    cluster.apply(&spread_pods()).expect("pods");

    // The same labels ADDed on both nodes at the same moment: both race to create the
    // CiliumIdentity of a label set nobody had.
    let netns: Vec<NetNs> = (0..4).map(|_| NetNs::new().expect("pod netns")).collect();
    std::thread::scope(|s| {
        for (i, (agent, name)) in [
            (cluster.agent(0), "web-a"),
            (cluster.agent(1), "web-b"),
            (cluster.agent(0), "db-a"),
            (cluster.agent(1), "db-b"),
        ]
        .into_iter()
        .enumerate()
        {
            let ns = &netns[i];
            s.spawn(move || {
                agent
                    .add_pod(ns, &format!("cid-{name}"), "shop", name)
                    .unwrap_or_else(|e| panic!("ADD {name}: {e}"))
            });
        }
    });
    let identity = |agent: &Agent, pod: &str| -> u64 {
        let eps = agent.endpoints().expect("endpoints");
        eps.iter()
            .find(|e| e["pod"] == format!("shop/{pod}"))
            .and_then(|e| e["identity"].as_u64())
            .unwrap_or_else(|| panic!("no identity for {pod}: {eps:?}"))
    };
    let (web_a, web_b) = (
        identity(cluster.agent(0), "web-a"),
        identity(cluster.agent(1), "web-b"),
    );
    let (db_a, db_b) = (
        identity(cluster.agent(0), "db-a"),
        identity(cluster.agent(1), "db-b"),
    );
    assert_eq!(web_a, web_b, "both nodes number app=web alike");
    assert_eq!(db_a, db_b, "both nodes number app=db alike");
    assert_ne!(web_a, db_a);
    let ids = cluster.api().api().list("cilium.io/v2", "CiliumIdentity");
    assert_eq!(ids.len(), 2, "one CiliumIdentity per label set: {ids:?}");
    let web = cluster
        .api()
        .api()
        .get("cilium.io/v2", "CiliumIdentity", None, &web_a.to_string())
        .expect("the CiliumIdentity named by the number");
    assert_eq!(web["security-labels"]["k8s:app"], "web", "{web}");

    // A restarted agent gives the same number back without asking.
    cluster.agent_mut(0).stop().expect("stop");
    cluster.start_agent(0).expect("start again");
    cluster.agent(0).settle().expect("settled");
    assert_eq!(identity(cluster.agent(0), "web-a"), web_a);
}

#[test]
fn ipam_kubernetes_waits_for_the_nodes_pod_cidrs() {
    let _serial = serial();
    let mut agent = Agent::prepare(AgentOptions {
        pod_cidrs: Vec::new(),
        ..AgentOptions::default()
    })
    .expect("node");
    let api = K8sApi::start(agent.node()).expect("API server");
    api.apply("apiVersion: v1\nkind: Node\nmetadata: { name: n1 }\n")
        .expect("a node without pod CIDRs");
    api.apply(APP).expect("pods");
    agent.options_mut().env = api.agent_env(NODE);
    agent.launch().expect("agent");
    eventually_or(
        "the agent says what it waits for",
        || agent.log(),
        || {
            agent
                .log()
                .contains("waiting for Node n1 to be given spec.podCIDRs")
        },
    );
    assert!(agent.is_running(), "the agent waits\n{}", agent.log());
    assert!(
        agent.cli(&["status"]).is_err(),
        "the API is not served before the pod CIDRs exist"
    );
    api.kubectl(
        &[
            "patch",
            "node",
            "n1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"podCIDRs":["10.245.9.0/24"]}}"#,
        ],
        "",
    )
    .expect("kubectl patch");
    agent
        .wait_ready()
        .expect("the agent starts once the Node has them");
    let ns = NetNs::new().expect("pod netns");
    let ip = agent.add_pod(&ns, "cid-web", "shop", "web").expect("ADD");
    assert_eq!(ip.octets()[..3], [10, 245, 9], "{ip}");
}

/// How a TCP connect() from `from` to `to` ends: `None` when it connects.
fn connect_error(c: &Cluster, from: &str, to: SocketAddr) -> Option<std::io::ErrorKind> {
    c.netns(from)
        .run(move || {
            std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3))
                .err()
                .map(|e| e.kind())
        })
        .expect("run in the pod")
}

/// Waits until a connect() from `from` to `to` ends as `want` (`None`: connected).
fn expect_connect(c: &Cluster, from: &str, to: SocketAddr, want: Option<std::io::ErrorKind>) {
    c.eventually(&format!("{from} -> {to}: {want:?}"), || {
        connect_error(c, from, to) == want
    });
}

/// Service `owned` (no selector) as the API server stored it: its cluster IP and uid.
fn owned_service(c: &Cluster) -> (SocketAddr, String) {
    c.api
        .apply(
            "apiVersion: v1\nkind: Service\nmetadata: { name: owned, namespace: shop }\nspec: { ports: [ { name: http, port: 82, targetPort: 8080 } ] }\n",
        )
        .expect("service");
    let svc = c
        .api
        .api()
        .get("v1", "Service", Some("shop"), "owned")
        .expect("stored service");
    let vip: IpAddr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
    let uid = svc["metadata"]["uid"].as_str().expect("a uid").to_string();
    (SocketAddr::new(vip, 82), uid)
}

/// A slice of service `owned` serving web, owned by the service of uid `uid`, as the
/// endpointslice controller writes it.
fn owned_slice(name: &str, uid: &str, web: Ipv4Addr) -> String {
    format!(
        r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: shop
  labels: {{ kubernetes.io/service-name: owned, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io }}
  ownerReferences: [ {{ apiVersion: v1, kind: Service, name: owned, uid: {uid}, controller: true, blockOwnerDeletion: true }} ]
addressType: IPv4
ports: [ {{ name: http, port: 8080, protocol: TCP }} ]
endpoints: [ {{ addresses: [ "{web}" ], conditions: {{ ready: true }} }} ]
"#
    )
}

#[test]
fn a_recreated_service_ignores_the_slices_of_its_predecessor_and_refuses_until_it_has_its_own() {
    let _serial = serial();
    let c = Cluster::start();
    let web = c.ip("web");
    let (vip, first) = owned_service(&c);
    c.api
        .apply(&owned_slice("owned-a", &first, web))
        .expect("the controller's slice");
    expect_connect(&c, "client", vip, None);

    // Deleted and created again under the same name: a new uid. The old slice stays (nothing
    // collects it here), but it is the deleted service's: no backend, so refused at once.
    c.api
        .kubectl(&["delete", "service", "owned", "-n", "shop"], "")
        .expect("kubectl delete");
    let (vip, second) = owned_service(&c);
    assert_ne!(first, second, "a new service has a new uid");
    expect_connect(
        &c,
        "client",
        vip,
        Some(std::io::ErrorKind::ConnectionRefused),
    );

    // Its own slice gives it its backend back.
    c.api
        .apply(&owned_slice("owned-b", &second, web))
        .expect("the new service's slice");
    expect_connect(&c, "client", vip, None);
}

/// Addresses outside the cluster, on the lab's external network routed through the node.
const OUTSIDE: [Ipv4Addr; 2] = [EXT_ADDRS[0].1, EXT_ADDRS[1].1];

/// The network of [`OUTSIDE`], routed back to the pods. Dropping it removes the namespace and
/// the link.
fn outside(node: &NetNs) -> External {
    External::attach(node, &[POD_CIDR.into()]).expect("outside netns")
}

/// Service `name` without a selector (port 81 to 8080) and its EndpointSlice, pointing at
/// `backend`.
fn selectorless_service(name: &str, backend: Ipv4Addr) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: {name}, namespace: shop }}
spec: {{ ports: [ {{ name: http, port: 81, targetPort: 8080 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: {name}-1, namespace: shop, labels: {{ kubernetes.io/service-name: {name} }} }}
addressType: IPv4
ports: [ {{ name: http, port: 8080, protocol: TCP }} ]
endpoints: [ {{ addresses: [ "{backend}" ], conditions: {{ ready: true }} }} ]
"#
    )
}

/// client may reach service `ext` only.
const CLIENT_TO_EXT: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: client-to-ext, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: client } }
  egress: [ { toServices: [ { k8sService: { serviceName: ext, namespace: shop } } ] } ]
"#;

/// `toServices` naming a Service without a selector allows the addresses of its
/// EndpointSlices, at the address and through the ClusterIP, follows the slices as they
/// change, and allows nothing else.
#[test]
fn to_services_allows_the_endpoints_of_a_service_without_selector_and_nothing_else() {
    let _serial = serial();
    let c = Cluster::start();
    let outside = outside(c.agent.node());
    let [near, far] = OUTSIDE;
    let _servers: Vec<TcpServer> = OUTSIDE
        .iter()
        .map(|ip| {
            TcpServer::start(
                outside.netns(),
                SocketAddr::new((*ip).into(), PORT),
                "outside",
            )
            .expect("server")
        })
        .collect();
    let client = c.netns("client");
    c.expect_tcp(client, None, near, PORT, true, "no policy yet");
    assert!(
        c.reaches("client", far, PORT),
        "client -> far, no policy yet"
    );

    c.api
        .apply(&selectorless_service("ext", near))
        .expect("service and slice");
    c.apply_policy(CLIENT_TO_EXT);
    c.expect_tcp(client, None, near, PORT, true, "the slice's address");
    assert!(
        !c.reaches("client", far, PORT),
        "client -> far: no service's"
    );
    assert!(
        !c.reaches("client", c.ip("web"), PORT),
        "client -> web: no service's"
    );
    assert!(c.reaches("other", far, PORT), "other is not selected");
    let svc = c
        .api
        .api()
        .get("v1", "Service", Some("shop"), "ext")
        .expect("stored service");
    let vip: Ipv4Addr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
    c.expect_tcp(client, None, vip, 81, true, "through the ClusterIP");

    // The slice now points elsewhere: the policy follows it.
    c.api
        .apply(&selectorless_service("ext", far))
        .expect("the slice moved");
    c.expect_tcp(client, None, far, PORT, true, "the slice's new address");
    c.expect_tcp(client, None, near, PORT, false, "no longer the slice's");
}

/// web admits client, and the addresses of CIDR group `office`.
const WEB_FROM_OFFICE: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-from-office, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  ingress:
  - fromCIDRSet: [ { cidrGroupRef: office } ]
  - fromEndpoints: [ { matchLabels: { app: client } } ]
"#;

fn office(cidr: Ipv4Addr) -> String {
    format!(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumCIDRGroup\nmetadata: {{ name: office }}\nspec: {{ externalCIDRs: [ \"{cidr}/32\" ] }}\n"
    )
}

/// A policy naming a CIDR group that does not exist is in force (the agent stays ready, the
/// group admits no one: fail closed); the group, once created, admits its addresses only;
/// an address taken out of it, or the group deleted, is denied again.
#[test]
fn a_cidr_group_admits_its_addresses_and_fails_closed_when_missing_or_deleted() {
    let _serial = serial();
    let c = Cluster::start();
    let outside = outside(c.agent.node());
    let [near, far] = OUTSIDE;
    let web = c.ip("web");
    c.expect_tcp(
        outside.netns(),
        Some(near),
        web,
        PORT,
        true,
        "no policy yet",
    );
    assert!(
        c.answered(outside.netns(), Some(far), web, PORT),
        "far, no policy yet"
    );

    c.apply_policy(WEB_FROM_OFFICE);
    c.expect_tcp(
        outside.netns(),
        Some(near),
        web,
        PORT,
        false,
        "no group: no one",
    );
    // In force, not locked down: its other rule holds, and nothing is reported.
    assert!(c.reaches("client", web, PORT), "client -> web");
    assert!(!c.reaches("other", web, PORT), "other -> web");
    let status = c.agent.cli(&["status", "--verbose"]).expect("status");
    assert!(!status.contains("web-from-office"), "{status}");
    let status_call = CniCall::new("STATUS", "-")
        .unset("CNI_CONTAINERID")
        .unset("CNI_IFNAME")
        .conf(&c.agent.net_conf("1.1.0"));
    let (exit, out) = c.agent.cni(&status_call).expect("CNI STATUS");
    assert!(exit.success(), "CNI STATUS with a group missing: {out}");

    c.api.apply(&office(near)).expect("the group");
    c.expect_tcp(outside.netns(), Some(near), web, PORT, true, "in the group");
    assert!(
        !c.answered(outside.netns(), Some(far), web, PORT),
        "far: not in it"
    );

    c.api.apply(&office(far)).expect("the group changed");
    c.expect_tcp(
        outside.netns(),
        Some(far),
        web,
        PORT,
        true,
        "now in the group",
    );
    c.expect_tcp(
        outside.netns(),
        Some(near),
        web,
        PORT,
        false,
        "taken out of it",
    );

    c.api
        .kubectl(&["delete", "ciliumcidrgroup", "office"], "")
        .expect("kubectl delete");
    c.expect_tcp(
        outside.netns(),
        Some(far),
        web,
        PORT,
        false,
        "the group deleted",
    );
    assert!(
        c.reaches("client", web, PORT),
        "client -> web, group deleted"
    );
}

/// The cluster IP and port `port` of service `name` of namespace shop, as the API server
/// stored it.
fn cluster_ip(c: &Cluster, name: &str, port: u16) -> SocketAddr {
    let svc = c
        .api
        .api()
        .get("v1", "Service", Some("shop"), name)
        .expect("stored service");
    let vip: IpAddr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
    SocketAddr::new(vip, port)
}

/// A LoadBalancer service of another implementation, with source ranges, a traffic
/// distribution and an SCTP port, and an ExternalName service: fields real clusters hold.
const REAL_CLUSTER_SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: lb, namespace: shop }
spec:
  type: LoadBalancer
  loadBalancerClass: example.com/other-lb
  loadBalancerSourceRanges: [ 192.0.2.0/24 ]
  trafficDistribution: PreferClose
  selector: { app: web }
  ports:
  - { name: http, port: 84, targetPort: http, nodePort: 30084 }
  - { name: sig, port: 3868, protocol: SCTP, nodePort: 30086 }
---
apiVersion: v1
kind: Service
metadata: { name: alias, namespace: shop }
spec: { type: ExternalName, externalName: db.example.com }
"#;

#[test]
fn a_service_with_the_fields_real_clusters_hold_keeps_its_cluster_ip() {
    let _serial = serial();
    let c = Cluster::start();
    c.api.apply(REAL_CLUSTER_SERVICES).expect("services");
    let vip = cluster_ip(&c, "lb", 84);
    expect_connect(&c, "client", vip, None);
    // Only the SCTP port is left out, and said so; nothing is refused whole, the
    // ExternalName service has no frontend, and the node stays ready for new pods (a Degraded
    // module would fail CNI STATUS on every node for one Service's port).
    let status = wait_for("the SCTP frontends reported", || {
        c.agent
            .cli(&["status", "-v"])
            .ok()
            .filter(|s| s.contains("SCTP ports are not balanced"))
    });
    assert!(!status.contains("not supported"), "{status}");
    assert!(!status.contains("Degraded"), "{status}");
    let list = c.agent.cli(&["service", "list"]).expect("service list");
    assert!(!list.contains("shop/alias"), "{list}");
    assert!(list.contains(&format!("{vip}/TCP")), "{list}");
}

#[test]
fn prefer_close_sends_new_connections_to_the_backend_of_the_nodes_zone() {
    let _serial = serial();
    let mut c = Cluster::start();
    let other = c.ip("other");
    let server = TcpServer::start(
        c.netns("other"),
        SocketAddr::new(IpAddr::V4(other), PORT),
        "other",
    )
    .expect("server");
    c._servers.push(server);
    c.api
        .apply(&node_yaml(NODE, POD_CIDR, &[]).replace(
            "name: n1 }",
            "name: n1, labels: { topology.kubernetes.io/zone: a } }",
        ))
        .expect("the node's zone");
    let service = |distribution: &str| {
        format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{ name: near, namespace: shop }}
spec: {{ {distribution} ports: [ {{ name: http, port: 85, targetPort: 8080 }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: near-1, namespace: shop, labels: {{ kubernetes.io/service-name: near }} }}
addressType: IPv4
ports: [ {{ name: http, port: 8080, protocol: TCP }} ]
endpoints:
- {{ addresses: [ "{}" ], zone: a }}
- {{ addresses: [ "{other}" ], zone: b }}
"#,
            c.ip("web")
        )
    };
    let answers = |vip: SocketAddr| -> BTreeSet<String> {
        (0..30)
            .filter_map(|_| tcp_request(c.netns("client"), vip, PROBE_TIMEOUT).ok())
            .map(|r| r.banner)
            .collect()
    };
    // Without the preference, both zones serve.
    c.api.apply(&service("")).expect("service");
    let vip = cluster_ip(&c, "near", 85);
    eventually_or(
        "both backends answer",
        || c.agent.log(),
        || answers(vip).len() == 2,
    );
    // With it, only the node's zone takes new connections.
    c.api
        .apply(&service("trafficDistribution: PreferClose,"))
        .expect("service");
    eventually_or(
        "only the same-zone backend answers",
        || c.agent.log(),
        || answers(vip) == BTreeSet::from(["web".to_string()]),
    );
}

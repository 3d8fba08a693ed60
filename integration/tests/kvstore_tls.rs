//! kvstore mode against an etcd locked to the agents: a real etcd 3.4 serving `https://` with
//! `--client-cert-auth`, certificates made by the test (a CA for etcd and the agents, another
//! CA for an intruder), a real agent and the real operator configured with Cilium's etcd
//! configuration file (`kvstore-opt: etcd.config=FILE`).
//!
//! Root, serially, after `cargo build -p cellium-agent -p cellium-cni -p cellium-cli
//! -p cellium-operator` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test kvstore_tls -- --test-threads=1`.
//!
//! Every test makes its own namespaces, agent, API server, etcd and certificates (in a
//! temporary directory) and removes them through guards.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cellium_integration::k8s::node_yaml;
use cellium_integration::{Agent, AgentOptions, Etcd, EtcdTls, K8sApi, NetNs, wait};
use cellium_kvstore::keys;

const CONVERGE: Duration = Duration::from_secs(30);

/// The node's pod: its Node (at 192.0.2.1, the last part of its identity references in etcd)
/// goes before it.
const POD: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { nodeName: n1, containers: [ { name: c, image: x } ] }
"#;

/// etcd's password of its `root` user, which the tests use once etcd's auth is enabled.
const ROOT: &str = "--user=root:root-pw";

/// The certificates of one test, in a temporary directory removed on drop.
struct Pki {
    dir: tempfile::TempDir,
    tls: EtcdTls,
}

impl Pki {
    /// A CA (`ca.pem`) that signs etcd's certificate (for 127.0.0.1) and the agents'
    /// (`agent.pem`), and another CA (`other-ca.pem`) that signs `intruder.pem`.
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("cel-pki-")
            .tempdir()
            .expect("a directory for the certificates");
        let (ca_cert, issuer) = ca("cellium etcd CA");
        let (other_cert, other) = ca("another CA");
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a certificate");
            path
        };
        let issue = |name: &str, sans: Vec<String>, issuer: &rcgen::Issuer<rcgen::KeyPair>| {
            let key = rcgen::KeyPair::generate().expect("a key");
            let cert = rcgen::CertificateParams::new(sans)
                .expect("names")
                .signed_by(&key, issuer)
                .expect("signed");
            (
                write(&format!("{name}.pem"), cert.pem()),
                write(&format!("{name}.key"), key.serialize_pem()),
            )
        };
        let (server_cert, server_key) = issue(
            "etcd",
            vec!["127.0.0.1".into(), "localhost".into()],
            &issuer,
        );
        let (client_cert, client_key) = issue("agent", vec!["agent".into()], &issuer);
        issue("intruder", vec!["agent".into()], &other);
        let ca = write("ca.pem", ca_cert.pem());
        write("other-ca.pem", other_cert.pem());
        Pki {
            tls: EtcdTls {
                ca,
                server_cert,
                server_key,
                client_cert,
                client_key,
            },
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An etcd configuration file `name` for `etcd`, with the client certificate and key
    /// `client` (`agent`, `intruder`) or none.
    fn etcd_config(&self, name: &str, etcd: &Etcd, client: Option<&str>) -> PathBuf {
        let mut text = format!(
            "---\nendpoints:\n- {}\ntrusted-ca-file: '{}'\n",
            etcd.url(),
            self.tls.ca.display()
        );
        if let Some(c) = client {
            text.push_str(&format!(
                "cert-file: '{}'\nkey-file: '{}'\n",
                self.path(&format!("{c}.pem")).display(),
                self.path(&format!("{c}.key")).display()
            ));
        }
        let path = self.path(name);
        std::fs::write(&path, text).expect("write the etcd configuration");
        path
    }
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("self-signed");
    (cert, rcgen::Issuer::new(params, key))
}

/// An agent in Kubernetes mode on its node with an API server, `identity-allocation-mode:
/// kvstore`, and etcd on the node's loopback over TLS; not started.
struct Node {
    // Dropped first: the API server and etcd stop before their node goes.
    api: K8sApi,
    etcd: Etcd,
    pki: Pki,
    agent: Agent,
}

impl Node {
    fn new() -> Node {
        let agent = Agent::prepare(AgentOptions {
            pod_cidrs: Vec::new(),
            ..AgentOptions::default()
        })
        .expect("node");
        let pki = Pki::new();
        let etcd = Etcd::start_tls(agent.node(), "127.0.0.1".parse().unwrap(), pki.tls.clone())
            .expect("etcd with client-cert-auth");
        let api = K8sApi::start(agent.node()).expect("API server");
        let node = node_yaml("n1", "10.245.31.0/24", &[("InternalIP", "192.0.2.1")]);
        api.apply(&format!("{node}---\n{POD}"))
            .expect("node and pod");
        Node {
            api,
            etcd,
            pki,
            agent,
        }
    }

    /// The agent's environment: kvstore mode with etcd configuration file `config`.
    fn kvstore_env(&self, config: &Path) -> Vec<(String, String)> {
        let mut env = self.api.agent_env("n1");
        env.retain(|(k, _)| k != "CELLIUM_IDENTITY_ALLOCATION_MODE");
        env.extend([
            ("CELLIUM_IDENTITY_ALLOCATION_MODE".into(), "kvstore".into()),
            ("CELLIUM_KVSTORE".into(), "etcd".into()),
            (
                "CELLIUM_KVSTORE_OPT".into(),
                format!("etcd.config={}", config.display()),
            ),
            ("CELLIUM_KVSTORE_ALLOCATION_TIMEOUT".into(), "3s".into()),
        ]);
        env
    }

    fn start_with(&mut self, config: &Path) {
        self.agent.options_mut().env = self.kvstore_env(config);
        self.agent.start().expect("agent");
    }

    fn status(&self) -> String {
        self.agent
            .cli(&["status"])
            .unwrap_or_else(|e| e.to_string())
    }
}

fn eventually(what: &str, agent: &Agent, ok: impl FnMut() -> bool) {
    wait::eventually_or(what, || agent.log(), ok);
}

/// `cellium-operator` with `kvstore: etcd` and the etcd configuration file, its GC every
/// 500 ms, killed on drop; its log is printed then.
struct KvOperator {
    child: std::process::Child,
    log: PathBuf,
}

impl KvOperator {
    fn start(node: &Node, config: &Path) -> KvOperator {
        let program = node.agent.binaries().dir().join("cellium-operator");
        let log = node
            .agent
            .state_dir()
            .with_file_name("kvstore-operator.log");
        let out = std::fs::File::create(&log).expect("operator log");
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net={}", node.agent.node().path().display()))
            .arg("--")
            .arg(&program)
            .args([
                "run",
                "--k8s-api-server",
                &node.api.url(),
                "--operator-id",
                "op-1",
            ])
            .env("CELLIUM_KVSTORE", "etcd")
            .env(
                "CELLIUM_KVSTORE_OPT",
                format!("etcd.config={}", config.display()),
            )
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

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KvOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- operator log:\n{}", self.text());
        }
    }
}

#[test]
fn an_agent_and_the_operator_with_the_etcd_config_file_work_over_client_certificates() {
    let mut node = Node::new();
    // etcd is locked: a client without a certificate, or with another CA's, gets nothing.
    assert!(node.etcd.etcdctl_as(None, &["get", "x"]).is_err());
    let intruder = (node.pki.path("intruder.pem"), node.pki.path("intruder.key"));
    assert!(
        node.etcd
            .etcdctl_as(Some((&intruder.0, &intruder.1)), &["get", "x"])
            .is_err()
    );
    let config = node
        .pki
        .etcd_config("etcd.config", &node.etcd, Some("agent"));
    node.start_with(&config);
    let pod = NetNs::new().expect("pod netns");
    let ip = node
        .agent
        .add_pod(&pod, "cid-web", "shop", "web")
        .expect("ADD web: its identity numbered through etcd over TLS");

    // What the agent wrote is in etcd, read with the client certificate: its node entry,
    // the pod's ip entry, and its identity reference, which ends with the node's address.
    let etcd = &node.etcd;
    eventually("the node and ip entries in etcd", &node.agent, || {
        etcd.keys(&keys::node_key("n1")).is_ok_and(|k| k.len() == 1)
            && etcd
                .keys(&keys::ip_key(ip.into()))
                .is_ok_and(|k| k.len() == 1)
    });
    let entry: keys::IpEntry = serde_json::from_str(
        etcd.etcdctl(&["get", "--print-value-only", &keys::ip_key(ip.into())])
            .unwrap()
            .trim(),
    )
    .expect("an ip entry");
    let references = etcd.keys(keys::VALUE_PREFIX).unwrap();
    assert_eq!(references.len(), 1, "{references:?}");
    assert!(references[0].ends_with("/192.0.2.1"), "{references:?}");
    let number = etcd
        .etcdctl(&["get", "--print-value-only", &references[0]])
        .unwrap();
    assert_eq!(number.trim(), entry.id.to_string());
    let status = node.status();
    assert!(
        status.contains("kvstore etcd connected at https://127.0.0.1:2379"),
        "{status}"
    );

    // The operator, with the same file, collects an identity no node uses and keeps the
    // agent's.
    let ghost = keys::id_key(60001);
    etcd.etcdctl(&["put", &ghost, "k8s:app=ghost;"]).unwrap();
    let operator = KvOperator::start(&node, &config);
    eventually(
        "the unused identity collected by the operator",
        &node.agent,
        || etcd.keys(&ghost).is_ok_and(|k| k.is_empty()),
    );
    assert_eq!(
        etcd.keys(&keys::id_key(entry.id)).unwrap().len(),
        1,
        "{}",
        operator.text()
    );
}

#[test]
fn an_agent_without_a_client_certificate_or_with_another_ca_s_is_refused_and_says_so() {
    let mut node = Node::new();
    let no_cert = node.pki.etcd_config("no-cert.config", &node.etcd, None);
    let intruder = node
        .pki
        .etcd_config("intruder.config", &node.etcd, Some("intruder"));
    // The agent's own certificate, but trusting another CA than etcd's: etcd's certificate
    // is refused by the agent.
    let wrong_ca = node.pki.path("wrong-ca.config");
    let text = std::fs::read_to_string(node.pki.etcd_config("x", &node.etcd, Some("agent")));
    std::fs::write(&wrong_ca, text.unwrap().replace("/ca.pem", "/other-ca.pem")).unwrap();
    for config in [no_cert, intruder, wrong_ca] {
        let name = config.display().to_string();
        node.start_with(&config);
        let status = || node.status();
        eventually(
            &format!("{name}: the kvstore Degraded with the refusal"),
            &node.agent,
            || {
                let s = status();
                s.contains("kvstore.session Degraded: TLS with etcd at")
            },
        );
        let s = status();
        assert!(s.contains("kvstore etcd unreachable"), "{name}: {s}");
        // Nothing of it reached etcd.
        assert!(node.etcd.keys("cilium/").unwrap().is_empty(), "{name}");
        node.agent.stop().expect("agent stops");
    }
    // The same agent with the CA's certificate is let in, and the Degraded goes.
    let config = node
        .pki
        .etcd_config("agent.config", &node.etcd, Some("agent"));
    node.start_with(&config);
    eventually("connected with the right certificate", &node.agent, || {
        let s = node.status();
        s.contains("kvstore etcd connected") && !s.contains("TLS with etcd at")
    });
    eventually("its node entry in etcd", &node.agent, || {
        node.etcd
            .keys(&keys::node_key("n1"))
            .is_ok_and(|k| k.len() == 1)
    });
}

#[test]
fn an_etcd_configuration_that_cannot_work_stops_the_agent_and_the_operator_at_start() {
    let mut node = Node::new();
    let good = node
        .pki
        .etcd_config("etcd.config", &node.etcd, Some("agent"));
    let text = std::fs::read_to_string(&good).unwrap();
    // A key that is not the certificate's; an https endpoint without a CA; a missing file.
    let mismatch = node.pki.path("mismatch.config");
    std::fs::write(&mismatch, text.replace("agent.key", "intruder.key")).unwrap();
    let no_ca = node.pki.path("no-ca.config");
    let without_ca: String = text
        .lines()
        .filter(|l| !l.starts_with("trusted-ca-file"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&no_ca, without_ca).unwrap();
    let absent = node.pki.path("absent.config");
    let cases = [
        (&mismatch, "does not go with cert-file"),
        (&no_ca, "trusted-ca-file: missing"),
        (&absent, "No such file"),
    ];
    for (config, why) in cases {
        node.agent.options_mut().env = node.kvstore_env(config);
        let e = node.agent.start().expect_err("the agent refuses to start");
        let text = e.to_string();
        let named = format!("kvstore-opt etcd.config {}", config.display());
        assert!(text.contains(&named) && text.contains(why), "{why}: {text}");
        let mut operator = KvOperator::start(&node, config);
        let exited = wait_exit(&mut operator.child);
        let log = operator.text();
        assert!(
            exited.is_some_and(|s| !s.success()),
            "{why}: operator: {log}"
        );
        assert!(log.contains(&named) && log.contains(why), "{why}: {log}");
    }
    // Nothing was written.
    assert!(node.etcd.keys("cilium/").unwrap().is_empty());
}

/// etcd's own users on top of TLS: `root`, `agents` with read-write on the prefix `cilium/`
/// (every key an agent reads, writes and watches), `nobody` without any right; then auth on.
fn enable_auth(etcd: &Etcd) {
    let steps: [&[&str]; 8] = [
        &["user", "add", "root:root-pw"],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "cilium"],
        &[
            "role",
            "grant-permission",
            "cilium",
            "--prefix=true",
            "readwrite",
            "cilium/",
        ],
        &["user", "add", "agents:agents-pw"],
        &["user", "grant-role", "agents", "cilium"],
        &["user", "add", "nobody:nobody-pw"],
        &["auth", "enable"],
    ];
    for step in steps {
        etcd.etcdctl(step)
            .unwrap_or_else(|e| panic!("etcdctl {step:?}: {e}"));
    }
}

/// The keys under `prefix`, read as etcd's root.
fn root_keys(etcd: &Etcd, prefix: &str) -> Vec<String> {
    etcd.etcdctl(&[ROOT, "get", "--prefix", "--keys-only", prefix])
        .map(|out| {
            out.lines()
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_agent_with_etcd_s_user_and_password_works_and_a_wrong_one_is_refused_and_says_so() {
    let mut node = Node::new();
    enable_auth(&node.etcd);
    let base = node
        .pki
        .etcd_config("base.config", &node.etcd, Some("agent"));
    let dir = node.pki.path("");
    let with_user = |name: &str, user: &str, password: &str| {
        let text = std::fs::read_to_string(&base).unwrap();
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "{text}username: {user}
password: {password}
"
            ),
        )
        .unwrap();
        path
    };
    // A wrong password, and a user without rights on cilium/: refused, said, nothing written.
    let cases = [
        (
            with_user("wrong.config", "agents", "guess"),
            "authentication failed",
        ),
        (
            with_user("nobody.config", "nobody", "nobody-pw"),
            "permission denied",
        ),
    ];
    for (config, why) in cases {
        node.start_with(&config);
        eventually(&format!("{why}: Degraded with it"), &node.agent, || {
            let s = node.status();
            s.contains("kvstore.session Degraded: etcd at")
                && s.contains("refuses this node's user")
        });
        let status = node.status();
        assert!(status.contains(why), "{why}: {status}");
        assert!(!status.contains("nobody-pw"), "{status}");
        assert!(root_keys(&node.etcd, "cilium/").is_empty(), "{why}");
        node.agent.stop().expect("agent stops");
    }

    // The agents' user: its node entry and a pod's ip entry are written.
    let config = with_user("agents.config", "agents", "agents-pw");
    node.start_with(&config);
    let pod = NetNs::new().expect("pod netns");
    let ip = node
        .agent
        .add_pod(&pod, "cid-web", "shop", "web")
        .expect("ADD web: its identity numbered by etcd's user");
    let etcd = &node.etcd;
    eventually("the node and ip entries in etcd", &node.agent, || {
        root_keys(etcd, &keys::node_key("n1")).len() == 1
            && root_keys(etcd, &keys::ip_key(ip.into())).len() == 1
    });
    // etcd restarted forgets every token it gave: the agent asks for a new one with its
    // password, and goes on (a new pod's entry is written, its watches see others' keys).
    etcd.restart().expect("etcd restarts");
    let other = NetNs::new().expect("pod netns");
    let ip2 = node
        .agent
        .add_pod(&other, "cid-web2", "shop", "web")
        .expect("ADD after etcd's restart");
    eventually("the new ip entry after etcd's restart", &node.agent, || {
        root_keys(etcd, &keys::ip_key(ip2.into())).len() == 1
    });
    let status = node.status();
    assert!(
        status.contains("kvstore etcd connected") && !status.contains("refuses this node"),
        "{status}"
    );
}

/// The exit status of `child` once it exits, `None` if it runs on past [`CONVERGE`].
fn wait_exit(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let began = Instant::now();
    while began.elapsed() < CONVERGE {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

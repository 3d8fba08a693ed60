//! `deploy/`, as a cluster admin applies it: `kubectl apply -f deploy/` against the test API
//! server, the configuration files against the programs' own key lists, and the RBAC rules
//! against every call the agents and operators make in a running cluster whose API server
//! authorizes them by those rules.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test deploy -- --test-threads=1`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use cellium_integration::agent::Binaries;
use cellium_integration::cluster::{Cluster, ClusterOptions, Ipam};
use cellium_integration::reach::Probe::Tcp;
use cellium_integration::shop::{self, PORT};
use cellium_integration::{K8sApi, NetNs, serial};
use cellium_test_apiserver::rbac::AuditEntry;
use serde_json::Value;

const AGENT: &str = "system:serviceaccount:kube-system:cellium";
const OPERATOR: &str = "system:serviceaccount:kube-system:cellium-operator";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn kubectl_apply_deploy(api: &K8sApi) -> String {
    let dir = deploy_dir();
    api.kubectl(&["apply", "-f", dir.to_str().unwrap()], "")
        .expect("kubectl apply -f deploy/")
}

/// The keys a program's `hive` lists in its configuration (`    key = value` lines), read
/// with `config` given as its `--config`. Kubernetes mode needs a server URL to construct the
/// cells; none is contacted.
fn hive_keys(program: &Path, config: &Path) -> Result<BTreeSet<String>, String> {
    let out = Command::new(program)
        .args(["hive", "--config"])
        .arg(config)
        .args(["--k8s-api-server", "http://127.0.0.1:1"])
        .output()
        .expect("run hive");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(text
        .lines()
        .filter_map(|l| l.trim_start().split_once(" = "))
        .map(|(key, _)| key)
        .filter(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
        .map(str::to_string)
        .collect())
}

/// The top-level keys of a YAML config file.
fn file_keys(text: &str) -> BTreeSet<String> {
    let doc: serde_yaml::Mapping = serde_yaml::from_str(text).expect("a YAML mapping");
    doc.keys()
        .filter_map(|k| k.as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_manifests_apply_with_kubectl_and_the_config_names_every_key() {
    let _serial = serial();
    let node = NetNs::new().expect("namespace");
    let api = K8sApi::start(&node).expect("API server");
    let out = kubectl_apply_deploy(&api);
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/ciliumnetworkpolicies.cilium.io created",
        "customresourcedefinition.apiextensions.k8s.io/ciliumclusterwidenetworkpolicies.cilium.io created",
        "customresourcedefinition.apiextensions.k8s.io/ciliumnodes.cilium.io created",
        "customresourcedefinition.apiextensions.k8s.io/ciliumidentities.cilium.io created",
        "customresourcedefinition.apiextensions.k8s.io/ciliumendpoints.cilium.io created",
        "customresourcedefinition.apiextensions.k8s.io/ciliumcidrgroups.cilium.io created",
        "serviceaccount/cellium created",
        "clusterrole.rbac.authorization.k8s.io/cellium created",
        "clusterrolebinding.rbac.authorization.k8s.io/cellium created",
        "serviceaccount/cellium-operator created",
        "clusterrole.rbac.authorization.k8s.io/cellium-operator created",
        "clusterrolebinding.rbac.authorization.k8s.io/cellium-operator created",
        "role.rbac.authorization.k8s.io/cellium-operator-leader-election created",
        "rolebinding.rbac.authorization.k8s.io/cellium-operator-leader-election created",
        "configmap/cellium-config created",
        "daemonset.apps/cellium created",
        "deployment.apps/cellium-operator created",
    ] {
        assert!(out.contains(object), "{object} missing from:\n{out}");
    }
    assert_eq!(out.lines().count(), 17, "{out}");
    // Applying again changes nothing.
    let again = kubectl_apply_deploy(&api);
    assert_eq!(again.matches(" unchanged").count(), 17, "{again}");

    // The DaemonSet: host network, privileged, the node's bpffs shared both ways, the CNI
    // directories for the init container, the ServiceAccount the RBAC rules are bound to.
    let ds = api
        .api()
        .get("apps/v1", "DaemonSet", Some("kube-system"), "cellium")
        .expect("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], "cellium");
    let agent = &pod["containers"][0];
    assert_eq!(agent["securityContext"]["privileged"], true);
    let mount = |c: &Value, path: &str| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .cloned()
            .unwrap_or_else(|| panic!("no mount at {path} in {c}"))
    };
    assert_eq!(
        mount(agent, "/sys/fs/bpf")["mountPropagation"],
        "Bidirectional"
    );
    mount(agent, "/run/cellium");
    mount(agent, "/var/run/netns");
    let install = &pod["initContainers"][0];
    mount(install, "/host/opt/cni/bin");
    mount(install, "/host/etc/cni/net.d");
    let operator = api
        .api()
        .get(
            "apps/v1",
            "Deployment",
            Some("kube-system"),
            "cellium-operator",
        )
        .expect("Deployment");
    assert_eq!(operator["spec"]["replicas"], 2);
    assert_eq!(
        operator["spec"]["template"]["spec"]["serviceAccountName"],
        "cellium-operator"
    );

    // Each program's file names every key the program knows, and nothing it does not.
    let config = api
        .api()
        .get("v1", "ConfigMap", Some("kube-system"), "cellium-config")
        .expect("ConfigMap");
    let binaries = Binaries::find().expect("binaries");
    let files = tempfile::tempdir().unwrap();
    for (program, file) in [
        ("cellium-agent", "cellium-agent.yaml"),
        ("cellium-operator", "cellium-operator.yaml"),
    ] {
        let text = config["data"][file].as_str().expect(file);
        let path = files.path().join(file);
        std::fs::write(&path, text).unwrap();
        let program = binaries.dir().join(program);
        let known = hive_keys(&program, &path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let given = file_keys(text);
        let missing: Vec<_> = known.difference(&given).collect();
        assert!(missing.is_empty(), "{file} lacks {missing:?}");
        assert!(known.len() > 15, "{known:?}");
        // A key the program does not know stops it, naming the key: the check above can fail.
        let bad = files.path().join(format!("bad-{file}"));
        std::fs::write(&bad, format!("{text}no-such-key: 1\n")).unwrap();
        let err = hive_keys(&program, &bad).expect_err("an unknown key is refused");
        assert!(err.contains("no-such-key"), "{err}");
    }
    // The CNI configuration calls the agent where the agent serves.
    let conflist: Value =
        serde_json::from_str(config["data"]["05-cellium.conflist"].as_str().unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["type"], "cellium-cni");
    // The runtime passes hostPorts as port mappings to the plugin, which serves them: no
    // portmap plugin in the chain.
    assert_eq!(conflist["plugins"][0]["capabilities"]["portMappings"], true);
    assert_eq!(conflist["plugins"].as_array().map(Vec::len), Some(1));
    let agent_config: serde_yaml::Mapping =
        serde_yaml::from_str(config["data"]["cellium-agent.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        conflist["plugins"][0]["socket"].as_str(),
        agent_config
            .get("api-socket")
            .and_then(serde_yaml::Value::as_str)
    );
    // Without kube-proxy: the node's processes balanced at connect(), on the host's cgroup v2
    // root mounted where cgroup-root says.
    let key = |k: &str| {
        agent_config
            .get(k)
            .cloned()
            .unwrap_or_else(|| panic!("no {k}"))
    };
    assert_eq!(key("bpf-lb-sock"), serde_yaml::Value::Bool(true));
    let cgroup_root = key("cgroup-root");
    let cgroup = mount(agent, cgroup_root.as_str().expect("a path"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == cgroup["name"])
        .expect("the cgroup volume");
    assert_eq!(volume["hostPath"]["path"], "/sys/fs/cgroup");
    // The API server's own address, for both programs, from an optional ConfigMap.
    for (what, container) in [
        ("agent", agent),
        (
            "operator",
            &operator["spec"]["template"]["spec"]["containers"][0],
        ),
    ] {
        let env = container["env"].as_array().expect("env");
        for var in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
            let from = env
                .iter()
                .find(|e| e["name"] == var)
                .unwrap_or_else(|| panic!("{what} lacks {var}"));
            let reference = &from["valueFrom"]["configMapKeyRef"];
            assert_eq!(reference["name"], "cellium-k8s-service-host", "{what}");
            assert_eq!(reference["optional"], true, "{what}");
        }
    }
}

/// The (verb, group, resource) triples the rules of the ClusterRole or Role `name` grant.
fn granted(api: &K8sApi, kind: &str, namespace: Option<&str>, name: &str) -> Vec<String> {
    let role = api
        .api()
        .get("rbac.authorization.k8s.io/v1", kind, namespace, name)
        .unwrap_or_else(|| panic!("{kind} {name}"));
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for verb in strings(&rule["verbs"]) {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    out.push(format!("{verb} {group}/{resource}"));
                }
            }
        }
    }
    out
}

fn used(audit: &[AuditEntry], user: &str) -> BTreeSet<String> {
    audit
        .iter()
        .filter(|e| e.user == user && e.allowed)
        .map(|e| {
            let a = &e.attributes;
            format!("{} {}/{}", a.verb, a.group, a.resource_path())
        })
        .collect()
}

fn cep(cluster: &Cluster, name: &str) -> Option<Value> {
    cluster
        .api()
        .api()
        .get("cilium.io/v2", "CiliumEndpoint", Some("shop"), name)
}

fn denied(audit: &[AuditEntry]) -> Vec<&AuditEntry> {
    audit.iter().filter(|e| !e.allowed).collect()
}

/// Rights granted and never used by the cluster run below, each with why it is still needed.
const USED_ELSEWHERE: &[(&str, &str)] = &[
    (
        "get /pods",
        "CNI ADD reads a pod the watch has not brought yet",
    ),
    (
        "get cilium.io/ciliumidentities",
        "an agent reads the identity another agent created first",
    ),
    (
        "get cilium.io/ciliumendpoints",
        "an agent reads its CiliumEndpoint again on a write conflict",
    ),
];

#[test]
fn the_rbac_rules_cover_every_call_of_the_agents_and_operators() {
    let _serial = serial();
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 2,
        // Room for two nodes' CIDRs: a third node exhausts the pool.
        ipam: Ipam::ClusterPool {
            cidr: "10.245.0.0/23".into(),
            mask_size: 24,
        },
        start_agents: false,
        operator_env: [
            "CELLIUM_IDENTITY_GC_INTERVAL",
            "CELLIUM_ENDPOINT_GC_INTERVAL",
            "CELLIUM_NODES_GC_INTERVAL",
        ]
        .iter()
        .map(|k| (k.to_string(), "1s".to_string()))
        .collect(),
        ..ClusterOptions::default()
    })
    .expect("cluster");
    kubectl_apply_deploy(cluster.api());
    cluster.api().api().enable_rbac();
    cluster.use_service_accounts().expect("service accounts");
    cluster.start_operator("op-1", 0).expect("operator 1");
    cluster.start_operator("op-2", 1).expect("operator 2");
    for i in 0..2 {
        cluster.launch_agent(i).expect("agent");
    }
    for i in 0..2 {
        cluster.agent_mut(i).wait_ready().expect("agent ready");
    }

    // A cluster's life: pods on both nodes, a policy, a label changed, a service, the pool
    // exhausted, a pod removed, a pod object
    // deleted behind its node's back, a node leaving, the leading operator killed.
    shop::add_to(&mut cluster).unwrap();
    let _server = shop::serve_web(&cluster).expect("server");
    cluster
        .apply_policy(
            "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: web, namespace: shop}\n\
             spec:\n  endpointSelector: {matchLabels: {app: web}}\n  ingress:\n  - fromEndpoints: [{matchLabels: {app: client}}]\n",
        )
        .unwrap();
    cluster
        .eventually("client reaches web across nodes", || {
            cluster.reaches("shop/client", "shop/web", Tcp(PORT))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    assert!(!cluster.reaches("shop/other", "shop/web", Tcp(PORT)));
    // A label change moves the client to a new identity: its CiliumEndpoint is updated.
    cluster
        .api()
        .kubectl(&["label", "pod", "client", "-n", "shop", "tier=front"], "")
        .unwrap();
    cluster
        .eventually(
            "the client's CiliumEndpoint carries its new identity",
            || {
                cep(&cluster, "client").is_some_and(|c| {
                    c["status"]["identity"]["labels"]
                        .to_string()
                        .contains("k8s:tier=front")
                })
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\n\
             spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: {PORT}}}]}}\n"
        ))
        .unwrap();
    // A third node finds the pool exhausted: the operator says so in its CiliumNode's status.
    cluster
        .apply(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n3}\n---\n\
             apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata: {name: n3}\nspec: {}\n",
        )
        .unwrap();
    cluster
        .eventually("the exhausted pool is reported on n3", || {
            cluster
                .api()
                .api()
                .get("cilium.io/v2", "CiliumNode", None, "n3")
                .is_some_and(|n| n["status"]["ipam"]["operator-status"]["error"].is_string())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    // The pod's network removed (CNI DEL): its agent deletes its CiliumEndpoint. Its object
    // goes after, so that the operator's collection cannot be first.
    cluster.remove_pod_network("shop/other").unwrap();
    cluster
        .eventually("the removed pod's CiliumEndpoint is deleted", || {
            cep(&cluster, "other").is_none()
        })
        .unwrap();
    cluster
        .api()
        .kubectl(&["delete", "pod", "other", "-n", "shop"], "")
        .unwrap();
    // The Pod object goes without a CNI DEL: the operator collects its CiliumEndpoint. The
    // endpoint keeps the pod's labels, and so its identity, until the runtime's DEL; then
    // the operator collects the identity no endpoint uses any more.
    let web_identity = cep(&cluster, "web").unwrap()["status"]["identity"]["id"].clone();
    cluster
        .api()
        .kubectl(&["delete", "pod", "web", "-n", "shop"], "")
        .unwrap();
    cluster
        .eventually("the operator collects web's CiliumEndpoint", || {
            cep(&cluster, "web").is_none()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    cluster.remove_pod_network("shop/web").unwrap();
    let identity = web_identity.to_string();
    cluster
        .eventually("the operator collects web's identity", || {
            cluster
                .api()
                .api()
                .get("cilium.io/v2", "CiliumIdentity", None, &identity)
                .is_none()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    // n2 leaves: the operator collects its CiliumNode.
    cluster
        .api()
        .kubectl(&["delete", "node", "n2"], "")
        .unwrap();
    cluster
        .eventually("the operator collects n2's CiliumNode", || {
            cluster
                .api()
                .api()
                .get("cilium.io/v2", "CiliumNode", None, "n2")
                .is_none()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    // The leader goes: the other operator takes the Lease over.
    let leader = cluster.lease_holder().expect("a leader");
    let other = if leader == "op-1" { "op-2" } else { "op-1" };
    for op in cluster.operators_mut() {
        if op.id() == leader {
            op.kill();
        }
    }
    cluster
        .eventually("the other operator leads", || {
            cluster.lease_holder().as_deref() == Some(other)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));

    // Nothing was refused, and every right granted was used.
    let audit = cluster.api().api().audit();
    let refused = denied(&audit);
    assert!(
        refused.is_empty(),
        "refused by deploy/'s RBAC: {refused:#?}\n{}",
        cluster.logs()
    );
    for (user, roles) in [
        (AGENT, vec![("ClusterRole", None, "cellium")]),
        (
            OPERATOR,
            vec![
                ("ClusterRole", None, "cellium-operator"),
                (
                    "Role",
                    Some("kube-system"),
                    "cellium-operator-leader-election",
                ),
            ],
        ),
    ] {
        let used = used(&audit, user);
        let unused: Vec<String> = roles
            .iter()
            .flat_map(|(kind, ns, name)| granted(cluster.api(), kind, *ns, name))
            .filter(|g| !used.contains(g))
            .filter(|g| !USED_ELSEWHERE.iter().any(|(u, _)| u == g))
            .collect();
        assert!(
            unused.is_empty(),
            "{user} is granted and never used {unused:?} (used: {used:#?})"
        );
    }

    // Take a right away: the agent's call is refused, it says so, and once the rule is back
    // it writes what it could not.
    let role = std::fs::read_to_string(deploy_dir().join("10-agent-rbac.yaml")).unwrap();
    let cut = role.replace(
        "verbs: [get, list, watch, create, update, delete]",
        "verbs: [get, list, watch, update, delete]",
    );
    assert_ne!(
        cut, role,
        "the CiliumEndpoint rule is where the test expects it"
    );
    cluster.apply(&cut).unwrap();
    cluster.add_pod(0, "shop/late", "app=late", &[]).unwrap();
    cluster
        .eventually("the agent's create is refused", || {
            denied(&cluster.api().api().audit()).iter().any(|e| {
                e.user == AGENT
                    && e.attributes.verb == "create"
                    && e.attributes.resource == "ciliumendpoints"
            })
        })
        .unwrap();
    assert!(cep(&cluster, "late").is_none());
    cluster
        .eventually("the agent's log names the refusal", || {
            cluster
                .agent(0)
                .log()
                .contains("cannot create resource \"ciliumendpoints\"")
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    kubectl_apply_deploy(cluster.api());
    cluster
        .eventually("the agent writes the endpoint once allowed", || {
            cep(&cluster, "late").is_some()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}

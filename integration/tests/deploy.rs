//! `deploy/`, as a cluster admin applies it: `kubectl apply -k deploy/` and each overlay
//! against the test API server, the configuration files and the overlays' keys against the
//! programs' own key lists, and the RBAC rules against every call the agents and operators
//! make in a running cluster whose API server authorizes them by those rules.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test deploy -- --test-threads=1`.

use std::collections::{BTreeMap, BTreeSet};
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
    kubectl_apply_kustomized(api, &deploy_dir())
}

/// `kubectl apply -k dir`: the kustomization rendered and applied.
fn kubectl_apply_kustomized(api: &K8sApi, dir: &Path) -> String {
    api.kubectl(&["apply", "-k", dir.to_str().unwrap()], "")
        .unwrap_or_else(|e| panic!("kubectl apply -k {}: {e}", dir.display()))
}

/// The configuration a program's `hive` lists (`    key = value` lines, the value as it
/// prints it), read with `config` as its `--config` and `dir`, if any, as its `--config-dir`.
/// Kubernetes mode needs a server URL to construct the cells; none is contacted.
fn hive_config(
    program: &Path,
    config: &Path,
    dir: Option<&Path>,
) -> Result<BTreeMap<String, String>, String> {
    let mut cmd = Command::new(program);
    cmd.args(["hive", "--config"]).arg(config);
    if let Some(dir) = dir {
        cmd.arg("--config-dir").arg(dir);
    }
    let out = cmd
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
        .filter(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn hive_keys(program: &Path, config: &Path) -> Result<BTreeSet<String>, String> {
    Ok(hive_config(program, config, None)?.into_keys().collect())
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
        "configmap/cellium-agent-overrides created",
        "configmap/cellium-operator-overrides created",
        "daemonset.apps/cellium created",
        "deployment.apps/cellium-operator created",
    ] {
        assert!(out.contains(object), "{object} missing from:\n{out}");
    }
    assert_eq!(out.lines().count(), 19, "{out}");
    // Applying again changes nothing.
    let again = kubectl_apply_deploy(&api);
    assert_eq!(again.matches(" unchanged").count(), 19, "{again}");

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
    let role = std::fs::read_to_string(deploy_dir().join("base/10-agent-rbac.yaml")).unwrap();
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

/// `kubectl kustomize dir`: the objects it renders.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a rendered object"))
        .collect()
}

/// The RBAC objects among `objects`, by kind and name.
fn rbac(objects: &[Value]) -> BTreeMap<String, Value> {
    objects
        .iter()
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("rbac.authorization.k8s.io/"))
                || o["kind"] == "ServiceAccount"
        })
        .map(|o| {
            (
                format!("{} {}", o["kind"], o["metadata"]["name"]),
                o.clone(),
            )
        })
        .collect()
}

/// A set-up: a kustomization directory and the keys it must set in the agent's and the
/// operator's overrides.
struct SetUp {
    dir: PathBuf,
    agent: &'static [&'static str],
    operator: &'static [&'static str],
}

/// The overlays, and the components that are not the routing mode's all at once on native
/// routing, in a kustomization of the test's (kustomize wants paths relative to it).
fn set_ups(composed: &Path) -> Vec<SetUp> {
    let overlays = deploy_dir().join("overlays");
    let mut names: Vec<String> = std::fs::read_dir(&overlays)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["dual-stack", "kvstore", "native-routing", "tunnel"]);
    let up = "../".repeat(composed.components().count() - 1);
    let deploy = deploy_dir().canonicalize().unwrap();
    let rel = |p: &str| {
        format!(
            "{up}{}",
            deploy.join(p).display().to_string().trim_start_matches('/')
        )
    };
    std::fs::write(
        composed.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{}]\n\
             components: [{}, {}, {}]\n",
            rel("base"),
            rel("components/native-routing"),
            rel("components/dual-stack"),
            rel("components/kvstore"),
        ),
    )
    .unwrap();
    let set_up = |dir: PathBuf, agent, operator| SetUp {
        dir,
        agent,
        operator,
    };
    vec![
        set_up(
            overlays.join("tunnel"),
            &["routing-mode", "tunnel-protocol", "tunnel-port"],
            &[],
        ),
        set_up(
            overlays.join("native-routing"),
            &["routing-mode", "ipv4-native-routing-cidr"],
            &[],
        ),
        set_up(
            overlays.join("kvstore"),
            &[
                "routing-mode",
                "tunnel-protocol",
                "tunnel-port",
                "identity-allocation-mode",
                "kvstore",
                "kvstore-opt",
            ],
            &["kvstore", "kvstore-opt"],
        ),
        set_up(
            overlays.join("dual-stack"),
            &[
                "routing-mode",
                "tunnel-protocol",
                "tunnel-port",
                "service-cidr",
            ],
            &["cluster-pool-ipv6-cidr", "cluster-pool-ipv6-mask-size"],
        ),
        set_up(
            composed.to_path_buf(),
            &[
                "routing-mode",
                "ipv4-native-routing-cidr",
                "identity-allocation-mode",
                "kvstore",
                "kvstore-opt",
                "service-cidr",
            ],
            &[
                "kvstore",
                "kvstore-opt",
                "cluster-pool-ipv6-cidr",
                "cluster-pool-ipv6-mask-size",
            ],
        ),
    ]
}

/// A client certificate, its key and a CA file, as the Secret cellium-etcd-secrets holds them.
fn etcd_secrets(dir: &Path) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["cellium".to_string()])
        .expect("names")
        .self_signed(&key)
        .expect("a certificate");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("etcd-client-ca.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("etcd-client.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("etcd-client.key"), key.serialize_pem()).unwrap();
}

/// The container's volumes as the kubelet would mount them, under `root`: each ConfigMap's
/// keys and each Secret's files at their mount path, with `/var/lib/...` paths the files name
/// moved under `root` too. Returns the program's `--config` and `--config-dir` arguments.
fn mount_volumes(api: &K8sApi, workload: &Value, root: &Path) -> (PathBuf, PathBuf) {
    let pod = &workload["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let command: Vec<&str> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let arg = |flag: &str| {
        let at = command.iter().position(|a| *a == flag);
        let value = at.and_then(|i| command.get(i + 1));
        root.join(
            value
                .unwrap_or_else(|| panic!("{flag} in {command:?}"))
                .trim_start_matches('/'),
        )
    };
    let rewrite = |text: &str| text.replace("/var/lib/", &format!("{}/var/lib/", root.display()));
    for mount in container["volumeMounts"].as_array().unwrap() {
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {mount}"));
        let at = root.join(mount["mountPath"].as_str().unwrap().trim_start_matches('/'));
        if let Some(name) = volume["configMap"]["name"].as_str() {
            let map = api
                .api()
                .get("v1", "ConfigMap", Some("kube-system"), name)
                .unwrap_or_else(|| panic!("the ConfigMap {name} a volume names"));
            std::fs::create_dir_all(&at).unwrap();
            for (key, value) in map["data"].as_object().into_iter().flatten() {
                std::fs::write(at.join(key), rewrite(value.as_str().unwrap())).unwrap();
            }
        } else if volume["secret"]["secretName"] == "cellium-etcd-secrets" {
            etcd_secrets(&at);
        }
    }
    (arg("--config"), arg("--config-dir"))
}

/// Every overlay under `deploy/overlays`, and the components together, render with `kubectl
/// kustomize`, apply with `kubectl apply -k`, keep the base's RBAC, set the keys they are for
/// in the overrides ConfigMaps, and each program, given the volumes its workload mounts,
/// accepts the configuration and says the overridden values.
#[test]
fn every_overlay_applies_and_the_programs_take_its_keys() {
    let _serial = serial();
    let node = NetNs::new().expect("namespace");
    let api = K8sApi::start(&node).expect("API server");
    let binaries = Binaries::find().expect("binaries");
    let base_rbac = rbac(&kustomize(&deploy_dir().join("base")));
    assert_eq!(base_rbac.len(), 8, "{:?}", base_rbac.keys());
    let composed = tempfile::tempdir().unwrap();
    for set_up in set_ups(composed.path()) {
        let name = set_up.dir.display().to_string();
        assert_eq!(
            rbac(&kustomize(&set_up.dir)),
            base_rbac,
            "{name} changes the RBAC"
        );
        let out = kubectl_apply_kustomized(&api, &set_up.dir);
        assert!(!out.contains("error"), "{name}: {out}");
        for (program, overrides, kind, workload, keys) in [
            (
                "cellium-agent",
                "cellium-agent-overrides",
                "DaemonSet",
                "cellium",
                set_up.agent,
            ),
            (
                "cellium-operator",
                "cellium-operator-overrides",
                "Deployment",
                "cellium-operator",
                set_up.operator,
            ),
        ] {
            let set = api
                .api()
                .get("v1", "ConfigMap", Some("kube-system"), overrides)
                .unwrap_or_else(|| panic!("{name}: {overrides}"));
            let set: BTreeMap<String, String> = set["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            let set_keys: Vec<&str> = set.keys().map(String::as_str).collect();
            let mut want = keys.to_vec();
            want.sort();
            assert_eq!(set_keys, want, "{name}: {overrides}");
            let workload = api
                .api()
                .get("apps/v1", kind, Some("kube-system"), workload)
                .unwrap();
            let root = tempfile::tempdir().unwrap();
            let (config, dir) = mount_volumes(&api, &workload, root.path());
            let said = hive_config(&binaries.dir().join(program), &config, Some(&dir))
                .unwrap_or_else(|e| panic!("{name}: {program} refuses: {e}"));
            // Each value set is the one the program runs with (lists as `[..]`, maps as `{..}`, strings
            // quoted: each comma-separated part, paths as mounted).
            for (key, value) in &set {
                let has = &said[key];
                for part in value.split([',', '=']) {
                    let part = part
                        .trim()
                        .replace("/var/lib/", &format!("{}/var/lib/", root.path().display()));
                    assert!(
                        has.contains(&part),
                        "{name}: {program} has {key} = {has}, not {value}"
                    );
                }
            }
            if program == "cellium-agent" && keys.contains(&"routing-mode") {
                let want = if keys.contains(&"ipv4-native-routing-cidr") {
                    "native"
                } else {
                    "tunnel"
                };
                assert_eq!(said["routing-mode"], format!("\"{want}\""), "{name}");
            }
        }
    }
    // A key the program does not know, set in the overrides, stops it naming the key.
    let workload = api
        .api()
        .get("apps/v1", "DaemonSet", Some("kube-system"), "cellium")
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let (config, dir) = mount_volumes(&api, &workload, root.path());
    std::fs::write(dir.join("no-such-key"), "1").unwrap();
    let err = hive_config(&binaries.dir().join("cellium-agent"), &config, Some(&dir))
        .expect_err("an unknown key is refused");
    assert!(err.contains("no-such-key"), "{err}");
}

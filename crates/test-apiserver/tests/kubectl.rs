//! kubectl 1.32 against the test API server: the commands the crate docs promise.
//! Skipped, with a printed reason, when `/usr/bin/kubectl` is absent.

use cellium_test_apiserver::ApiServer;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

const KUBECTL: &str = "/usr/bin/kubectl";

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: team
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: team
  labels: {app: web}
spec:
  containers:
  - name: c
    image: nginx:1
    ports: [{containerPort: 80}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: team
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: team}
spec:
  podSelector: {}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cnp, namespace: team}
spec:
  endpointSelector: {matchLabels: {app: web}}
---
apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata: {name: office, labels: {site: hq}}
spec:
  externalCIDRs: [192.0.2.0/24]
"#;

const MULTI_BEFORE: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: multi, namespace: team, labels: {a: "1", b: "2"}}
spec:
  containers:
  - {name: c1, image: i1, ports: [{containerPort: 80}, {containerPort: 81}]}
  - {name: c2, image: i2}
"#;

const MULTI_AFTER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: multi, namespace: team, labels: {a: "1"}}
spec:
  containers:
  - {name: c2, image: i2b}
  - {name: c1, image: i1, ports: [{containerPort: 81}]}
"#;

struct Kubectl {
    server: String,
    /// kubectl caches discovery per server address: a fresh directory per test run.
    cache: String,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(KUBECTL);
        // A kubeconfig that does not exist: kubectl must not read the user's.
        cmd.arg(format!("--server={}", self.server))
            .arg(format!("--cache-dir={}", self.cache))
            .args(args)
            .env("KUBECONFIG", "/nonexistent-cellium-test")
            .env("HOME", std::env::temp_dir())
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(Duration::from_secs(30), self.command(args).output())
            .await
            .expect("kubectl finishes within 30 s")
            .expect("kubectl runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        (out.status.success(), stdout, stderr)
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{stdout}\n{stderr}");
        stdout
    }
}

/// A server on a port of the loopback, kubectl pointed at it, and a directory for its cache
/// and the test's files.
fn serve() -> (ApiServer, Kubectl, tempfile::TempDir) {
    let server = ApiServer::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl {
        server: format!("http://{}", listener.local_addr().unwrap()),
        cache: dir.path().join("cache").to_str().unwrap().to_string(),
    };
    server.serve(listener).unwrap();
    (server, k, dir)
}

fn labels(server: &ApiServer) -> Value {
    server
        .get("v1", "Pod", Some("team"), "web")
        .expect("pod web exists")["metadata"]["labels"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_commands() {
    if !Path::new(KUBECTL).exists() {
        println!("skipped: {KUBECTL} is not installed");
        return;
    }
    let (server, k, dir) = serve();
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, OBJECTS).unwrap();
    let file = file.to_str().unwrap();

    // Validation (strict by default) is left to the server: the OpenAPI v3 stub declares
    // `fieldValidation` on every kind's PATCH.
    let out = k.ok(&["apply", "-f", file]).await;
    assert!(
        out.contains("pod/web created")
            && out.contains("ciliumnetworkpolicy.cilium.io/cnp created")
            && out.contains("ciliumcidrgroup.cilium.io/office created"),
        "{out}"
    );
    let svc = server.get("v1", "Service", Some("team"), "web").unwrap();
    assert!(
        svc["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .starts_with("10.9"),
        "{svc}"
    );
    assert!(
        server
            .get("cilium.io/v2", "CiliumNetworkPolicy", Some("team"), "cnp")
            .is_some()
    );

    // Reads: plain JSON lists where kubectl asks for Tables.
    let pods: Value =
        serde_json::from_str(&k.ok(&["get", "pods", "-n", "team", "-o", "json"]).await).unwrap();
    assert_eq!(pods["items"][0]["metadata"]["name"], "web");
    let table = k.ok(&["get", "pods", "-A"]).await;
    assert!(table.contains("web"), "{table}");
    let ns = k.ok(&["get", "ns"]).await;
    for name in ["default", "kube-system", "kube-public", "team"] {
        assert!(ns.contains(name), "{ns}");
    }
    let all = k.ok(&["get", "all", "-n", "team"]).await;
    assert!(
        all.contains("pod/web") && all.contains("service/web"),
        "{all}"
    );
    let by_short_name = k.ok(&["get", "cnp", "-n", "team", "-o", "name"]).await;
    assert_eq!(by_short_name.trim(), "ciliumnetworkpolicy.cilium.io/cnp");
    let group: Value =
        serde_json::from_str(&k.ok(&["get", "ccg", "office", "-o", "json"]).await).unwrap();
    assert_eq!(group["apiVersion"], "cilium.io/v2alpha1");
    assert_eq!(group["spec"]["externalCIDRs"][0], "192.0.2.0/24");
    let resources = k.ok(&["api-resources"]).await;
    for kind in [
        "CiliumNetworkPolicy",
        "CiliumClusterwideNetworkPolicy",
        "CiliumNode",
        "CiliumIdentity",
        "CiliumEndpoint",
        "CiliumCIDRGroup",
    ] {
        assert!(resources.contains(kind), "{resources}");
    }

    // Writes.
    k.ok(&[
        "label",
        "pod",
        "web",
        "-n",
        "team",
        "app=other",
        "--overwrite",
    ])
    .await;
    assert_eq!(labels(&server)["app"], "other");
    // Client-side apply again with a changed label: a strategic merge patch from the
    // last-applied annotation.
    std::fs::write(
        file,
        OBJECTS.replace("labels: {app: web}", "labels: {app: web2, tier: fe}"),
    )
    .unwrap();
    let out = k.ok(&["apply", "-f", file]).await;
    assert!(
        out.contains("pod/web configured") && out.contains("service/web unchanged"),
        "{out}"
    );
    assert_eq!(
        labels(&server),
        serde_json::json!({"app": "web2", "tier": "fe"})
    );
    std::fs::write(
        file,
        OBJECTS.replace("labels: {app: web}", "labels: {app: ssa}"),
    )
    .unwrap();
    let out = k.ok(&["apply", "--server-side", "-f", file]).await;
    assert!(out.contains("pod/web serverside-applied"), "{out}");
    assert_eq!(labels(&server)["app"], "ssa");
    // --validate=false skips the OpenAPI lookups altogether.
    k.ok(&["apply", "--validate=false", "-f", file]).await;
    k.ok(&[
        "patch",
        "pod",
        "web",
        "-n",
        "team",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"m":"1"}}}"#,
    ])
    .await;
    assert_eq!(labels(&server)["m"], "1");
    k.ok(&[
        "patch",
        "pod",
        "web",
        "-n",
        "team",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/labels/m"}]"#,
    ])
    .await;
    assert!(labels(&server).get("m").is_none());
    k.ok(&[
        "patch",
        "pod",
        "web",
        "-n",
        "team",
        "-p",
        r#"{"spec":{"containers":[{"name":"c","image":"nginx:2"}]}}"#,
    ])
    .await;
    let pod = server.get("v1", "Pod", Some("team"), "web").unwrap();
    assert_eq!(pod["spec"]["containers"][0]["image"], "nginx:2");
    assert_eq!(
        pod["spec"]["containers"][0]["ports"][0]["containerPort"],
        80
    );

    let (ok, _, stderr) = k.run(&["create", "-f", file]).await;
    assert!(
        !ok && stderr.contains("AlreadyExists") && stderr.contains("pods \"web\" already exists"),
        "{stderr}"
    );

    // Client-side apply of a changed list: a removed label, a removed port and reordered
    // containers arrive as `null`, `$patch: delete` and `$setElementOrder`.
    let multi = dir.path().join("multi.yaml");
    let multi = multi.to_str().unwrap();
    std::fs::write(multi, MULTI_BEFORE).unwrap();
    k.ok(&["apply", "-f", multi]).await;
    std::fs::write(multi, MULTI_AFTER).unwrap();
    k.ok(&["apply", "-f", multi]).await;
    let pod = server.get("v1", "Pod", Some("team"), "multi").unwrap();
    assert_eq!(pod["metadata"]["labels"], serde_json::json!({"a": "1"}));
    let containers = &pod["spec"]["containers"];
    assert_eq!(
        (
            containers[0]["name"].as_str(),
            containers[0]["image"].as_str()
        ),
        (Some("c2"), Some("i2b"))
    );
    assert_eq!(
        containers[1]["ports"],
        serde_json::json!([{"containerPort": 81, "protocol": "TCP"}])
    );

    // get -w prints the change of a pod created after it started.
    let mut watch = k.command(&["get", "pods", "-n", "team", "-w", "--no-headers"]);
    let mut child = watch.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The list first, in name order.
    for name in ["multi ", "web "] {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(line.starts_with(name), "{line}");
    }
    let late = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "team"}});
    server.create(late).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.starts_with("late "), "{next}");
    child.kill().await.unwrap();

    // delete -f: the namespace takes its objects at once, so the rest are already gone.
    let out = k.ok(&["delete", "--ignore-not-found", "-f", file]).await;
    assert!(out.contains("namespace \"team\" deleted"), "{out}");
    assert!(
        out.contains("ciliumcidrgroup.cilium.io \"office\" deleted"),
        "{out}"
    );
    assert!(server.get("v1", "Pod", Some("team"), "web").is_none());
    assert!(
        server
            .get("cilium.io/v2alpha1", "CiliumCIDRGroup", None, "office")
            .is_none()
    );
    assert!(
        server
            .list("networking.k8s.io/v1", "NetworkPolicy")
            .is_empty()
    );
    let (ok, _, stderr) = k.run(&["get", "pod", "web", "-n", "team"]).await;
    assert!(!ok && stderr.contains("NotFound"), "{stderr}");
}

const READER_RBAC: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: team}
spec: {containers: [{name: c, image: nginx:1}]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: team}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: team}
subjects: [{kind: ServiceAccount, name: reader, namespace: team}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
"#;

/// kubectl as a ServiceAccount: what its Role allows works, the rest is refused with the real
/// server's words, and every decision is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_under_rbac() {
    if !Path::new(KUBECTL).exists() {
        println!("skipped: {KUBECTL} is not installed");
        return;
    }
    let (server, k, dir) = serve();
    server.enable_rbac();
    let file = dir.path().join("rbac.yaml");
    std::fs::write(&file, READER_RBAC).unwrap();
    // Without a token: the test's own requests, allowed everything.
    k.ok(&["apply", "-f", file.to_str().unwrap()]).await;
    // kubectl sends no token over plain HTTP: it impersonates the ServiceAccount instead.
    let as_reader = "--as=system:serviceaccount:team:reader".to_string();

    let out = k
        .ok(&[&as_reader, "get", "pods", "-n", "team", "-o", "name"])
        .await;
    assert_eq!(out.trim(), "pod/web");
    k.ok(&[&as_reader, "get", "pod", "web", "-n", "team"]).await;

    let (ok, _, err) = k.run(&[&as_reader, "get", "pods", "-n", "default"]).await;
    assert!(!ok);
    assert!(
        err.contains("pods is forbidden: User \"system:serviceaccount:team:reader\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""),
        "{err}"
    );
    let (ok, _, err) = k
        .run(&[&as_reader, "delete", "pod", "web", "-n", "team"])
        .await;
    assert!(
        !ok && err.contains("cannot delete resource \"pods\""),
        "{err}"
    );
    assert!(server.get("v1", "Pod", Some("team"), "web").is_some());

    let audit = server.audit();
    let decided = |verb: &str, ns: &str, allowed: bool| {
        audit.iter().any(|e| {
            e.user == "system:serviceaccount:team:reader"
                && e.attributes.verb == verb
                && e.attributes.resource == "pods"
                && e.attributes.namespace == ns
                && e.allowed == allowed
        })
    };
    assert!(decided("list", "team", true), "{audit:#?}");
    assert!(decided("get", "team", true), "{audit:#?}");
    assert!(decided("list", "default", false), "{audit:#?}");
    assert!(decided("delete", "team", false), "{audit:#?}");
}

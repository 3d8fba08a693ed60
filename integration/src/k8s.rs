//! A Kubernetes API server for end-to-end suites: the test API server
//! (`cellium-test-apiserver`, the real list/watch protocol over an in-memory store) serving on
//! the loopback of a node namespace, where the agent and `kubectl` reach it.
//!
//! The server runs on a runtime of its own inside the test process; its socket is made inside
//! the node namespace (a thread enters it to bind), so nothing listens on the machine's own
//! network. [`K8sApi::restart`] stops it as a killed process would (every connection and watch
//! cut) and serves the same store again on the same address.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};

use cellium_test_apiserver::ApiServer;

use crate::error::{Error, Result};
use crate::netns::NetNs;

/// The test API server on a node namespace's loopback.
#[derive(Debug)]
pub struct K8sApi {
    api: ApiServer,
    node: NetNs,
    addr: SocketAddr,
    /// Further nodes it also serves on, on their loopback at the same port.
    more: std::sync::Mutex<Vec<NetNs>>,
    runtime: tokio::runtime::Runtime,
    /// kubectl's discovery cache, per server: a fresh one, so a cache of another server that
    /// had the same address is never read.
    kubectl_cache: tempfile::TempDir,
}

impl K8sApi {
    /// Serves a new, empty API server on `node`'s loopback (a port the kernel picks).
    pub fn start(node: &NetNs) -> Result<K8sApi> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|source| Error::Spawn {
                cmd: "the API server's runtime".into(),
                source,
            })?;
        let node = NetNs::existing(node.name());
        let listener = bind(&node, "127.0.0.1:0".parse().expect("a literal address"))?;
        let addr = listener.local_addr().map_err(io("local_addr"))?;
        let api = ApiServer::new();
        {
            let _rt = runtime.enter();
            api.serve(listener).map_err(io("serve"))?;
        }
        let kubectl_cache = tempfile::Builder::new()
            .prefix("cel-kubectl-")
            .tempdir()
            .map_err(io("kubectl's cache directory"))?;
        Ok(K8sApi {
            api,
            node,
            addr,
            more: std::sync::Mutex::default(),
            runtime,
            kubectl_cache,
        })
    }

    /// The server, for direct reads and writes and its fault controls.
    pub fn api(&self) -> &ApiServer {
        &self.api
    }

    /// Its URL, as the agent's `k8s-api-server` names it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The agent's environment for Kubernetes mode on this server as node `node_name`, with
    /// `ipam: kubernetes` and `identity-allocation-mode: crd`.
    pub fn agent_env(&self, node_name: &str) -> Vec<(String, String)> {
        vec![
            ("CELLIUM_K8S_API_SERVER".into(), self.url()),
            ("CELLIUM_NODE_NAME".into(), node_name.into()),
            ("CELLIUM_IPAM".into(), "kubernetes".into()),
            ("CELLIUM_IDENTITY_ALLOCATION_MODE".into(), "crd".into()),
        ]
    }

    /// Serves the same store on `node`'s loopback too, at the same port, so that an agent on
    /// that node reaches it at the same [`url`](K8sApi::url): one API server for several
    /// nodes without an underlay.
    pub fn serve_on(&self, node: &NetNs) -> Result<()> {
        let node = NetNs::existing(node.name());
        let listener = bind(&node, self.addr)?;
        {
            let _rt = self.runtime.enter();
            self.api.serve(listener).map_err(io("serve"))?;
        }
        self.more
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(node);
        Ok(())
    }

    /// Stops serving, as if the process were killed: every connection and watch is cut.
    pub fn stop(&self) {
        self.api.stop();
    }

    /// Serves the same store again on the same address.
    pub fn restart(&self) -> Result<()> {
        self.api.stop();
        let more = self.more.lock().unwrap_or_else(|p| p.into_inner());
        let _rt = self.runtime.enter();
        for node in std::iter::once(&self.node).chain(more.iter()) {
            let listener = bind(node, self.addr)?;
            self.api.serve(listener).map_err(io("serve"))?;
        }
        Ok(())
    }

    /// Runs `kubectl ARGS` against the server from the node namespace, with `stdin` as its
    /// input (`-f -`); fails with its stderr unless it succeeds. Returns its stdout.
    pub fn kubectl(&self, args: &[&str], stdin: &str) -> Result<String> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.node.path().display()))
            .arg("--")
            .arg("kubectl")
            .arg(format!("--server={}", self.url()))
            .arg(format!(
                "--cache-dir={}",
                self.kubectl_cache.path().display()
            ))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let describe = format!("kubectl {}", args.join(" "));
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: describe.clone(),
            source,
        })?;
        if let Some(mut input) = child.stdin.take() {
            input
                .write_all(stdin.as_bytes())
                .map_err(io("kubectl stdin"))?;
        }
        let out = child.wait_with_output().map_err(io("kubectl"))?;
        if !out.status.success() {
            return Err(Error::Unexpected {
                what: "kubectl failure",
                detail: format!(
                    "{describe} ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<String> {
        self.kubectl(&["apply", "-f", "-"], yaml)
    }

    /// `kubectl label pod <pod> -n <namespace> <label> --overwrite`: sets (or replaces) one
    /// label of a pod.
    pub fn label_pod(&self, namespace: &str, pod: &str, label: &str) -> Result<String> {
        self.kubectl(
            &["label", "pod", pod, "-n", namespace, label, "--overwrite"],
            "",
        )
    }
}

impl Drop for K8sApi {
    fn drop(&mut self) {
        self.api.stop();
    }
}

/// The Node object `name` with the pod CIDR the controller manager would have given it and, when
/// there are any, its `addresses` (type, address), as the kubelet reports them.
pub fn node_yaml(name: &str, pod_cidr: &str, addresses: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{ name: {name} }}\nspec: {{ podCIDRs: [ {pod_cidr} ] }}\n"
    );
    if !addresses.is_empty() {
        let addresses: Vec<String> = addresses
            .iter()
            .map(|(kind, address)| format!("{{ type: {kind}, address: {address} }}"))
            .collect();
        yaml += &format!("status: {{ addresses: [ {} ] }}\n", addresses.join(", "));
    }
    yaml
}

/// A listener on `addr` inside `node`.
fn bind(node: &NetNs, addr: SocketAddr) -> Result<TcpListener> {
    node.run(move || TcpListener::bind(addr))?
        .map_err(io("bind the API server's socket"))
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Unexpected {
        what,
        detail: e.to_string(),
    }
}

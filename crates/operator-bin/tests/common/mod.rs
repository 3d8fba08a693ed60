//! A test API server and operators started against it, in this process.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use std::sync::{Arc, Mutex};

use cellium_hive::{ConfigSources, Hive, Module};
use cellium_operator::Leadership;
use cellium_test_apiserver::ApiServer;
use serde_json::{Value, json};

/// The test API server (which has the `default` and `kube-system` namespaces).
pub struct Cluster {
    pub server: ApiServer,
    pub url: String,
}

impl Cluster {
    pub fn new() -> Cluster {
        let server = ApiServer::new();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        server.serve(listener).unwrap();
        Cluster { server, url }
    }

    /// The configuration of an operator named `id`, with a short lease (3 s) and GC rounds
    /// an hour apart; `extra` adds or overrides keys.
    pub fn sources(&self, id: &str, extra: &[(&str, Value)]) -> ConfigSources {
        let mut sources = ConfigSources::new()
            .flag("k8s-api-server", &self.url)
            .flag("operator-id", id)
            .flag("leader-election-lease-duration", "3s")
            .flag("leader-election-renew-deadline", "2s")
            .flag("leader-election-retry-period", "200ms")
            .flag("identity-gc-interval", "1h")
            .flag("endpoint-gc-interval", "1h")
            .flag("nodes-gc-interval", "1h");
        for (key, value) in extra {
            sources = sources.flag(key, value);
        }
        sources
    }

    /// An operator, started.
    pub async fn operator(&self, id: &str, extra: &[(&str, Value)]) -> Operator {
        Operator::start(self.sources(id, extra)).await
    }

    /// The Lease's holder, if any.
    pub fn holder(&self) -> Option<String> {
        let lease = self.server.get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "cellium-operator",
        )?;
        lease["spec"]["holderIdentity"].as_str().map(String::from)
    }

    pub fn cilium_node(&self, name: &str) -> Option<Value> {
        self.server.get("cilium.io/v2", "CiliumNode", None, name)
    }

    /// A CiliumNode, with these pod CIDRs already in its spec.
    pub fn create_cilium_node(&self, name: &str, pod_cidrs: &[&str]) {
        let mut node = json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": name},
            "spec": {"addresses": [{"type": "InternalIP", "ip": "192.168.0.1"}]},
        });
        if !pod_cidrs.is_empty() {
            node["spec"]["ipam"] = json!({"podCIDRs": pod_cidrs});
        }
        self.server.create(node).unwrap();
    }

    /// The node's `spec.ipam.podCIDRs`.
    pub fn pod_cidrs(&self, name: &str) -> Vec<String> {
        self.cilium_node(name)
            .and_then(|n| n["spec"]["ipam"]["podCIDRs"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    }

    /// The node's `status.ipam.operator-status.error`, if set.
    pub fn operator_error(&self, name: &str) -> Option<String> {
        self.cilium_node(name)?["status"]["ipam"]["operator-status"]["error"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(String::from)
    }
}

/// Waits until `f` holds, polling every 50 ms, failing the test after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !f() {
        if start.elapsed() > limit {
            panic!("not within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds for the whole of `d`, checked every 50 ms.
pub async fn always(what: &str, d: Duration, mut f: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while start.elapsed() < d {
        assert!(f(), "no longer true: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `f` on a runtime of its own, in a thread, and returns the runtime with the result:
/// shutting that runtime down later drops its tasks where they are, as a killed process
/// stops (no stop hook, no last request).
pub fn on_own_runtime<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
    f: impl FnOnce() -> F + Send + 'static,
) -> (tokio::runtime::Runtime, T) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(f());
        (rt, out)
    })
    .join()
    .unwrap()
}

/// An operator's hive, and its leadership as its cells see it.
pub struct Operator {
    pub hive: Hive,
    pub leadership: Arc<Leadership>,
}

impl Operator {
    /// The operator's cells, and a probe that takes its `Leadership`.
    pub async fn start(sources: ConfigSources) -> Operator {
        let slot: Arc<Mutex<Option<Arc<Leadership>>>> = Arc::default();
        let probe = slot.clone();
        let mut cells = cellium_operator::cells();
        cells.push(
            Module::new("test-probe", "Hands the operator's leadership to the test")
                .invoke(move |l: Arc<Leadership>| {
                    *probe.lock().unwrap() = Some(l);
                })
                .into(),
        );
        let mut hive = Hive::new(cells).with_config(sources);
        if let Err(e) = hive.start().await {
            panic!("the operator does not start: {e}");
        }
        let leadership = slot.lock().unwrap().take().unwrap();
        Operator { hive, leadership }
    }

    pub fn leading(&self) -> bool {
        self.leadership.leading()
    }

    pub async fn stop(mut self) {
        self.hive.stop().await.unwrap();
    }
}

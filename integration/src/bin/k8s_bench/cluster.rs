//! The benchmark's cluster, as the API server holds it: generated objects of realistic shape,
//! created straight into the server's store.
//!
//! - `nodes` Nodes: `bench-node` (this node, pod CIDR 10.244.0.0/22) and `node-1` ..
//!   `node-<nodes-1>`, each with a pod CIDR of its own.
//! - Namespaces `ns-0` .. `ns-<N-1>`, labelled `team=team-<k % 10>`.
//! - Pod `i` is `ns-<i % N>/p-<i>`, labelled `app=a-<i / N>` and `tier=t-<i / N % 3>`, one
//!   container with a named port (`http`, 8080); it runs on `bench-node` when `i % nodes == 0`
//!   (the node's `pods / nodes` pods, made real through the CNI plugin) and on
//!   `node-<i % nodes>` otherwise, where it is running with an address of its own.
//! - NetworkPolicy `np-<j>` in `ns-<j % N>` selects `app=a-<j / N>` and admits, on port
//!   `http` (even `j`) or 8080 (odd `j`), the `tier=t-<j % 3>` pods of the namespaces of
//!   `team=team-<j % 10>`.
//! - Service `svc-<j>` in `ns-<j % N>` selects `tier=t-<j / N % 3>` (a few pods each), port 80
//!   to `http`, a cluster IP the server allocates; its EndpointSlice `svc-<j>-x` lists the
//!   selected pods that run on other nodes, ready, with their node and pod.

use anyhow::{Context, Result};
use cellium_test_apiserver::ApiServer;
use serde_json::{Value, json};

/// This node's name.
pub const NODE: &str = "bench-node";

/// The shape of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub namespaces: usize,
    pub pods: usize,
    pub nodes: usize,
    pub policies: usize,
    pub services: usize,
}

impl Shape {
    /// Whether pod `i` runs on this node.
    pub fn local(&self, i: usize) -> bool {
        i.is_multiple_of(self.nodes)
    }

    /// `(namespace, name)` of pod `i`.
    pub fn pod(&self, i: usize) -> (String, String) {
        (format!("ns-{}", i % self.namespaces), format!("p-{i}"))
    }

    /// The pods that run on this node.
    pub fn local_pods(&self) -> Vec<usize> {
        (0..self.pods).filter(|&i| self.local(i)).collect()
    }

    /// The address of pod `i` when it runs on another node.
    fn remote_ip(&self, i: usize) -> String {
        format!("10.{}.{}.{}", 100 + i / 62_500, i / 250 % 250, i % 250 + 1)
    }

    fn tier(&self, i: usize) -> usize {
        i / self.namespaces % 3
    }

    /// Creates every object in `api`; returns how many of each kind.
    pub fn create(&self, api: &ApiServer) -> Result<Vec<(&'static str, usize)>> {
        let create = |obj: Value| {
            api.create(obj)
                .map(|_| ())
                .map_err(|e| anyhow::anyhow!("{e}"))
        };
        for n in 0..self.nodes {
            let name = if n == 0 {
                NODE.to_string()
            } else {
                format!("node-{n}")
            };
            create(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
                "spec": { "podCIDRs": [ format!("10.{}.{}.0/22", 244 + n / 64, n % 64 * 4) ] },
            }))
            .context("a node")?;
        }
        for k in 0..self.namespaces {
            create(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": { "name": format!("ns-{k}"), "labels": { "team": format!("team-{}", k % 10) } },
            }))
            .context("a namespace")?;
        }
        for i in 0..self.pods {
            let (namespace, name) = self.pod(i);
            let node = if self.local(i) {
                NODE.to_string()
            } else {
                format!("node-{}", i % self.nodes)
            };
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": namespace,
                    "labels": { "app": format!("a-{}", i / self.namespaces), "tier": format!("t-{}", self.tier(i)) },
                },
                "spec": {
                    "nodeName": node,
                    "containers": [ {
                        "name": "app", "image": "registry.example/app:1",
                        "ports": [ { "name": "http", "containerPort": 8080, "protocol": "TCP" } ],
                    } ],
                },
            });
            if !self.local(i) {
                let ip = self.remote_ip(i);
                pod["status"] =
                    json!({ "phase": "Running", "podIP": ip, "podIPs": [ { "ip": ip } ] });
            }
            create(pod).context("a pod")?;
        }
        for j in 0..self.policies {
            let port = if j.is_multiple_of(2) {
                json!("http")
            } else {
                json!(8080)
            };
            create(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": { "name": format!("np-{j}"), "namespace": format!("ns-{}", j % self.namespaces) },
                "spec": {
                    "podSelector": { "matchLabels": { "app": format!("a-{}", j / self.namespaces) } },
                    "policyTypes": [ "Ingress" ],
                    "ingress": [ {
                        "from": [ {
                            "podSelector": { "matchLabels": { "tier": format!("t-{}", j % 3) } },
                            "namespaceSelector": { "matchLabels": { "team": format!("team-{}", j % 10) } },
                        } ],
                        "ports": [ { "protocol": "TCP", "port": port } ],
                    } ],
                },
            }))
            .context("a policy")?;
        }
        let mut slices = 0;
        for j in 0..self.services {
            let (namespace, name) = (format!("ns-{}", j % self.namespaces), format!("svc-{j}"));
            let tier = j / self.namespaces % 3;
            create(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": name, "namespace": namespace },
                "spec": {
                    "type": "ClusterIP",
                    "selector": { "tier": format!("t-{tier}") },
                    "ports": [ { "name": "http", "port": 80, "targetPort": "http", "protocol": "TCP" } ],
                },
            }))
            .context("a service")?;
            let endpoints: Vec<Value> = (0..self.pods / self.namespaces)
                .map(|round| j % self.namespaces + round * self.namespaces)
                .filter(|&i| i < self.pods && self.tier(i) == tier && !self.local(i))
                .map(|i| {
                    json!({
                        "addresses": [ self.remote_ip(i) ],
                        "conditions": { "ready": true, "serving": true, "terminating": false },
                        "nodeName": format!("node-{}", i % self.nodes),
                        "targetRef": { "kind": "Pod", "namespace": namespace, "name": format!("p-{i}") },
                    })
                })
                .collect();
            create(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{name}-x"), "namespace": namespace,
                    "labels": { "kubernetes.io/service-name": name },
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [ { "name": "http", "port": 8080, "protocol": "TCP" } ],
            }))
            .context("an endpoint slice")?;
            slices += 1;
        }
        Ok(vec![
            ("Namespace", self.namespaces),
            ("Pod", self.pods),
            ("Node", self.nodes),
            ("Service", self.services),
            ("EndpointSlice", slices),
            ("NetworkPolicy", self.policies),
        ])
    }
}

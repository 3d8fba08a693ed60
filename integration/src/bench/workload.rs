//! The benchmark's cluster, generated: namespaces, pods with labels that give each its own
//! identity, and NetworkPolicies with two rules each.
//!
//! - Namespaces `ns-0` .. `ns-<N-1>`.
//! - Pod `i` is `ns-<i % N>/p-<i>` with labels `app=app-<i>` (so one identity per pod),
//!   `group=g-<i / N % 10>` and `tier=t-<i / N % 5>`.
//! - NetworkPolicy `np-<j>` in `ns-<j % N>` selects `group=g-<j % 10>` and has two ingress
//!   rules: from `tier=t-<j % 5>` pods of its namespace on port `8000 + j % 100`; and, for the
//!   first hundred policies, from every pod of namespaces `ns-0` and `ns-<j>` (a hundred
//!   distinct selectors, all of which select the pods of `ns-0`), for the others from one pod
//!   of the next namespace.

use std::fmt::Write as _;

/// The shape of the cluster; also the command-line options of the benchmarks that take it.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Shape {
    /// Pods (endpoints, one identity each).
    #[arg(long, default_value_t = 1000)]
    pub pods: usize,
    /// Kubernetes namespaces the pods spread over.
    #[arg(long, default_value_t = 100)]
    pub namespaces: usize,
    /// NetworkPolicies, of two rules each.
    #[arg(long, default_value_t = 250)]
    pub policies: usize,
}

impl Shape {
    /// The namespace of pod `i`.
    pub fn pod_namespace(&self, i: usize) -> String {
        format!("ns-{}", i % self.namespaces)
    }

    /// `namespace/name` of pod `i`.
    pub fn pod_key(&self, i: usize) -> String {
        format!("{}/p-{i}", self.pod_namespace(i))
    }

    /// The labels of pod `i`.
    pub fn pod_labels(&self, i: usize) -> [(String, String); 3] {
        let n = self.namespaces;
        [
            ("app".into(), format!("app-{i}")),
            ("group".into(), format!("g-{}", i / n % 10)),
            ("tier".into(), format!("t-{}", i / n % 5)),
        ]
    }

    /// The namespaces, as YAML.
    pub fn namespaces_yaml(&self) -> String {
        let mut out = String::new();
        for k in 0..self.namespaces {
            let _ = writeln!(
                out,
                "---\napiVersion: v1\nkind: Namespace\nmetadata: {{ name: ns-{k} }}"
            );
        }
        out
    }

    /// The pods, as YAML.
    pub fn pods_yaml(&self) -> String {
        let mut out = String::new();
        for i in 0..self.pods {
            let labels: Vec<String> = self
                .pod_labels(i)
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(
                out,
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{ name: p-{i}, namespace: {}, labels: {{ {} }} }}\nspec: {{ containers: [ {{ name: c }} ] }}",
                self.pod_namespace(i),
                labels.join(", ")
            );
        }
        out
    }

    /// The policies, as YAML.
    pub fn policies_yaml(&self) -> String {
        let n = self.namespaces;
        let mut out = String::new();
        for j in 0..self.policies {
            let second = if j < 100 {
                format!(
                    "{{ from: [ {{ namespaceSelector: {{ matchExpressions: [ {{ key: kubernetes.io/metadata.name, operator: In, values: [ ns-0, ns-{} ] }} ] }} }} ] }}",
                    j % n
                )
            } else {
                format!(
                    "{{ from: [ {{ namespaceSelector: {{ matchLabels: {{ kubernetes.io/metadata.name: ns-{} }} }}, podSelector: {{ matchLabels: {{ app: app-{} }} }} }} ] }}",
                    (j + 1) % n,
                    (j * 7) % self.pods.max(1)
                )
            };
            let _ = writeln!(
                out,
                "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{ name: np-{j}, namespace: ns-{} }}\nspec:\n  podSelector: {{ matchLabels: {{ group: g-{} }} }}\n  ingress:\n  - {{ from: [ {{ podSelector: {{ matchLabels: {{ tier: t-{} }} }} }} ], ports: [ {{ port: {} }} ] }}\n  - {second}",
                j % n,
                j % 10,
                j % 5,
                8000 + j % 100
            );
        }
        out
    }

    /// A policy that changes every endpoint: every pod admits the pods of `ns-0` on 9999/TCP
    /// (so every pod's ingress becomes, or stays, default deny with new allow entries).
    pub fn change_all_yaml() -> &'static str {
        "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: { name: bench-all }\nspec:\n  endpointSelector: {}\n  ingress:\n  - fromEndpoints: [ { matchLabels: { k8s:io.kubernetes.pod.namespace: ns-0 } } ]\n    toPorts: [ { ports: [ { port: \"9999\", protocol: TCP } ] } ]\n"
    }

    /// A policy that selects no endpoint: a new revision that changes nothing.
    pub fn change_none_yaml() -> &'static str {
        "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: { name: bench-none }\nspec:\n  endpointSelector: { matchLabels: { app: nobody } }\n  ingress:\n  - fromEndpoints: [ { matchLabels: { k8s:io.kubernetes.pod.namespace: ns-0 } } ]\n    toPorts: [ { ports: [ { port: \"9999\", protocol: TCP } ] } ]\n"
    }
}

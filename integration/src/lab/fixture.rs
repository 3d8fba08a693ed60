//! The lab's standard cluster: three Kubernetes namespaces with the labels namespace
//! selectors pick, five pods with labels and named container ports, each at a fixed address
//! (so that ipBlocks can name them).
//!
//! | pod | labels | named ports | address |
//! |---|---|---|---|
//! | `shop/web` | `app=web` | `http` 8080/TCP | 10.244.0.10 |
//! | `shop/db` | `app=db` | `sql` 5432/TCP | 10.244.0.11 |
//! | `dev/web` | `app=web` | `http` 80/TCP | 10.244.0.20 |
//! | `dev/tool` | `app=tool` | | 10.244.0.21 |
//! | `ops/dns` | `app=dns` | `dns` 53/UDP, `dns-tcp` 53/TCP | 10.244.0.30 |
//!
//! Namespaces: `shop` (`team=a`), `dev` (`team=b`), `ops` (`team=a`, `tier=infra`).
//!
//! In a dual-stack lab ([`dual_stack`]) each pod also has the IPv6 twin of its address:
//! `fd00:10:244::a`, `::b`, `::14`, `::15`, `::1e`.

use std::net::Ipv4Addr;

use crate::agent::AgentOptions;
use crate::error::Result;
use crate::lab::Lab;

/// The namespaces and pods, as `cellium apply` takes them.
pub const BASE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop, labels: { team: a } }
---
apiVersion: v1
kind: Namespace
metadata: { name: dev, labels: { team: b } }
---
apiVersion: v1
kind: Namespace
metadata: { name: ops, labels: { team: a, tier: infra } }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 8080 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: db, namespace: shop, labels: { app: db } }
spec: { containers: [ { name: c, ports: [ { name: sql, containerPort: 5432 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: dev, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 80 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: tool, namespace: dev, labels: { app: tool } }
spec: { containers: [ { name: c } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: dns, namespace: ops, labels: { app: dns } }
spec:
  containers:
  - name: c
    ports: [ { name: dns, containerPort: 53, protocol: UDP }, { name: dns-tcp, containerPort: 53 } ]
"#;

/// Scenario "default deny per direction": shop/db takes nothing in, dev/tool sends nothing.
pub const DEFAULT_DENY_PER_DIRECTION: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db-no-ingress, namespace: shop }
spec: { podSelector: { matchLabels: { app: db } }, policyTypes: [ Ingress ] }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: tool-no-egress, namespace: dev }
spec: { podSelector: { matchLabels: { app: tool } }, policyTypes: [ Egress ] }
"#;

/// Scenario "namespace isolation": shop takes in only shop's pods; dev talks only to dev, in
/// both directions.
pub const NAMESPACE_ISOLATION: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: isolate, namespace: shop }
spec:
  podSelector: {}
  ingress: [ { from: [ { podSelector: {} } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: isolate, namespace: dev }
spec:
  podSelector: {}
  ingress: [ { from: [ { podSelector: {} } ] } ]
  egress: [ { to: [ { podSelector: {} } ] } ]
"#;

/// The pods of [`BASE`] and their addresses.
pub const PODS: [(&str, Ipv4Addr); 5] = [
    ("shop/web", Ipv4Addr::new(10, 244, 0, 10)),
    ("shop/db", Ipv4Addr::new(10, 244, 0, 11)),
    ("dev/web", Ipv4Addr::new(10, 244, 0, 20)),
    ("dev/tool", Ipv4Addr::new(10, 244, 0, 21)),
    ("ops/dns", Ipv4Addr::new(10, 244, 0, 30)),
];

/// Options of a dual-stack lab: every pod also gets the IPv6 twin of its address in
/// `fd00:10:244::/112` (`10.244.0.10` and `fd00:10:244::a`: [`Lab::ip6_of`]), the node its IPv6
/// gateway and the external network `fd00:99::10` and `fd00:99::20`.
pub fn dual_stack() -> AgentOptions {
    AgentOptions {
        pod_cidrs: vec!["10.244.0.0/24".into(), "fd00:10:244::/112".into()],
        ..AgentOptions::default()
    }
}

/// A lab whose agent runs with `opts`, with [`BASE`] applied and its pods created.
pub fn lab(opts: AgentOptions) -> Result<Lab> {
    let mut lab = Lab::start(opts)?;
    lab.apply(BASE)?;
    for (key, ip) in PODS {
        lab.add_pod(key, ip)?;
    }
    Ok(lab)
}

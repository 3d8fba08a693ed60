//! The `k8s-watchers` cell: the Kubernetes API server's objects, listed and watched into the
//! resources tables, and the node's CiliumEndpoints written back. The only crate of the agent
//! that talks to the API server.
//!
//! - **Owns** one kube-runtime watcher per kind (Namespaces, this node's Pods by
//!   `spec.nodeName`, Nodes, Services, EndpointSlices, NetworkPolicies, CiliumNetworkPolicies,
//!   CiliumClusterwideNetworkPolicies, and the cluster's CiliumNodes, CiliumIdentities and
//!   CiliumEndpoints), each with kube-runtime's default backoff. The Cilium CRDs must be
//!   installed: a kind the API server does not serve keeps the start waiting, naming it. And
//!   the node's CiliumEndpoints (labelled [`NODE_LABEL`]`=<node>`): one per ready endpoint with a
//!   pod, named and placed as the pod, with its id, identity and labels, addresses and the
//!   node's IP, kept in line by the job `ciliumendpoints` (at start, when the endpoints or
//!   the node's IP change, when one of the objects is deleted, and every [`RESYNC`]; see
//!   `docs/kubernetes.md`).
//! - **Provides** `Arc<K8sWatchers>` and, as `Arc<dyn ApiSource>`, the source the resources
//!   cell runs in Kubernetes mode: each complete list replaces the kind's table (deleting what
//!   vanished, so a relist after a `410 Expired` or a dropped watch brings deletions made
//!   meanwhile), then marks it synced; watch events update it. A pod a CNI ADD names before
//!   its watch event arrives is read with a GET.
//!   And, contributed as `Arc<dyn ClusterNumbering>`, CiliumIdentity objects as the cluster's numbering
//!   of label sets, for `identity-allocation-mode: crd` (see [`CrdNumbering`]).
//! - **Depends on** its configuration; the resources and identity cells depend on it (and the
//!   endpoint manager on resources). The CiliumEndpoint job (set up by the module's status-note contribution) also takes the endpoint
//!   manager and the resources tables (for the node's IP), both optional, so that an agent
//!   built without them still has this module. Standalone, or without an endpoint manager,
//!   no CiliumEndpoint is written.
//! - **Config keys** (Cilium's names): `k8s-api-server` (URL), `k8s-kubeconfig-path` (a
//!   kubeconfig; with `k8s-api-server`, the URL replaces its server), and the in-cluster
//!   service account when `KUBERNETES_SERVICE_HOST` is set; with none of them the agent runs
//!   standalone. `node-name` (default `K8S_NODE_NAME`, else the host name).
//! - **Degraded** (`k8s-watchers.<kind>`) while a kind is not listed yet, or while its list or
//!   watch fails (retried with backoff; the tables keep their last state meanwhile);
//!   (`k8s-watchers`) while the client cannot be built; (`k8s-watchers.ciliumendpoints`)
//!   while a pass fails (the API server away, a write refused), with the first error and the
//!   delay before the next try (1 s doubling up to 30 s); OK, with the count, after a pass
//!   that wrote everything.
//!
//! Only what cells read is kept: the feed converts each object into the tables' slim types at
//! once. The built-in kinds are decoded once, straight from the API server's bytes into their
//! k8s-openapi types ([`cellium_resources::Decoded`]; an object that does not decode is rejected
//! alone, naming its field); Cilium's kinds as dynamic objects, their managed fields dropped,
//! and then as JSON for their strict decoder.

mod cilium_node;
mod client;
mod config;
mod endpoints;
mod error;
mod identities;
mod watchers;

use cellium_hive::Module;

pub use config::K8sConfig;
pub use endpoints::{NODE_LABEL, RESYNC};
pub use error::{Error, Result};
pub use identities::CrdNumbering;
pub use watchers::K8sWatchers;

/// The `k8s-watchers` module.
pub fn cell() -> Module {
    Module::new(
        "k8s-watchers",
        "Lists and watches the Kubernetes API server's objects into the resources tables, and writes the node's CiliumEndpoints",
    )
    .config::<K8sConfig>()
    .provide(K8sWatchers::new)
    .provide(K8sWatchers::source)
    .contribute(CrdNumbering::provide)
    .contribute(endpoints::start)
}

//! The `k8s-client` cell: the API server, as the operator's cells reach it, and the kinds
//! the operator reads and writes.
//!
//! - **Owns** nothing of its own: the client is the k8s-watchers cell's (`K8sWatchers`,
//!   constructed here without its watchers, which feed an agent's tables), built at first use.
//! - **Provides** `Arc<Client>` (and the `Arc<K8sWatchers>` it wraps).
//! - **Depends on** its configuration only.
//! - **Config keys**: the k8s-watchers ones, `k8s-api-server`, `k8s-kubeconfig-path` (and
//!   the in-cluster service account); with none of them the operator refuses to start, naming
//!   them. `node-name` is accepted and unused.
//! - **Degraded** never: a client that cannot be built fails the requests of the cells that
//!   use it, which report it.

use std::sync::Arc;

use cellium_hive::{Module, Reporter};
use cellium_k8s_watchers::{K8sConfig, K8sWatchers};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta};
use serde_json::Value;

use crate::error::{Error, Result};

/// How many objects one page of a list holds.
const PAGE: u32 = 500;

/// The operator's client of the API server.
#[derive(Debug)]
pub struct Client {
    inner: Arc<K8sWatchers>,
}

impl Client {
    /// The module's constructor: the configuration must name an API server.
    pub fn new(inner: Arc<K8sWatchers>, reporter: Reporter) -> Result<Arc<Client>> {
        let Some(server) = inner.server_url() else {
            return Err(Error::NoApiServer);
        };
        reporter.ok(format!("API server {server}"));
        Ok(Arc::new(Client { inner }))
    }

    /// The client (built at first use; a failure is retried at the next call).
    pub async fn get(&self) -> Result<kube::Client> {
        self.inner.api_client().await.map_err(Error::Client)
    }

    /// A cluster-wide API of one of the [`Kind`]s.
    pub(crate) async fn api(&self, kind: Kind) -> Result<Api<DynamicObject>> {
        Ok(Api::all_with(self.get().await?, &kind.resource()))
    }
}

/// The `k8s-client` module.
pub fn cell() -> Module {
    Module::new(
        "k8s-client",
        "Builds the operator's client of the Kubernetes API server from the k8s-* keys",
    )
    .config::<K8sConfig>()
    .provide(K8sWatchers::new)
    .provide(Client::new)
}

/// The kinds the operator reads or writes, besides its Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Node,
    Pod,
    CiliumNode,
    CiliumIdentity,
    CiliumEndpoint,
}

impl Kind {
    pub(crate) fn resource(self) -> ApiResource {
        let (group, kind, plural) = match self {
            Kind::Node => ("", "Node", "nodes"),
            Kind::Pod => ("", "Pod", "pods"),
            Kind::CiliumNode => ("cilium.io", "CiliumNode", "ciliumnodes"),
            Kind::CiliumIdentity => ("cilium.io", "CiliumIdentity", "ciliumidentities"),
            Kind::CiliumEndpoint => ("cilium.io", "CiliumEndpoint", "ciliumendpoints"),
        };
        let (version, api_version) = if group.is_empty() {
            ("v1", "v1".to_string())
        } else {
            ("v2", format!("{group}/v2"))
        };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version,
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    /// The kind's name, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Node => "Nodes",
            Kind::Pod => "Pods",
            Kind::CiliumNode => "CiliumNodes",
            Kind::CiliumIdentity => "CiliumIdentities",
            Kind::CiliumEndpoint => "CiliumEndpoints",
        }
    }
}

/// Every object of the kind, page by page.
pub(crate) async fn list_all(api: &Api<DynamicObject>, kind: Kind) -> Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(Error::api(format!("listing {}", kind.name())))?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Every object's metadata only, page by page: what GC needs of Pods and Nodes.
pub(crate) async fn list_meta(api: &Api<DynamicObject>, kind: Kind) -> Result<Vec<ObjectMeta>> {
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .map_err(Error::api(format!("listing {}", kind.name())))?;
        out.extend(page.items.into_iter().map(|o| o.metadata));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
pub(crate) fn key(meta: &ObjectMeta) -> String {
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => String::new(),
    }
}

/// The value at a dotted path of the object's body (`status.identity.id`).
pub(crate) fn field<'a>(obj: &'a DynamicObject, path: &[&str]) -> Option<&'a Value> {
    let mut v = obj.data.get(path.first()?)?;
    for p in &path[1..] {
        v = v.get(p)?;
    }
    Some(v)
}

//! One kube-runtime watcher per kind, each writing through the resources tables' feed.

use std::sync::Arc;

use cellium_hive::{Config, Reporter};
use cellium_resources::{API_KINDS, ApiSource, BuiltIn, Decoded, Feed, Listing};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::client::Credentials;
use crate::config::K8sConfig;
use crate::error::{Error, Result};
pub(crate) use cellium_hive::error_chain as chain;

/// How long to wait before building the client again when it cannot be built.
const CLIENT_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// The API server's side of the agent: lists and watches every kind the tables hold, and
/// reads single pods for CNI ADD.
pub struct K8sWatchers {
    credentials: Option<Credentials>,
    node_name: String,
    client: OnceCell<kube::Client>,
    reporter: Reporter,
}

impl std::fmt::Debug for K8sWatchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K8sWatchers")
            .field("server", &self.server())
            .field("node_name", &self.node_name)
            .finish()
    }
}

impl K8sWatchers {
    /// The cell's constructor: checks the configuration (a bad URL or an unreadable kubeconfig
    /// fails the start, naming its key); contacts nothing yet.
    pub fn new(cfg: Config<K8sConfig>, reporter: Reporter) -> Result<Arc<K8sWatchers>> {
        let credentials = Credentials::from_config(&cfg)?;
        let node_name = node_name(&cfg)?;
        match &credentials {
            Some(c) => reporter.ok(format!(
                "Kubernetes mode: API server {}, node {node_name}",
                c.server()
            )),
            None => reporter.ok("standalone: no API server configured"),
        }
        Ok(Arc::new(K8sWatchers {
            credentials,
            node_name,
            client: OnceCell::new(),
            reporter,
        }))
    }

    /// As the resources cell takes it.
    pub fn source(self: Arc<Self>) -> Arc<dyn ApiSource> {
        self
    }

    /// The API server's URL; `None` standalone.
    pub fn server_url(&self) -> Option<String> {
        self.credentials.as_ref().map(Credentials::server)
    }

    /// The client of the API server (built at first use).
    pub async fn api_client(&self) -> Result<kube::Client> {
        self.client().await
    }

    pub(crate) async fn client(&self) -> Result<kube::Client> {
        let Some(credentials) = &self.credentials else {
            return Err(Error::NotConfigured);
        };
        self.client
            .get_or_try_init(|| credentials.client())
            .await
            .cloned()
    }

    /// The client, built again and again until it can be or `cancel` is cancelled.
    async fn wait_client(&self, cancel: &CancellationToken) -> Option<kube::Client> {
        loop {
            match self.client().await {
                Ok(client) => return Some(client),
                Err(e) => {
                    let msg = chain(&e);
                    tracing::error!("{msg}; retrying");
                    self.reporter.degraded(format!("{msg}; retrying"));
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(CLIENT_RETRY) => {}
            }
        }
    }
}

impl K8sWatchers {
    /// The watch of one kind: the built-in kinds decoded once into their k8s-openapi types,
    /// Cilium's kinds as dynamic objects (their decoder works on JSON).
    fn watch(
        &self,
        client: &kube::Client,
        feed: &Feed,
        api_version: &'static str,
        kind: &'static str,
        cancel: &CancellationToken,
    ) -> BoxFuture<'static, ()> {
        use k8s_openapi::api::{
            core::v1 as core, discovery::v1 as discovery, networking::v1 as networking,
        };
        let fields = (kind == "Pod").then(|| format!("spec.nodeName={}", self.node_name));
        let reporter = self.reporter.child(&kind.to_lowercase());
        let (feed, cancel) = (feed.clone(), cancel.clone());
        fn typed<K: BuiltIn>(
            client: &kube::Client,
            kind: &'static str,
            fields: Option<String>,
            feed: Feed,
            reporter: Reporter,
            cancel: CancellationToken,
        ) -> BoxFuture<'static, ()> {
            let api: Api<Decoded<K>> = Api::all(client.clone());
            KindWatch {
                api,
                kind,
                fields,
                feed,
                reporter,
            }
            .run(cancel)
            .boxed()
        }
        match kind {
            "Namespace" => typed::<core::Namespace>(client, kind, fields, feed, reporter, cancel),
            "Pod" => typed::<core::Pod>(client, kind, fields, feed, reporter, cancel),
            "Node" => typed::<core::Node>(client, kind, fields, feed, reporter, cancel),
            "Service" => typed::<core::Service>(client, kind, fields, feed, reporter, cancel),
            "EndpointSlice" => {
                typed::<discovery::EndpointSlice>(client, kind, fields, feed, reporter, cancel)
            }
            "NetworkPolicy" => {
                typed::<networking::NetworkPolicy>(client, kind, fields, feed, reporter, cancel)
            }
            _ => {
                let api: Api<DynamicObject> =
                    Api::all_with(client.clone(), &api_resource(api_version, kind));
                KindWatch {
                    api,
                    kind,
                    fields,
                    feed,
                    reporter,
                }
                .run(cancel)
                .boxed()
            }
        }
    }
}

impl ApiSource for K8sWatchers {
    fn server(&self) -> Option<String> {
        self.credentials.as_ref().map(Credentials::server)
    }

    fn node_name(&self) -> String {
        self.node_name.clone()
    }

    fn run(self: Arc<Self>, feed: Feed, cancel: CancellationToken) -> BoxFuture<'static, ()> {
        async move {
            let Some(client) = self.wait_client(&cancel).await else {
                return;
            };
            self.reporter.ok(format!(
                "watching the API server {} for node {}",
                self.server().unwrap_or_default(),
                self.node_name
            ));
            let watches = API_KINDS
                .iter()
                .map(|(api_version, kind)| self.watch(&client, &feed, api_version, kind, &cancel));
            let upkeep = crate::cilium_node::upkeep(
                client.clone(),
                self.node_name.clone(),
                feed.clone(),
                cancel.clone(),
            );
            futures::future::join(futures::future::join_all(watches), upkeep).await;
        }
        .boxed()
    }

    fn get_pod(
        self: Arc<Self>,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<Option<Value>, String>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        async move {
            let client = self.client().await.map_err(|e| e.to_string())?;
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, &namespace, &api_resource("v1", "Pod"));
            let pod = api.get_opt(&name).await.map_err(|e| e.to_string())?;
            Ok(pod.map(to_value))
        }
        .boxed()
    }
}

/// How the objects of a watch go to the feed.
trait Watched: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static {
    fn push(self, listing: &mut Listing);
    fn apply(self, feed: &Feed, kind: &str);
    fn delete(self, feed: &Feed, kind: &str);
}

/// Cilium's kinds: as JSON, without managed fields.
impl Watched for DynamicObject {
    fn push(self, listing: &mut Listing) {
        listing.push(to_value(self));
    }
    fn apply(self, feed: &Feed, kind: &str) {
        feed.apply(kind, to_value(self));
    }
    fn delete(self, feed: &Feed, kind: &str) {
        feed.delete(kind, &to_value(self));
    }
}

/// The built-in kinds, decoded once.
impl<K: BuiltIn> Watched for Decoded<K> {
    fn push(self, listing: &mut Listing) {
        listing.push_decoded(self);
    }
    fn apply(self, feed: &Feed, _kind: &str) {
        feed.apply_decoded(self);
    }
    fn delete(self, feed: &Feed, _kind: &str) {
        feed.delete_decoded(&self);
    }
}

/// The watch of one kind.
struct KindWatch<K: kube::Resource> {
    api: Api<K>,
    kind: &'static str,
    fields: Option<String>,
    feed: Feed,
    reporter: Reporter,
}

impl<K> KindWatch<K>
where
    K: Watched,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    /// Lists, then watches, relisting when the watch expires or drops (kube-runtime's watcher,
    /// with its default backoff so that a failing server is not hammered), until `cancel`.
    /// Each complete list replaces the table's objects of the kind, so what was deleted while
    /// the watch was down is deleted here too. The objects of a list are parsed as they arrive
    /// (a [`Listing`](cellium_resources::Listing)): only their typed forms wait for the list
    /// to be complete, not the API server's objects.
    async fn run(self, cancel: CancellationToken) {
        let mut config = watcher::Config::default();
        if let Some(fields) = &self.fields {
            config = config.fields(fields);
        }
        let mut events = watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .boxed();
        let mut listing = self.feed.listing(self.kind);
        self.reporter.degraded("listing: not synced yet");
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                None => return,
                // A list that starts (again) discards what a list cut short gathered.
                Some(Ok(Event::Init)) => listing = self.feed.listing(self.kind),
                Some(Ok(Event::InitApply(obj))) => obj.push(&mut listing),
                Some(Ok(Event::InitDone)) => {
                    let objects = listing.len();
                    let complete = std::mem::replace(&mut listing, self.feed.listing(self.kind));
                    self.feed.resync(complete);
                    self.reporter
                        .ok(format!("{objects} objects listed; watching"));
                }
                Some(Ok(Event::Apply(obj))) => obj.apply(&self.feed, self.kind),
                Some(Ok(Event::Delete(obj))) => obj.delete(&self.feed, self.kind),
                Some(Err(e)) => {
                    // The table keeps what it holds: enforcing the last known state beats
                    // dropping it while the API server is away.
                    tracing::warn!(kind = self.kind, error = %e, "list or watch failed; retrying with backoff");
                    self.reporter
                        .degraded(format!("list or watch failed: {e}; retrying with backoff"));
                }
            }
        }
    }
}

/// The API resource of one of [`API_KINDS`].
fn api_resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let lower = kind.to_lowercase();
    let plural = match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    };
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        plural,
    }
}

/// An object as JSON for the feed, without its managed fields (the largest part of most
/// objects, read by no cell).
fn to_value(mut obj: DynamicObject) -> Value {
    obj.metadata.managed_fields = None;
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// `node-name`, else `K8S_NODE_NAME`, else the host name.
fn node_name(cfg: &K8sConfig) -> Result<String> {
    if let Some(name) = cfg.node_name.clone().filter(|n| !n.is_empty()) {
        return Ok(name);
    }
    if let Some(name) = std::env::var("K8S_NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
    {
        return Ok(name);
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .ok_or(Error::NodeName)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_plural() {
        let plurals: Vec<String> = API_KINDS
            .iter()
            .map(|(v, k)| api_resource(v, k).plural)
            .collect();
        assert_eq!(
            plurals,
            [
                "namespaces",
                "pods",
                "nodes",
                "services",
                "endpointslices",
                "networkpolicies",
                "ciliumnetworkpolicies",
                "ciliumclusterwidenetworkpolicies",
                "ciliumcidrgroups",
                "ciliumnodes",
                "ciliumidentities",
                "ciliumendpoints"
            ]
        );
        let r = api_resource("discovery.k8s.io/v1", "EndpointSlice");
        assert_eq!(
            (r.group.as_str(), r.version.as_str()),
            ("discovery.k8s.io", "v1")
        );
    }
}

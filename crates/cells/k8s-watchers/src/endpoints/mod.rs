//! CiliumEndpoint objects: one per endpoint of this node, as Cilium's agent writes them, so
//! that what reads the cluster (`kubectl get cep`, other agents, observability tools) finds
//! each pod's endpoint id, identity, labels and addresses.
//!
//! A level-triggered loop, the job `k8s-watchers.ciliumendpoints`: each pass lists the
//! node's endpoints and the CiliumEndpoints labelled [`NODE_LABEL`]`=<node>`, then creates
//! the missing ones, replaces those whose status differs and deletes those whose endpoint
//! is gone (see `plan.rs`). A pass runs at start (after the endpoints are restored, so a
//! restart deletes the objects of pods that went meanwhile), whenever the endpoints change
//! or the node's IP does (it is in the objects), when a watch of the node's objects sees
//! one deleted (someone else's delete is undone at once), and every [`RESYNC`] to put back
//! what someone else changed; [`DEBOUNCE`] after its trigger, so a burst makes one pass.
//!
//! Why a label: the API server filters by it, so a pass reads only this node's objects and
//! needs no index of its own; and it does not depend on the node's IP, which may be unknown
//! or change. Why no owner references to the Pods: the Pods table keeps no uid, and a pod
//! deleted and created again under the same name has a new one, so a stale reference would
//! let the garbage collector delete the new pod's object.

mod plan;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cellium_endpoint_manager::{Endpoint, EndpointManager};
use cellium_hive::{Backoff, JobContext, Jobs};
use cellium_resources::{ApiSource, ObjectKey, Resources};
use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions, TypeMeta,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::watchers::{K8sWatchers, chain};
use plan::{Key, Observed};

/// The label on every CiliumEndpoint an agent writes, with its node's name as the value:
/// how an agent finds its own objects again, across restarts.
pub const NODE_LABEL: &str = "cellium.io/node";

/// How often a pass runs when nothing triggers one: what someone else changed or deleted is
/// put back within this time.
pub const RESYNC: Duration = Duration::from_secs(30);

/// The job's name, under the module: `k8s-watchers.ciliumendpoints`.
const JOB: &str = "ciliumendpoints";

/// How long a failed pass waits before the next: from 1 s, doubling, up to the resync
/// interval, so that an API server that is down is not hammered.
const BACKOFF: Backoff = Backoff {
    min: Duration::from_secs(1),
    max: RESYNC,
    factor: 2.0,
    max_retries: None,
};

/// How long a pass waits after what triggered it, so that a burst of changes makes one.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// How many times one object is written when it keeps changing between read and write.
const WRITE_ATTEMPTS: usize = 3;

/// The invoke of the k8s-watchers module: starts the job in Kubernetes mode when the agent
/// has an endpoint manager (optional, so that the resources cell, which the endpoint manager
/// depends on, can depend on this module without a cycle); does nothing otherwise.
pub(crate) fn start(
    watchers: Arc<K8sWatchers>,
    endpoints: Option<Arc<EndpointManager>>,
    resources: Option<Arc<Resources>>,
    jobs: Jobs,
) {
    if watchers.server().is_none() {
        return;
    }
    let Some(endpoints) = endpoints else {
        tracing::info!("this agent has no endpoint manager: no CiliumEndpoints are written");
        return;
    };
    add_job(watchers, endpoints, resources, &jobs);
}

/// What the job reads of the endpoints (a trait, so that its tests need no endpoint manager).
trait NodeEndpoints: Send + Sync + 'static {
    /// Every endpoint.
    fn list(&self) -> Vec<Endpoint>;
    /// A counter that moves when the list does.
    fn changes(&self) -> watch::Receiver<u64>;
}

impl NodeEndpoints for EndpointManager {
    fn list(&self) -> Vec<Endpoint> {
        EndpointManager::list(self)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        EndpointManager::changes(self)
    }
}

/// Adds the job `ciliumendpoints`.
fn add_job(
    watchers: Arc<K8sWatchers>,
    endpoints: Arc<dyn NodeEndpoints>,
    resources: Option<Arc<Resources>>,
    jobs: &Jobs,
) {
    let sync = Arc::new(CepSync {
        watchers,
        endpoints,
        resources,
    });
    jobs.one_shot(JOB, move |ctx| {
        let sync = sync.clone();
        async move {
            sync.run(ctx).await;
            Ok(())
        }
    })
    .add();
}

/// The loop's parts.
struct CepSync {
    watchers: Arc<K8sWatchers>,
    endpoints: Arc<dyn NodeEndpoints>,
    resources: Option<Arc<Resources>>,
}

/// What a successful pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Done {
    in_line: usize,
    created: usize,
    updated: usize,
    deleted: usize,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} CiliumEndpoints written (last pass: {} created, {} updated, {} deleted)",
            self.in_line + self.created + self.updated,
            self.created,
            self.updated,
            self.deleted
        )
    }
}

impl CepSync {
    /// Passes until the job is cancelled: after a success, at the next trigger or resync;
    /// after a failure (Degraded with the error), after the backoff's delay.
    async fn run(&self, ctx: JobContext) {
        let reporter = ctx.reporter();
        let mut changes = self.endpoints.changes();
        let mut nodes = self.resources.as_ref().map(|r| r.nodes.revision());
        let node = self.watchers.node_name();
        let mut failures = 0;
        // Made after the first successful pass, when the client is known to work.
        let mut deletions: Option<BoxStream<'static, ()>> = None;
        loop {
            // Marked seen before the pass reads, so a change during the pass runs another.
            changes.borrow_and_update();
            if let Some(nodes) = &mut nodes {
                nodes.borrow_and_update();
            }
            let node_ip = self.node_ip(&node);
            let outcome = tokio::select! {
                _ = ctx.cancelled() => return,
                outcome = self.pass(&node, node_ip) => outcome,
            };
            let delay = match outcome {
                Ok(done) => {
                    failures = 0;
                    if done.created + done.updated + done.deleted > 0 {
                        tracing::info!(
                            created = done.created,
                            updated = done.updated,
                            deleted = done.deleted,
                            "CiliumEndpoints written"
                        );
                    }
                    reporter.ok(done.to_string());
                    if deletions.is_none()
                        && let Ok(client) = self.watchers.client().await
                    {
                        deletions = Some(deletions_of(client, &node));
                    }
                    None
                }
                Err(e) => {
                    failures += 1;
                    let delay = BACKOFF.delay(failures);
                    let msg = chain(&e);
                    tracing::warn!(error = %msg, ?delay, "CiliumEndpoints not in line; retrying");
                    reporter.degraded(format!("{msg}; retrying in {delay:?}"));
                    Some(delay)
                }
            };
            match delay {
                Some(delay) => tokio::select! {
                    _ = ctx.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                },
                None => {
                    tokio::select! {
                        _ = ctx.cancelled() => return,
                        _ = tokio::time::sleep(RESYNC) => {}
                        _ = changed(Some(&mut changes)) => {}
                        _ = self.node_ip_changed(nodes.as_mut(), &node, node_ip) => {}
                        _ = next(deletions.as_mut()) => {}
                    }
                    // A burst (pods of a deployment set up together) makes one pass, not
                    // one each.
                    tokio::select! {
                        _ = ctx.cancelled() => return,
                        _ = tokio::time::sleep(DEBOUNCE) => {}
                    }
                }
            }
        }
    }

    /// One pass, with the client and the node's endpoints as they are now.
    async fn pass(&self, node: &str, node_ip: Option<IpAddr>) -> Result<Done> {
        let client = self.watchers.client().await?;
        reconcile(&client, node, &self.endpoints.list(), node_ip).await
    }

    /// Completes when the node's IP is no longer `last`: the Nodes table changes with every
    /// node of the cluster, and only this one's IP is in the objects.
    async fn node_ip_changed(
        &self,
        mut nodes: Option<&mut watch::Receiver<u64>>,
        node: &str,
        last: Option<IpAddr>,
    ) {
        loop {
            changed(nodes.as_deref_mut()).await;
            if self.node_ip(node) != last {
                return;
            }
        }
    }

    /// The node's IP: its Node's first InternalIP (else ExternalIP), when the Nodes table
    /// has it.
    fn node_ip(&self, node: &str) -> Option<IpAddr> {
        let nodes = &self.resources.as_ref()?.nodes;
        nodes
            .get(&ObjectKey::cluster(node))?
            .addresses
            .first()
            .copied()
    }
}

/// One pass: brings `node`'s CiliumEndpoints in line with its `endpoints`. Every write is
/// tried; the first failure is returned with the count.
async fn reconcile(
    client: &kube::Client,
    node: &str,
    endpoints: &[Endpoint],
    node_ip: Option<IpAddr>,
) -> Result<Done> {
    let desired = plan::desired(endpoints, node_ip);
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource());
    let listed = all
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await
        .map_err(Error::ListEndpoints)?;
    let mut objects: BTreeMap<Key, DynamicObject> = BTreeMap::new();
    for obj in listed.items {
        if let (Some(ns), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) {
            objects.insert((ns.clone(), name.clone()), obj);
        }
    }
    let observed: BTreeMap<Key, Observed> = objects
        .iter()
        .map(|(key, obj)| {
            let seen = Observed {
                uid: obj.metadata.uid.clone(),
                status: obj.data.get("status").cloned().unwrap_or(Value::Null),
            };
            (key.clone(), seen)
        })
        .collect();
    let plan = plan::plan(&desired, &observed);
    let mut failed = Vec::new();
    for key in &plan.create {
        let write = Write::new(client, node, key);
        if let Err(e) = write.put(&desired.write[key], None).await {
            failed.push(e);
        }
    }
    for key in &plan.update {
        let write = Write::new(client, node, key);
        if let Err(e) = write.put(&desired.write[key], objects.remove(key)).await {
            failed.push(e);
        }
    }
    for (key, uid) in &plan.delete {
        if let Err(e) = Write::new(client, node, key).delete(uid.clone()).await {
            failed.push(e);
        }
    }
    let writes = plan.writes();
    for e in &failed {
        tracing::warn!(error = %chain(e), "CiliumEndpoint write failed");
    }
    if failed.is_empty() {
        return Ok(Done {
            in_line: plan.in_line,
            created: plan.create.len(),
            updated: plan.update.len(),
            deleted: plan.delete.len(),
        });
    }
    Err(Error::EndpointWrites {
        failed: failed.len(),
        writes,
        first: Box::new(failed.swap_remove(0)),
    })
}

/// The writes of one CiliumEndpoint.
struct Write<'a> {
    api: Api<DynamicObject>,
    node: &'a str,
    key: &'a Key,
}

impl<'a> Write<'a> {
    fn new(client: &kube::Client, node: &'a str, key: &'a Key) -> Write<'a> {
        Write {
            api: Api::namespaced_with(client.clone(), &key.0, &resource()),
            node,
            key,
        }
    }

    /// Creates the object with `status`, or replaces `current` (as listed) with it.
    async fn put(&self, status: &Value, mut current: Option<DynamicObject>) -> Result<()> {
        for _ in 0..WRITE_ATTEMPTS {
            let creating = current.is_none();
            let obj = self.object(status, current.take());
            let params = PostParams::default();
            let written = if creating {
                self.api.create(&params, &obj).await
            } else {
                self.api.replace(&self.key.1, &params, &obj).await
            };
            match written {
                Ok(_) => return Ok(()),
                // AlreadyExists: written since the list, or by someone else without this
                // node's label (a pod of that name that ran elsewhere before): the pod's
                // endpoint is here now, so the object is taken over. Conflict: changed
                // since it was read. Either way, read it again and replace that.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    current = (self.api.get_opt(&self.key.1).await)
                        .map_err(|source| self.error("read", source))?;
                }
                Err(source) => {
                    return Err(self.error(if creating { "create" } else { "update" }, source));
                }
            }
        }
        Err(Error::EndpointConflicts {
            namespace: self.key.0.clone(),
            name: self.key.1.clone(),
            attempts: WRITE_ATTEMPTS,
        })
    }

    /// Deletes the object if it still has `uid` (the one it was listed with): one written
    /// since then, for a new pod of the same name, is the next pass's to judge.
    async fn delete(&self, uid: Option<String>) -> Result<()> {
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&self.key.1, &params).await {
            Ok(_) => Ok(()),
            // Gone already, or replaced since the list (the precondition failed).
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(source) => Err(self.error("delete", source)),
        }
    }

    /// The object to write: `current` (keeping its metadata, resourceVersion included, so a
    /// replace of a changed object fails with a conflict) or a new one, with this node's
    /// label and `status`.
    fn object(&self, status: &Value, current: Option<DynamicObject>) -> DynamicObject {
        let mut obj = current
            .unwrap_or_else(|| DynamicObject::new(&self.key.1, &resource()).within(&self.key.0));
        // The items of a list carry no apiVersion and kind, and a PUT without them is
        // refused by a real API server.
        obj.types = Some(TypeMeta {
            api_version: "cilium.io/v2".into(),
            kind: "CiliumEndpoint".into(),
        });
        obj.metadata.managed_fields = None;
        obj.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(NODE_LABEL.to_string(), self.node.to_string());
        obj.data["status"] = status.clone();
        obj
    }

    fn error(&self, verb: &'static str, source: kube::Error) -> Error {
        Error::WriteEndpoint {
            verb,
            namespace: self.key.0.clone(),
            name: self.key.1.clone(),
            source: Box::new(source),
        }
    }
}

/// `cilium.io/v2` CiliumEndpoints.
fn resource() -> ApiResource {
    ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumEndpoint".into(),
        plural: "ciliumendpoints".into(),
    }
}

/// One `()` per deletion of one of `node`'s CiliumEndpoints, from a watch (kube-runtime's
/// watcher, with its backoff while the API server fails): so that an object someone else
/// deleted is written again at once rather than at the next resync. The agent's own deletes
/// come back too, costing a pass that finds everything in line.
fn deletions_of(client: kube::Client, node: &str) -> BoxStream<'static, ()> {
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    let config = watcher::Config::default().labels(&format!("{NODE_LABEL}={node}"));
    watcher::watcher(api, config)
        .default_backoff()
        .filter_map(|event| {
            futures::future::ready(matches!(event, Ok(watcher::Event::Delete(_))).then_some(()))
        })
        .boxed()
}

/// Completes at the next item of `stream`; never when there is none or it has ended.
async fn next(stream: Option<&mut BoxStream<'static, ()>>) {
    if let Some(stream) = stream
        && stream.next().await.is_some()
    {
        return;
    }
    std::future::pending().await
}

/// Completes when `rx` changes; never when there is none or its sender is gone.
async fn changed(rx: Option<&mut watch::Receiver<u64>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use cellium_hive::{ConfigSources, Hive, Level, Module};
    use cellium_test_apiserver::ApiServer;
    use serde_json::json;

    use super::*;
    use crate::K8sConfig;
    use crate::endpoints::plan::tests::ep;

    /// A test API server with namespace `shop`, and a client of it.
    fn server() -> (ApiServer, kube::Client) {
        let (server, client, _) = server_at();
        (server, client)
    }

    /// The same, and its URL.
    fn server_at() -> (ApiServer, kube::Client, String) {
        let server = ApiServer::new();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        server.serve(listener).unwrap();
        server
            .apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n")
            .unwrap();
        let config = kube::Config::new(url.parse().unwrap());
        (server, kube::Client::try_from(config).unwrap(), url)
    }

    fn cep(server: &ApiServer, name: &str) -> Option<Value> {
        server.get("cilium.io/v2", "CiliumEndpoint", Some("shop"), name)
    }

    fn put(server: &ApiServer, name: &str, node: Option<&str>, status: Value) {
        let labels = node.map_or(json!({}), |n| json!({ NODE_LABEL: n }));
        server
            .create(json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumEndpoint",
                "metadata": {"name": name, "namespace": "shop", "labels": labels},
                "status": status,
            }))
            .unwrap();
    }

    #[tokio::test]
    async fn a_pass_writes_the_nodes_objects_and_only_those() {
        let (server, client) = server();
        let node_ip: IpAddr = "192.168.5.1".parse().unwrap();
        let eps = [
            ep(1, Some(("shop", "web")), &["10.0.0.1"]),
            ep(2, Some(("shop", "moved")), &["10.0.0.2"]),
            ep(3, Some(("shop", "taken")), &["10.0.0.3"]),
        ];
        // Left by this node's agent before a restart, for pods that have gone since.
        put(&server, "stale", Some("n1"), json!({"id": 9}));
        // Of the pod that moved: its old status.
        put(
            &server,
            "moved",
            Some("n1"),
            json!({"id": 2, "state": "ready"}),
        );
        // Another node's object, and one of this pod's name that nobody labelled (written
        // for a pod of that name elsewhere, say).
        put(&server, "elsewhere", Some("n2"), json!({"id": 7}));
        put(&server, "taken", None, json!({"id": 70}));

        let done = reconcile(&client, "n1", &eps, Some(node_ip)).await.unwrap();
        assert_eq!(
            done,
            Done {
                in_line: 0,
                created: 2,
                updated: 1,
                deleted: 1
            }
        );
        assert!(cep(&server, "stale").is_none());
        assert_eq!(cep(&server, "elsewhere").unwrap()["status"]["id"], 7);
        for (name, e) in [("web", &eps[0]), ("moved", &eps[1]), ("taken", &eps[2])] {
            let obj = cep(&server, name).unwrap();
            assert_eq!(obj["metadata"]["labels"][NODE_LABEL], "n1", "{name}");
            let want = serde_json::to_value(plan::status(e, Some(node_ip))).unwrap();
            assert_eq!(obj["status"], want, "{name}");
        }
        assert_eq!(
            cep(&server, "web").unwrap()["status"]["networking"]["node"],
            "192.168.5.1"
        );

        // In line: one LIST, no write.
        let before = server.requests();
        let done = reconcile(&client, "n1", &eps, Some(node_ip)).await.unwrap();
        assert_eq!((done.in_line, done.created + done.updated), (3, 0));
        assert_eq!(server.requests() - before, 1);

        // Deleted by someone else: written again. Its pod's endpoint gone: deleted.
        server
            .delete("cilium.io/v2", "CiliumEndpoint", Some("shop"), "web")
            .unwrap();
        let done = reconcile(&client, "n1", &eps[..2], Some(node_ip))
            .await
            .unwrap();
        assert_eq!((done.created, done.deleted), (1, 1));
        assert!(cep(&server, "web").is_some() && cep(&server, "taken").is_none());
    }

    #[tokio::test]
    async fn failures_are_counted_and_the_other_writes_made() {
        let (server, client) = server();
        let eps = [
            ep(1, Some(("shop", "web")), &["10.0.0.1"]),
            ep(2, Some(("no-such-ns", "db")), &["10.0.0.2"]),
        ];
        let err = reconcile(&client, "n1", &eps, None).await.unwrap_err();
        let msg = chain(&err);
        assert!(
            msg.starts_with(
                "1 of 2 CiliumEndpoint writes failed, the first: cannot create CiliumEndpoint no-such-ns/db"
            ),
            "{msg}"
        );
        assert!(cep(&server, "web").is_some(), "the other write was made");

        // A 500 (kube's client retries 429, 503 and 504 itself): the pass fails at its list.
        server.fail_requests(1, 500);
        let err = reconcile(&client, "n1", &eps[..1], None).await.unwrap_err();
        assert!(matches!(err, Error::ListEndpoints(_)), "{}", chain(&err));
        reconcile(&client, "n1", &eps[..1], None).await.unwrap();
    }

    /// Endpoints a test sets.
    #[derive(Default)]
    struct Fake {
        list: std::sync::Mutex<Vec<Endpoint>>,
        changes: watch::Sender<u64>,
    }

    impl Fake {
        fn set(&self, eps: Vec<Endpoint>) {
            *self.list.lock().unwrap() = eps;
            self.changes.send_modify(|n| *n += 1);
        }
    }

    impl NodeEndpoints for Fake {
        fn list(&self) -> Vec<Endpoint> {
            self.list.lock().unwrap().clone()
        }

        fn changes(&self) -> watch::Receiver<u64> {
            self.changes.subscribe()
        }
    }

    /// Waits (10 s at most) until `f` holds, polling every 5 ms.
    async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let began = std::time::Instant::now();
        while !f() {
            assert!(began.elapsed() < Duration::from_secs(10), "never: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn the_job_follows_the_endpoints_and_retries_with_backoff_while_degraded() {
        let (server, _client, url) = server_at();
        let fake = Arc::new(Fake::default());
        fake.set(vec![ep(1, Some(("shop", "web")), &["10.0.0.1"])]);
        let f = fake.clone();
        let mut hive = Hive::new([Module::new("k8s-watchers", "under test")
            .config::<K8sConfig>()
            .provide(K8sWatchers::new)
            .invoke(move |w: Arc<K8sWatchers>, jobs: Jobs| add_job(w, f.clone(), None, &jobs))
            .into()])
        .with_config(
            ConfigSources::new()
                .flag("k8s-api-server", &url)
                .flag("node-name", "n1"),
        );
        let health = hive.health();
        hive.start().await.unwrap();
        let job = || health.node("k8s-watchers.ciliumendpoints").unwrap().status;
        eventually("the first pass", || cep(&server, "web").is_some()).await;
        eventually("OK after it", || job().level == Level::Ok).await;
        assert_eq!(
            job().message,
            "1 CiliumEndpoints written (last pass: 1 created, 0 updated, 0 deleted)"
        );

        // A change runs a pass at once, not at the resync.
        fake.set(vec![
            ep(1, Some(("shop", "web")), &["10.0.0.1"]),
            ep(2, Some(("shop", "db")), &["10.0.0.2"]),
        ]);
        tokio::time::timeout(
            Duration::from_secs(2),
            eventually("db's object", || cep(&server, "db").is_some()),
        )
        .await
        .unwrap();

        // A failed pass: Degraded with the error and the delay, then OK at the retry.
        server.fail_requests(1, 500);
        fake.set(vec![ep(1, Some(("shop", "web")), &["10.0.0.1"])]);
        eventually("Degraded", || job().level == Level::Degraded).await;
        let msg = job().message;
        assert!(
            msg.starts_with("cannot list this node's CiliumEndpoints: ")
                && msg.ends_with("; retrying in 1s"),
            "{msg}"
        );
        eventually("db's object deleted at the retry", || {
            cep(&server, "db").is_none()
        })
        .await;
        eventually("OK again", || job().level == Level::Ok).await;
        hive.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_listed_object_is_written_back_whole_with_its_kind_and_this_nodes_label() {
        let (_server, client) = server();
        let key = ("shop".to_string(), "web".to_string());
        let write = Write::new(&client, "n1", &key);
        // As a list's item: no apiVersion nor kind, someone's label, a resourceVersion.
        let mut listed = DynamicObject::new("web", &resource()).within("shop");
        listed.types = None;
        listed.metadata.resource_version = Some("42".into());
        listed.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        listed.data = json!({"status": {"id": 1}});
        let obj = write.object(&json!({"id": 2}), Some(listed));
        let types = obj.types.as_ref().unwrap();
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("cilium.io/v2", "CiliumEndpoint")
        );
        assert_eq!(obj.metadata.resource_version.as_deref(), Some("42"));
        let labels = obj.metadata.labels.as_ref().unwrap();
        assert_eq!(
            (labels["team"].as_str(), labels[NODE_LABEL].as_str()),
            ("a", "n1")
        );
        assert_eq!(obj.data["status"], json!({"id": 2}));
    }

    #[tokio::test]
    async fn the_deletion_of_one_of_the_nodes_objects_is_seen() {
        let (server, client) = server();
        put(&server, "mine", Some("n1"), json!({"id": 1}));
        put(&server, "theirs", Some("n2"), json!({"id": 2}));
        let mut deletions = deletions_of(client, "n1");
        let first = tokio::time::timeout(Duration::from_millis(300), deletions.next()).await;
        assert!(first.is_err(), "the initial list is no deletion");
        for name in ["theirs", "mine"] {
            server
                .delete("cilium.io/v2", "CiliumEndpoint", Some("shop"), name)
                .unwrap();
        }
        tokio::time::timeout(Duration::from_secs(5), deletions.next())
            .await
            .expect("this node's object's deletion")
            .unwrap();
        let more = tokio::time::timeout(Duration::from_millis(300), deletions.next()).await;
        assert!(more.is_err(), "another node's object is not watched");
    }

    #[tokio::test]
    async fn a_write_that_conflicts_reads_the_object_again() {
        let (server, client) = server();
        let key = ("shop".to_string(), "web".to_string());
        let write = Write::new(&client, "n1", &key);
        write.put(&json!({"id": 1}), None).await.unwrap();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "shop", &resource());
        let listed = api.get("web").await.unwrap();
        // Changed by someone else after it was read: the replace of the stale copy gets a
        // 409, and the write is made on the object as it is now.
        let mut theirs = listed.clone();
        theirs.data["status"] = json!({"id": 50});
        api.replace("web", &PostParams::default(), &theirs)
            .await
            .unwrap();
        write.put(&json!({"id": 2}), Some(listed)).await.unwrap();
        assert_eq!(cep(&server, "web").unwrap()["status"], json!({"id": 2}));

        // Deleted since it was listed: the delete by the listed uid is a no-op, and so is
        // one whose object was replaced by a new one (another uid).
        let uid = cep(&server, "web").unwrap()["metadata"]["uid"]
            .as_str()
            .map(String::from);
        server
            .delete("cilium.io/v2", "CiliumEndpoint", Some("shop"), "web")
            .unwrap();
        write.delete(uid.clone()).await.unwrap();
        write.put(&json!({"id": 3}), None).await.unwrap();
        write.delete(uid).await.unwrap();
        assert_eq!(
            cep(&server, "web").unwrap()["status"]["id"],
            3,
            "a new object of the name is not deleted by the old uid"
        );
    }
}

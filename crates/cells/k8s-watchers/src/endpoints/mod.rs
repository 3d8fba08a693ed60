//! CiliumEndpoint objects: one per endpoint of this node, as Cilium's agent writes them, so
//! that what reads the cluster (`kubectl get cep`, other agents, observability tools) finds
//! each pod's endpoint id, identity, labels and addresses.
//!
//! A level-triggered loop, the job `k8s-watchers.ciliumendpoints`: each pass lists the
//! node's endpoints and the CiliumEndpoints labelled [`NODE_LABEL`]`=<node>`, then creates
//! the missing ones, replaces those whose status differs and deletes those whose endpoint
//! is gone (`plan.rs` decides, `write.rs` writes). A pass runs at start (after the
//! endpoints are restored, so a restart deletes the objects of pods that went meanwhile),
//! whenever the endpoints change or the node's IP does (it is in the objects), when a watch
//! of the node's objects sees one deleted (someone else's delete is undone at once), and
//! every [`RESYNC`] to put back what someone else changed; [`DEBOUNCE`] after its trigger,
//! so a burst makes one pass.
//!
//! Why a label: the API server filters by it, so a pass reads only this node's objects and
//! needs no index of its own; and it does not depend on the node's IP, which may be unknown
//! or change. Why no owner references to the Pods: the Pods table keeps no uid, and a pod
//! deleted and created again under the same name has a new one, so a stale reference would
//! let the garbage collector delete the new pod's object.

mod plan;
mod write;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cellium_api::StatusNote;
use cellium_endpoint_manager::{Endpoint, EndpointManager};
use cellium_hive::{Backoff, Config, JobContext, Jobs};
use cellium_identity::{AllocationMode, IdentityConfig};
use cellium_resources::{ApiSource, ObjectKey, Resources};
use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::error::Result;
use crate::watchers::{K8sWatchers, chain};
use write::{Done, reconcile, resource};

/// The label on every CiliumEndpoint an agent writes, with its node's name as the value (a
/// name longer than a label value may be is cut, with a digest of the whole: see
/// `plan::owner_label`): how an agent finds its own objects again, across restarts.
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

/// The contribution of the k8s-watchers module: starts the job in Kubernetes mode when the agent
/// has an endpoint manager (optional, as the resources tables are: an agent built without
/// them still has this module, which the resources cell depends on); does nothing otherwise.
/// Its jobs start after the endpoint manager's restore, which they depend on. With
/// `identity-allocation-mode: kvstore` no CiliumEndpoint is written (the kvstore's ip entries
/// replace them).
///
/// Returns the status note of Kubernetes mode (`cellium status`: the API server and the node's
/// name), which the API server takes: so the API starts after this job and stops before it,
/// as it does for every cell.
pub(crate) fn start(
    watchers: Arc<K8sWatchers>,
    endpoints: Option<Arc<EndpointManager>>,
    resources: Option<Arc<Resources>>,
    jobs: Jobs,
    identity: Config<IdentityConfig>,
) -> Arc<StatusNote> {
    let note = {
        let (server, node) = (watchers.server(), watchers.node_name());
        Arc::new(StatusNote::new(move || {
            server
                .as_ref()
                .map(|s| format!("Kubernetes mode: API server {s}, node {node}"))
        }))
    };
    if watchers.server().is_none() {
        return note;
    }
    if identity.identity_allocation_mode == AllocationMode::Kvstore {
        // The kvstore's ip entries say what CiliumEndpoints would: writing both is the churn
        // the kvstore mode exists to spare the API server.
        tracing::info!("identity-allocation-mode kvstore: no CiliumEndpoints are written");
        return note;
    }
    let Some(endpoints) = endpoints else {
        tracing::info!("this agent has no endpoint manager: no CiliumEndpoints are written");
        return note;
    };
    add_job(watchers, endpoints, resources, &jobs);
    note
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

impl CepSync {
    /// Passes until the job is cancelled: after a success, at the next trigger or resync;
    /// after a failure (Degraded with the error), after the backoff's delay.
    async fn run(&self, ctx: JobContext) {
        let reporter = ctx.reporter();
        let mut changes = self.endpoints.changes();
        let mut nodes = self.resources.as_ref().map(|r| r.nodes.revision());
        let node = self.watchers.node_name();
        let owner = plan::owner_label(&node);
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
                outcome = self.pass(&owner, node_ip) => outcome,
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
                        deletions = Some(deletions_of(client, &owner));
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
    async fn pass(&self, owner: &str, node_ip: Option<IpAddr>) -> Result<Done> {
        let client = self.watchers.client().await?;
        let resources = self.resources.as_deref();
        // A pod that is gone publishes no ports: its CiliumEndpoint goes with it.
        let ports = |ep: &Endpoint| {
            cellium_endpoint_manager::named_ports(ep, resources).unwrap_or_default()
        };
        let desired = plan::desired(&self.endpoints.list(), node_ip, &ports);
        reconcile(&client, owner, desired).await
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

/// One `()` per deletion of a CiliumEndpoint labelled [`NODE_LABEL`]`=<owner>`, from a watch
/// (kube-runtime's watcher, with its backoff while the API server fails): so that an object
/// someone else deleted is written again at once rather than at the next resync. The agent's
/// own deletes come back too, costing a pass that finds everything in line.
fn deletions_of(client: kube::Client, owner: &str) -> BoxStream<'static, ()> {
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    let config = watcher::Config::default().labels(&format!("{NODE_LABEL}={owner}"));
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
    use serde_json::json;

    use super::*;
    use crate::K8sConfig;
    use crate::endpoints::plan::tests::ep;
    use crate::endpoints::write::tests::{cep, put, server, server_at};

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
            "1 CiliumEndpoints in line (last pass: 1 created, 0 updated, 0 deleted)"
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
    async fn standalone_or_without_an_endpoint_manager_there_is_no_job() {
        let (_server, _client, url) = server_at();
        for server in [None, Some(url)] {
            let mut config = ConfigSources::new().flag("node-name", "n1");
            if let Some(url) = &server {
                config = config.flag("k8s-api-server", url);
            } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
                continue;
            }
            let mut hive = Hive::new([Module::new("k8s-watchers", "under test")
                .config::<K8sConfig>()
                .provide(K8sWatchers::new)
                .invoke(|w: Arc<K8sWatchers>, jobs: Jobs| {
                    start(w, None, None, jobs, Config::new(IdentityConfig::default()));
                })
                .into()])
            .with_config(config);
            hive.start().await.unwrap();
            assert!(
                hive.health().node("k8s-watchers.ciliumendpoints").is_none(),
                "server {server:?}"
            );
            hive.stop().await.unwrap();
        }
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
}

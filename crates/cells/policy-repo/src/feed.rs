//! Feeding the repository: the cell's constructor and its `feed` job, which follows the
//! resources tables (policies, pods, namespaces) and the identities.
//!
//! Each source is taken as a snapshot and a subscription with no gap between them; a
//! subscriber that falls behind (`Lagged`) resynchronises that source from its current
//! state, which is safe because every update is idempotent.

use std::sync::Arc;

use cellium_hive::{Backoff, BoxError, Config, Hook, JobContext, Jobs, Lifecycle, Reporter};
use cellium_identity::{Identities, IdentityEvent};
use cellium_ipcache::Ipcache;
use cellium_labels::Labels;
use cellium_resources::{Event, Namespace, Object, ObjectKey, Pod, Resources};
use tokio::sync::broadcast::error::RecvError;

use crate::config::PolicyConfig;
use crate::policy_dir;
use crate::repository::PolicyRepository;
use crate::rule::PolicyKind;

impl PolicyRepository {
    /// The cell's constructor: the `feed` job fills the repository from the resources
    /// tables and the identities; with `policy-dir` set, the `policy-dir` job applies the
    /// directory's files.
    pub fn new(
        cfg: Config<PolicyConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        resources: Arc<Resources>,
        identities: Arc<Identities>,
        ipcache: Arc<Ipcache>,
    ) -> Arc<PolicyRepository> {
        let repo = Arc::new(PolicyRepository::with_parts(
            identities.clone(),
            Some(ipcache),
            Some(reporter),
        ));
        // The repository holds every policy and identity before the cells that resolve
        // policies start (the endpoint manager restores endpoints in its own start hook):
        // without this, a restored endpoint could be regenerated against an empty repository
        // and open up for a moment what its policy closes.
        let (r, res, ids) = (repo.clone(), resources.clone(), identities.clone());
        lc.append(Hook::new("initial-sync").on_start(move |_| async move {
            let (snapshot, _) = ids.snapshot_and_subscribe();
            r.sync_identities(&snapshot);
            r.sync_resources(&res);
            r.report_now();
            Ok(())
        }));
        let (r, res, ids) = (repo.clone(), resources.clone(), identities);
        jobs.one_shot("feed", move |ctx| {
            feed(ctx, r.clone(), res.clone(), ids.clone())
        })
        .retry(Backoff::default())
        .add();
        if let Some(dir) = cfg.policy_dir() {
            policy_dir::watch(&jobs, dir.to_path_buf(), resources);
        }
        repo
    }
}

async fn feed(
    ctx: JobContext,
    repo: Arc<PolicyRepository>,
    res: Arc<Resources>,
    ids: Arc<Identities>,
) -> Result<(), BoxError> {
    // Subscriptions first, each with its snapshot, so that nothing falls between.
    let (_, mut nps) = res.network_policies.snapshot_and_subscribe();
    let (_, mut cnps) = res.cilium_network_policies.snapshot_and_subscribe();
    let (_, mut ccnps) = res
        .cilium_clusterwide_network_policies
        .snapshot_and_subscribe();
    let (_, mut pods) = res.pods.snapshot_and_subscribe();
    let (_, mut namespaces) = res.namespaces.snapshot_and_subscribe();
    let (snapshot, mut id_events) = ids.snapshot_and_subscribe();
    // Identities before rules, so the first revision already resolves selectors fully.
    repo.sync_identities(&snapshot);
    repo.sync_resources(&res);
    repo.report_now();
    ctx.reporter()
        .ok("following policies, pods, namespaces and identities");
    loop {
        tokio::select! {
            _ = ctx.cancelled() => return Ok(()),
            ev = id_events.recv() => match ev {
                Ok(IdentityEvent::Added(i)) => repo.identity_added(&i),
                Ok(IdentityEvent::Removed(i)) => repo.identity_removed(&i),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "identity events missed; resynchronising");
                    let (snapshot, rx) = ids.snapshot_and_subscribe();
                    id_events = rx;
                    repo.sync_identities(&snapshot);
                }
                Err(RecvError::Closed) => return Err("the identity events ended".into()),
            },
            ev = nps.recv() => table_event(&repo, &res, PolicyKind::NetworkPolicy, ev, |r, p| r.upsert_network_policy(p))?,
            ev = cnps.recv() => table_event(&repo, &res, PolicyKind::CiliumNetworkPolicy, ev, |r, p| r.upsert_cilium_network_policy(p))?,
            ev = ccnps.recv() => table_event(&repo, &res, PolicyKind::CiliumClusterwideNetworkPolicy, ev, |r, p| r.upsert_cilium_clusterwide_network_policy(p))?,
            ev = pods.recv() => match ev {
                Ok(Event::Upsert { new, .. }) => pod_changed(&repo, &res, &new),
                Ok(Event::Delete(old)) => repo.set_pod_ports(old.key(), None),
                Err(RecvError::Lagged(_)) => repo.sync_resources(&res),
                Err(RecvError::Closed) => return Err("the pod events ended".into()),
            },
            ev = namespaces.recv() => match ev {
                Ok(Event::Upsert { new, .. }) => namespace_changed(&repo, &res, &new),
                // Its pods are deleted with it, each with its own event.
                Ok(Event::Delete(_)) => {}
                Err(RecvError::Lagged(_)) => repo.sync_resources(&res),
                Err(RecvError::Closed) => return Err("the namespace events ended".into()),
            },
        }
    }
}

fn table_event<T: Object>(
    repo: &PolicyRepository,
    res: &Resources,
    kind: PolicyKind,
    ev: Result<Event<T>, RecvError>,
    upsert: impl Fn(&PolicyRepository, &T),
) -> Result<(), BoxError> {
    match ev {
        Ok(Event::Upsert { new, .. }) => upsert(repo, &new),
        Ok(Event::Delete(old)) => repo.remove(kind, &old.key()),
        Err(RecvError::Lagged(n)) => {
            tracing::warn!(missed = n, %kind, "policy events missed; resynchronising");
            repo.sync_resources(res);
        }
        Err(RecvError::Closed) => return Err(format!("the {kind} events ended").into()),
    }
    Ok(())
}

fn pod_changed(repo: &PolicyRepository, res: &Resources, pod: &Pod) {
    let ns_labels = res
        .namespaces
        .get(&ObjectKey::cluster(&pod.namespace))
        .map(|n| n.labels.clone())
        .unwrap_or_default();
    let labels = Labels::for_pod(&pod.namespace, &pod.labels, &ns_labels);
    repo.set_pod_ports(pod.key(), Some((labels, pod.ports.clone())));
}

fn namespace_changed(repo: &PolicyRepository, res: &Resources, ns: &Namespace) {
    for pod in res.pods.list_namespace(&ns.name) {
        pod_changed(repo, res, &pod);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use cellium_hive::{ConfigSources, Hive, Module};
    use cellium_labels::Labels;

    use super::*;
    use crate::resolve::Subject;

    async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never happened: {what}");
    }

    const NP: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db}\nspec:\n  podSelector: {matchLabels: {app: db}}\n  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]\n";

    #[tokio::test]
    async fn the_cell_follows_the_tables_the_identities_and_the_policy_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("np.yaml"), NP).unwrap();
        let resources = Resources::new();
        let ids = Identities::in_memory();
        let slot: Arc<Mutex<Option<Arc<PolicyRepository>>>> = Arc::default();
        let (r, i, s) = (resources.clone(), ids.clone(), slot.clone());
        let mut hive = Hive::new([
            Module::new("tables", "The resources, identities and ipcache, in memory")
                .provide(move || r.clone())
                .provide(move || i.clone())
                .provide(Ipcache::in_memory)
                .into(),
            crate::cell()
                .invoke(move |repo: Arc<PolicyRepository>| {
                    *s.lock().unwrap() = Some(repo);
                })
                .into(),
        ])
        .with_config(ConfigSources::new().flag("policy-dir", dir.path()));
        let health = hive.health();
        hive.start().await.unwrap();
        let repo = slot.lock().unwrap().clone().unwrap();

        // The directory's policy reaches the table, then the repository.
        eventually("the policy is applied", || repo.rules().len() == 2).await;
        let db = Labels::for_pod(
            "default",
            &[("app".into(), "db".into())].into(),
            &Default::default(),
        );
        let subject = Subject {
            identity: 300,
            labels: &db,
            named_ports: &[],
        };
        assert!(repo.resolve(&subject).ingress_enforced);

        // A new identity that the peer selector matches joins the resolved rules.
        let mut changes = repo.changes();
        changes.borrow_and_update();
        let web = ids
            .allocate(&Labels::for_pod(
                "default",
                &[("app".into(), "web".into())].into(),
                &Default::default(),
            ))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .unwrap()
            .unwrap();
        eventually("the web identity is a peer", || {
            repo.resolve(&subject)
                .rules
                .iter()
                .any(|r| r.identity == web.id)
        })
        .await;
        assert_eq!(
            health.node("policy-repo").unwrap().status.level,
            cellium_hive::Level::Ok
        );

        // A policy the repository cannot express is reported, and not enforced.
        let long = "x".repeat(40);
        resources
            .apply(
                "bad.yaml",
                &format!("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: bad}}\nspec:\n  podSelector: {{}}\n  ingress: [{{from: [{{namespaceSelector: {{matchLabels: {{{long}: a}}}}}}]}}]\n"),
            )
            .unwrap();
        eventually("the problem is reported", || {
            health.node("policy-repo").unwrap().status.level == cellium_hive::Level::Degraded
        })
        .await;
        assert!(
            repo.problems()[0].starts_with("NetworkPolicy default/bad: spec.ingress[0]"),
            "{:?}",
            repo.problems()
        );

        // Removing the file deletes its policy.
        std::fs::remove_file(dir.path().join("np.yaml")).unwrap();
        eventually("the policy is gone", || {
            resources.network_policies.len() == 1
        })
        .await;
        eventually("its rules are gone", || repo.rules().is_empty()).await;
        hive.stop().await.unwrap();
    }
}

//! Feeding the repository: the cell's constructor and its `feed` job, which follows the
//! policy tables of the resources, the identities, and the named ports the ipcache carries.
//!
//! Each source is taken as a snapshot and a subscription with no gap between them; a
//! subscriber that falls behind (`Lagged`) resynchronises that source from its current
//! state, which is safe because every update is idempotent.

use std::sync::{Arc, Mutex};

use cellium_hive::{Backoff, BoxError, Config, Hook, JobContext, Jobs, Lifecycle, Reporter};
use cellium_identity::{Identities, IdentityEvent};
use cellium_ipcache::Ipcache;
use cellium_resources::{
    CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy, Event, NetworkPolicy, Object, PolicyGap,
    Resources,
};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};

use crate::config::PolicyConfig;
use crate::repository::PolicyRepository;
use crate::rule::PolicyKind;

impl PolicyRepository {
    /// The cell's constructor: the `feed` job fills the repository from the resources
    /// tables, the identities and the ipcache's named ports.
    pub fn new(
        cfg: Config<PolicyConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        resources: Arc<Resources>,
        identities: Arc<Identities>,
        ipcache: Arc<Ipcache>,
    ) -> Arc<PolicyRepository> {
        let repo = Arc::new(
            PolicyRepository::with_parts(identities.clone(), Some(ipcache.clone()), Some(reporter))
                .with_audit_mode(cfg.policy_audit_mode),
        );
        // The repository holds every policy and identity before the cells that resolve
        // policies start (the endpoint manager restores endpoints in its own start hook):
        // without this, a restored endpoint could be regenerated against an empty repository
        // and open up for a moment what its policy closes. The job goes on from the
        // subscriptions this sync took, rather than translating every policy again while the
        // start goes on; only a retry of the job syncs afresh.
        let first: Arc<Mutex<Option<Sources>>> = Arc::default();
        let (r, res, ids, ipc, slot) = (
            repo.clone(),
            resources.clone(),
            identities.clone(),
            ipcache.clone(),
            first.clone(),
        );
        lc.append(Hook::new("initial-sync").on_start(move |_| async move {
            let sources = Sources::sync(&r, &res, &ids, &ipc);
            r.report_now();
            *lock(&slot) = Some(sources);
            Ok(())
        }));
        let (r, res, ids) = (repo.clone(), resources.clone(), identities);
        jobs.one_shot("feed", move |ctx| {
            let sources = lock(&first).take();
            feed(
                ctx,
                r.clone(),
                res.clone(),
                ids.clone(),
                ipcache.clone(),
                sources,
            )
        })
        .retry(Backoff::default())
        .add();
        repo
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the repository follows, subscribed before the state it was synced from was read, so
/// that nothing falls between.
struct Sources {
    nps: broadcast::Receiver<Event<NetworkPolicy>>,
    cnps: broadcast::Receiver<Event<CiliumNetworkPolicy>>,
    ccnps: broadcast::Receiver<Event<CiliumClusterwideNetworkPolicy>>,
    named_ports: watch::Receiver<u64>,
    gaps: watch::Receiver<Vec<PolicyGap>>,
    id_events: broadcast::Receiver<IdentityEvent>,
    /// The revisions of the CIDR groups, services and EndpointSlices Cilium rules name.
    cidr_groups: watch::Receiver<u64>,
    services: watch::Receiver<u64>,
    slices: watch::Receiver<u64>,
}

impl Sources {
    /// Subscribes to every source, then makes the repository what they hold now.
    fn sync(
        repo: &PolicyRepository,
        res: &Resources,
        ids: &Identities,
        ipcache: &Ipcache,
    ) -> Sources {
        let (_, nps) = res.network_policies.snapshot_and_subscribe();
        let (_, cnps) = res.cilium_network_policies.snapshot_and_subscribe();
        let (_, ccnps) = res
            .cilium_clusterwide_network_policies
            .snapshot_and_subscribe();
        let named_ports = ipcache.named_port_changes();
        let cidr_groups = res.cilium_cidr_groups.revision();
        let services = res.services.revision();
        let slices = res.endpoint_slices.revision();
        let mut gaps = res.policy_gaps();
        let (snapshot, id_events) = ids.snapshot_and_subscribe();
        // Identities before rules, so the first revision already resolves selectors fully.
        repo.sync_identities(&snapshot);
        repo.sync_resources(res);
        repo.sync_named_ports();
        repo.set_policy_gaps(gaps.borrow_and_update().clone());
        Sources {
            nps,
            cnps,
            ccnps,
            named_ports,
            gaps,
            id_events,
            cidr_groups,
            services,
            slices,
        }
    }
}

async fn feed(
    ctx: JobContext,
    repo: Arc<PolicyRepository>,
    res: Arc<Resources>,
    ids: Arc<Identities>,
    ipcache: Arc<Ipcache>,
    first: Option<Sources>,
) -> Result<(), BoxError> {
    let mut s = match first {
        Some(sources) => sources,
        None => {
            let sources = Sources::sync(&repo, &res, &ids, &ipcache);
            repo.report_now();
            sources
        }
    };
    ctx.reporter()
        .ok("following policies, pods, namespaces and identities");
    loop {
        tokio::select! {
            _ = ctx.cancelled() => return Ok(()),
            ev = s.id_events.recv() => match ev {
                Ok(IdentityEvent::Added(i)) => repo.identity_added(&i),
                Ok(IdentityEvent::Removed(i)) => repo.identity_removed(&i),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "identity events missed; resynchronising");
                    let (snapshot, rx) = ids.snapshot_and_subscribe();
                    s.id_events = rx;
                    repo.sync_identities(&snapshot);
                }
                Err(RecvError::Closed) => return Err("the identity events ended".into()),
            },
            ev = s.nps.recv() => table_event(&repo, &res, PolicyKind::NetworkPolicy, ev, |r, p| r.upsert_network_policy(p))?,
            ev = s.cnps.recv() => table_event(&repo, &res, PolicyKind::CiliumNetworkPolicy, ev, |r, p| r.upsert_cilium_network_policy(p))?,
            ev = s.ccnps.recv() => table_event(&repo, &res, PolicyKind::CiliumClusterwideNetworkPolicy, ev, |r, p| r.upsert_cilium_clusterwide_network_policy(p))?,
            changed = s.named_ports.changed() => match changed {
                Ok(()) => repo.sync_named_ports(),
                Err(_) => return Err("the ipcache's named port changes ended".into()),
            },
            changed = s.cidr_groups.changed() => dependency(&repo, changed)?,
            changed = s.services.changed() => dependency(&repo, changed)?,
            changed = s.slices.changed() => dependency(&repo, changed)?,
            changed = s.gaps.changed() => match changed {
                Ok(()) => repo.set_policy_gaps(s.gaps.borrow_and_update().clone()),
                Err(_) => return Err("the records' policy gaps ended".into()),
            },
        }
    }
}

/// A CIDR group, service or EndpointSlice changed: the Cilium rules naming them follow.
fn dependency(
    repo: &PolicyRepository,
    changed: Result<(), watch::error::RecvError>,
) -> Result<(), BoxError> {
    changed.map_err(|_| "the CIDR group, service or EndpointSlice revisions ended")?;
    repo.follow_dependencies();
    Ok(())
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
    async fn a_policy_applied_by_a_later_start_hook_is_taken_in() {
        let resources = Resources::new();
        let (r, r2) = (resources.clone(), resources.clone());
        let slot: Arc<Mutex<Option<Arc<PolicyRepository>>>> = Arc::default();
        let s = slot.clone();
        let mut hive = Hive::new([
            Module::new("tables", "The resources, identities and ipcache, in memory")
                .provide(move || r.clone())
                .provide(Identities::in_memory)
                .provide(Ipcache::in_memory)
                .into(),
            crate::cell().into(),
            // Constructed after the repository: its hook runs after the initial sync, while
            // the feed job may not have run yet.
            Module::new("later", "Applies a policy from its start hook")
                .invoke(move |lc: Lifecycle, repo: Arc<PolicyRepository>| {
                    *s.lock().unwrap() = Some(repo);
                    let res = r2.clone();
                    lc.append(Hook::new("apply").on_start(move |_| async move {
                        res.apply("np.yaml", NP)?;
                        Ok(())
                    }));
                })
                .into(),
        ])
        .with_config(ConfigSources::new());
        hive.start().await.unwrap();
        let repo = slot.lock().unwrap().clone().unwrap();
        assert_eq!(resources.network_policies.len(), 1);
        eventually("the policy is applied", || repo.rules().len() == 2).await;
        hive.stop().await.unwrap();
    }

    #[tokio::test]
    async fn cilium_rules_follow_their_cidr_groups_and_services() {
        let resources = Resources::new();
        let ipcache = Ipcache::in_memory();
        let slot: Arc<Mutex<Option<Arc<PolicyRepository>>>> = Arc::default();
        let (r, c, s) = (resources.clone(), ipcache.clone(), slot.clone());
        let mut hive = Hive::new([
            Module::new("tables", "The resources, identities and ipcache, in memory")
                .provide(move || r.clone())
                .provide(Identities::in_memory)
                .provide(move || c.clone())
                .into(),
            crate::cell()
                .invoke(move |repo: Arc<PolicyRepository>| {
                    *s.lock().unwrap() = Some(repo);
                })
                .into(),
        ])
        .with_config(ConfigSources::new());
        hive.start().await.unwrap();
        let repo = slot.lock().unwrap().clone().unwrap();
        resources
            .apply(
                "p.yaml",
                "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: out}\nspec:\n  endpointSelector: {}\n  labels: [{key: name, value: out, source: k8s}]\n  egress:\n  - toCIDRSet: [{cidrGroupRef: vpn}]\n  - toServices: [{k8sService: {serviceName: ext}}]\n",
            )
            .unwrap();
        eventually("the policy is taken in", || {
            repo.rules().iter().any(|r| r.labels == ["k8s:name=out"])
        })
        .await;
        let peers = |repo: &PolicyRepository| -> Vec<String> {
            repo.rules()
                .into_iter()
                .flat_map(|r| r.peers.into_iter().map(|(s, _)| s))
                .collect()
        };
        assert!(peers(&repo).is_empty(), "{:?}", peers(&repo));
        let group = |cidrs: &str| {
            format!(
                "apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {{name: vpn}}\nspec: {{externalCIDRs: [{cidrs}]}}\n"
            )
        };
        let in_ipcache = |ip: &str| ipcache.lookup(ip.parse().unwrap()).is_some();
        // The group comes: its prefix gets a CIDR identity, in the ipcache.
        resources
            .apply("g.yaml", &group("198.51.100.0/24"))
            .unwrap();
        eventually("the group's prefix is a peer", || {
            in_ipcache("198.51.100.7")
        })
        .await;
        // It changes: the old prefix goes, the new one comes.
        resources.apply("g.yaml", &group("203.0.113.0/24")).unwrap();
        eventually("the new prefix replaces the old", || {
            in_ipcache("203.0.113.7") && !in_ipcache("198.51.100.7")
        })
        .await;
        // A service without a selector: the addresses of its slices, as they come.
        resources
            .apply(
                "svc.yaml",
                "apiVersion: v1\nkind: Service\nmetadata: {name: ext}\nspec: {ports: [{port: 443}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ext-1, labels: {kubernetes.io/service-name: ext}}\naddressType: IPv4\nendpoints: [{addresses: [192.0.2.10]}]\n",
            )
            .unwrap();
        eventually("the backend is a peer", || in_ipcache("192.0.2.10")).await;
        resources
            .apply(
                "slice.yaml",
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ext-1, labels: {kubernetes.io/service-name: ext}}\naddressType: IPv4\nendpoints: [{addresses: [192.0.2.10]}, {addresses: [192.0.2.11]}]\n",
            )
            .unwrap();
        eventually("the new backend is a peer", || in_ipcache("192.0.2.11")).await;
        // The group goes: its prefix too.
        resources
            .delete("g.yaml", &group("203.0.113.0/24"))
            .unwrap();
        eventually("the group's prefix is gone", || !in_ipcache("203.0.113.7")).await;
        hive.stop().await.unwrap();
    }

    #[tokio::test]
    async fn the_cell_follows_the_tables_and_the_identities() {
        let resources = Resources::new();
        let ids = Identities::in_memory();
        let ipcache = Ipcache::in_memory();
        let slot: Arc<Mutex<Option<Arc<PolicyRepository>>>> = Arc::default();
        let (r, i, c, s) = (
            resources.clone(),
            ids.clone(),
            ipcache.clone(),
            slot.clone(),
        );
        let mut hive = Hive::new([
            Module::new("tables", "The resources, identities and ipcache, in memory")
                .provide(move || r.clone())
                .provide(move || i.clone())
                .provide(move || c.clone())
                .into(),
            crate::cell()
                .invoke(move |repo: Arc<PolicyRepository>| {
                    *s.lock().unwrap() = Some(repo);
                })
                .into(),
        ])
        .with_config(ConfigSources::new());
        let health = hive.health();
        hive.start().await.unwrap();
        let repo = slot.lock().unwrap().clone().unwrap();

        // The policy reaches the repository.
        resources.apply("np.yaml", NP).unwrap();
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

        // An egress rule naming a port follows the named ports the ipcache carries for the
        // peer's address: a new revision, and the number of the peer's port of that name.
        resources
            .apply(
                "egress.yaml",
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db-out}\nspec:\n  podSelector: {matchLabels: {app: db}}\n  policyTypes: [Egress]\n  egress: [{ports: [{port: http}]}]\n",
            )
            .unwrap();
        eventually("the egress policy is taken in", || {
            repo.resolve(&subject).egress_enforced
        })
        .await;
        let rev = repo.revision();
        let web_ip: ipnet::IpNet = "10.0.0.7/32".parse().unwrap();
        ipcache
            .upsert(web_ip, web.id, cellium_ipcache::Source::Endpoint)
            .unwrap();
        ipcache.set_named_ports(
            web_ip,
            cellium_ipcache::Source::Endpoint,
            &[cellium_resources::NamedPort {
                name: "http".into(),
                port: 8080,
                protocol: cellium_resources::Protocol::Tcp,
            }],
        );
        eventually("the peer's named port is allowed", || {
            repo.resolve(&subject).rules.iter().any(|r| {
                r.identity == web.id
                    && r.direction == cellium_policy::Direction::Egress
                    && r.ports == Some(8080..=8080)
            })
        })
        .await;
        assert!(repo.revision() > rev);
        resources
            .delete(
                "egress.yaml",
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db-out}\n",
            )
            .unwrap();

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

        // Deleting the policy removes its rules.
        resources.delete("np.yaml", NP).unwrap();
        eventually("the policy is gone", || {
            resources.network_policies.len() == 1
        })
        .await;
        eventually("its rules are gone", || repo.rules().is_empty()).await;
        hive.stop().await.unwrap();
    }
}

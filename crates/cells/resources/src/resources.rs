//! The tables of the node's desired state, and applying YAML to them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter};
use cellium_statedir::StateDir;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::apply::policy_dir;
use crate::apply::record::{Record, error_chain};
use crate::config::ResourcesConfig;
use crate::error::{Error, Result};
use crate::feed::{ApiSource, Feed, Rejection};
use crate::limits::Limits;
use crate::service_ip::ServiceRanges;
use crate::table::Table;
use crate::writers::Writers;
use cellium_k8s_objects::gap::{self, GapScope, PolicyGap};
use cellium_k8s_objects::{
    CiliumCidrGroup, CiliumClusterwideNetworkPolicy, CiliumEndpoint, CiliumIdentity,
    CiliumNetworkPolicy, CiliumNode, EndpointSlice, Namespace, NetworkPolicy, Node, Pod, Service,
};
use cellium_k8s_objects::{Object, ObjectKey};

/// How long `pod_for_add` waits between two reads of the API server.
const POD_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// What happened to one object of an apply or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// It is new.
    Created,
    /// It existed and was changed.
    Configured,
    /// It existed as given.
    Unchanged,
    /// It was deleted.
    Deleted,
    /// It was to be deleted but did not exist.
    NotFound,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Unchanged => "unchanged",
            Action::Deleted => "deleted",
            Action::NotFound => "not found",
        })
    }
}

/// One object's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Its kind.
    pub kind: &'static str,
    /// Its key.
    pub key: ObjectKey,
    /// What happened.
    pub action: Action,
}

/// The node's desired state: one table per kind, read by everyone, written only by the apply
/// path ([`apply`](Resources::apply), [`delete`](Resources::delete), the restore at start),
/// which holds the tables' [`Writer`](crate::Writer)s.
#[derive(Debug)]
pub struct Resources {
    /// Namespaces (`default`, `kube-system` and `kube-public` always exist).
    pub namespaces: Table<Namespace>,
    /// Pods.
    pub pods: Table<Pod>,
    /// `networking.k8s.io/v1` NetworkPolicies.
    pub network_policies: Table<NetworkPolicy>,
    /// `cilium.io/v2` CiliumNetworkPolicies.
    pub cilium_network_policies: Table<CiliumNetworkPolicy>,
    /// `cilium.io/v2` CiliumClusterwideNetworkPolicies (keys without a namespace).
    pub cilium_clusterwide_network_policies: Table<CiliumClusterwideNetworkPolicy>,
    /// `cilium.io/v2` CiliumCIDRGroups (keys without a namespace).
    pub cilium_cidr_groups: Table<CiliumCidrGroup>,
    /// `v1` Services, their cluster IPs decided (allocated from `service-cidr` when not
    /// given).
    pub services: Table<Service>,
    /// `discovery.k8s.io/v1` EndpointSlices.
    pub endpoint_slices: Table<EndpointSlice>,
    /// `v1` Nodes (Kubernetes mode only: nothing applies them).
    pub nodes: Table<Node>,
    /// `cilium.io/v2` CiliumNodes (Kubernetes mode only).
    pub cilium_nodes: Table<CiliumNode>,
    /// `cilium.io/v2` CiliumIdentities (Kubernetes mode only).
    pub cilium_identities: Table<CiliumIdentity>,
    /// `cilium.io/v2` CiliumEndpoints of every node (Kubernetes mode only).
    pub cilium_endpoints: Table<CiliumEndpoint>,
    /// The API server that owns every kind, in Kubernetes mode.
    source: Option<Arc<dyn ApiSource>>,
    /// The range cluster IPs come from.
    pub(crate) service_ranges: ServiceRanges,
    /// `node-port-range`.
    pub(crate) node_port_range: crate::apply::node_ports::NodePortRange,
    /// The bounds on one applied text.
    pub(crate) limits: Limits,
    /// The apply lock: the writers and the record. Applies and deletes take it one at a time,
    /// so each is checked against the state it changes, but only once their text is parsed:
    /// a large or hostile text never holds it.
    state: Mutex<State>,
    /// How many requests were abandoned.
    abandoned: AtomicU64,
}

/// What the apply lock guards.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) writers: Writers,
    pub(crate) store: Store,
    /// Records on disk that are not in force, with why: reported until an apply or delete
    /// replaces or removes them.
    pub(crate) stranded: BTreeMap<String, String>,
    /// Why committed changes could not be merged into the object files, if they could not.
    pub(crate) merge_error: Option<String>,
    /// Why the last change could not be recorded (and so was refused), until one is.
    pub(crate) record_error: Option<String>,
    /// The API server's objects that cannot be put in force, by kind and key, with why.
    pub(crate) rejected: BTreeMap<(String, ObjectKey), Rejection>,
    /// The API server's objects in force without fields this version does not know, by kind
    /// and key, with those fields ([`crate::unknown`]).
    pub(crate) unknown: BTreeMap<(String, ObjectKey), Vec<String>>,
    /// The API server the objects come from, in Kubernetes mode.
    api_server: Option<String>,
    /// The stranded records that may leave an endpoint less restricted than its policy says
    /// ([`Resources::policy_gaps`]).
    gaps: watch::Sender<Vec<PolicyGap>>,
    reporter: Option<Reporter>,
}

/// The kinds whose records, when not in force, can leave an endpoint less restricted than the
/// policy recorded for it: the policies themselves, and the pods' and namespaces' labels they
/// select by, and the CIDR groups their CIDR rules name (a deny rule's group that is not in
/// force denies nothing). (A Service or an EndpointSlice not in force closes something, never
/// opens: `toServices` is taken in allow rules only.)
const POLICY_KINDS: [&str; 6] = [
    "NetworkPolicy",
    "CiliumNetworkPolicy",
    "CiliumClusterwideNetworkPolicy",
    "CiliumCIDRGroup",
    "Pod",
    "Namespace",
];

/// What the stranded record at `path` could have restricted, when it may hold what policy
/// depends on: one of [`POLICY_KINDS`] (scoped by its kind and name), or a record whose kind
/// cannot be told (the directory or the journal itself, a file named in no known way: every
/// endpoint). `None` for the other kinds.
fn stranded_scope(path: &str) -> Option<GapScope> {
    let name = path.rsplit('/').next().unwrap_or_default();
    match Record::parse_file_name(name) {
        Some((kind, key)) if POLICY_KINDS.contains(&kind) => Some(gap::scope_of_key(kind, &key)),
        Some(_) => None,
        None => Some(GapScope::Everything),
    }
}

/// Where applied objects are recorded.
#[derive(Debug)]
pub(crate) enum Store {
    /// Nowhere: in memory only.
    Memory,
    /// In the state directory, not read yet (the restore reads it).
    Unread(Arc<StateDir>),
    /// In the state directory.
    Record(Record),
}

impl Resources {
    /// Empty tables but for the system namespaces, in memory only, with the default
    /// `service-cidr` and limits.
    pub fn new() -> Arc<Resources> {
        let ranges = ServiceRanges::new(&ResourcesConfig::default().service_cidr)
            .expect("the default service range is valid");
        Arc::new(Resources::in_memory(ranges))
    }

    /// Empty tables in memory only, with cluster IPs from `service_cidr` (one range, or one
    /// per family, the first being the default family).
    pub fn with_service_cidr(service_cidr: &[ipnet::IpNet]) -> Result<Arc<Resources>> {
        let ranges = ServiceRanges::new(service_cidr).map_err(Error::ServiceCidr)?;
        Ok(Arc::new(Resources::in_memory(ranges)))
    }

    /// The cell's constructor: applied objects are recorded in the state directory and
    /// applied again by the `restore-objects` start hook, before any cell that reads the
    /// tables starts. Fails when `service-cidr` or a limit is out of range.
    pub fn persistent(
        cfg: Config<ResourcesConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        state_dir: Arc<StateDir>,
        source: Option<Arc<dyn ApiSource>>,
    ) -> Result<Arc<Resources>> {
        let ranges = ServiceRanges::new(&cfg.service_cidr).map_err(Error::ServiceCidr)?;
        let limits = Limits::from_config(&cfg)?;
        if let Some(source) = source.filter(|s| s.server().is_some()) {
            if cfg.policy_dir().is_some() {
                return Err(Error::Config {
                    key: "policy-dir",
                    reason: "in Kubernetes mode the API server owns the policies; unset policy-dir or the API server keys".into(),
                });
            }
            // Nothing is recorded: the API server is the record, and its objects come back with
            // the first list after a restart (until then, the datapath's pinned maps keep
            // enforcing what they did).
            let mut resources = Resources::build(Store::Memory, ranges, limits, Some(reporter));
            resources.source = Some(source.clone());
            resources.lock().api_server = source.server();
            let resources = Arc::new(resources);
            crate::sync::hook(&lc, resources.clone(), source);
            return Ok(resources);
        }
        let mut resources =
            Resources::build(Store::Unread(state_dir), ranges, limits, Some(reporter));
        resources.node_port_range = cfg.node_port_range;
        let resources = Arc::new(resources);
        let this = resources.clone();
        lc.append(Hook::new("restore-objects").on_start(move |_| async move {
            tokio::task::spawn_blocking(move || this.restore()).await?;
            Ok(())
        }));
        // After the restore: a file of the directory replaces a recorded object, not the
        // other way round.
        if let Some(dir) = cfg.policy_dir() {
            policy_dir::watch(&jobs, dir.to_path_buf(), resources.clone());
        }
        Ok(resources)
    }

    /// Tables in memory only: nothing to restore, so complete (synced) as they are.
    fn in_memory(ranges: ServiceRanges) -> Resources {
        let resources = Resources::build(Store::Memory, ranges, Limits::default(), None);
        resources.lock().writers.mark_all_synced();
        resources
    }

    pub(crate) fn build(
        store: Store,
        service_ranges: ServiceRanges,
        limits: Limits,
        reporter: Option<Reporter>,
    ) -> Resources {
        let writers = Writers::new();
        let readers = writers.readers();
        Resources {
            namespaces: readers.namespaces,
            pods: readers.pods,
            network_policies: readers.network_policies,
            cilium_network_policies: readers.cilium_network_policies,
            cilium_clusterwide_network_policies: readers.cilium_clusterwide_network_policies,
            cilium_cidr_groups: readers.cilium_cidr_groups,
            services: readers.services,
            endpoint_slices: readers.endpoint_slices,
            nodes: readers.nodes,
            cilium_nodes: readers.cilium_nodes,
            cilium_identities: readers.cilium_identities,
            cilium_endpoints: readers.cilium_endpoints,
            source: None,
            service_ranges,
            node_port_range: Default::default(),
            limits,
            state: Mutex::new(State {
                writers,
                store,
                stranded: BTreeMap::new(),
                merge_error: None,
                record_error: None,
                rejected: BTreeMap::new(),
                unknown: BTreeMap::new(),
                api_server: None,
                gaps: watch::channel(Vec::new()).0,
                reporter,
            }),
            abandoned: AtomicU64::new(0),
        }
    }

    /// The objects policy depends on that are not in force, each with what it could have
    /// restricted ([`PolicyGap`]): policies, or the labels of pods and namespaces they select by,
    /// whose records no longer load (`<file>: <why>`) or which the API server holds in a form
    /// this agent cannot enforce. An endpoint in a gap's scope could then be less restricted
    /// than its policy says, so the policy repository locks those endpoints down. It empties as
    /// applies or deletes of those objects replace or remove them.
    pub fn policy_gaps(&self) -> watch::Receiver<Vec<PolicyGap>> {
        self.lock().gaps.subscribe()
    }

    /// The API server that owns every kind, in Kubernetes mode; `None` standalone.
    pub fn api_server(&self) -> Option<String> {
        self.source.as_ref().and_then(|s| s.server())
    }

    /// This node's name as the API server knows it, in Kubernetes mode.
    pub fn node_name(&self) -> Option<String> {
        self.source
            .as_ref()
            .filter(|s| s.server().is_some())
            .map(|s| s.node_name())
    }

    /// The pod a CNI ADD names, as the tables hold it.
    ///
    /// Standalone, `None` when no pod of that name was applied (the endpoint then has only the
    /// namespace the runtime named). In Kubernetes mode the kubelet only calls the plugin for a
    /// pod the API server holds, so a pod the watch has not delivered yet is read from the API
    /// server (and fed into the table as a watch event would be), retried until `timeout`: an
    /// endpoint must not be created without the labels its policy selects by. Fails naming the
    /// pod when it does not exist, cannot be put in force, or cannot be read in time.
    pub async fn pod_for_add(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<Arc<Pod>>> {
        let key = ObjectKey::namespaced(namespace, name);
        let Some(source) = self.source.clone() else {
            return Ok(self.pods.get(&key));
        };
        let unknown = |reason: String| Error::PodUnknown {
            pod: key.clone(),
            reason,
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("not read yet");
        loop {
            if let Some(pod) = self.pods.get(&key) {
                return Ok(Some(pod));
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(unknown(format!(
                    "not known after {timeout:?}: the watch has not delivered it and the API server could not be read ({last})"
                )));
            }
            match tokio::time::timeout(left, source.clone().get_pod(namespace, name)).await {
                Ok(Ok(Some(value))) => {
                    Feed::new(self.clone()).apply(Pod::KIND, value);
                    if let Some(pod) = self.pods.get(&key) {
                        return Ok(Some(pod));
                    }
                    let reason = self
                        .lock()
                        .rejected
                        .get(&(Pod::KIND.to_string(), key.clone()))
                        .map(|r| r.reason.clone());
                    return Err(unknown(format!(
                        "the API server's object cannot be put in force: {}",
                        reason.unwrap_or_else(|| "deleted meanwhile".into())
                    )));
                }
                Ok(Ok(None)) => {
                    return Err(unknown(format!(
                        "the API server {} has no such pod",
                        source.server().unwrap_or_default()
                    )));
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = "the read timed out".into(),
            }
            tokio::time::sleep(
                POD_RETRY.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
            )
            .await;
        }
    }

    /// The ranges cluster IPs are allocated from, the default family's first.
    pub fn service_cidrs(&self) -> Vec<ipnet::IpNet> {
        self.service_ranges.cidrs()
    }

    /// The bounds on one applied text (`apply-max-bytes`, `apply-max-depth`).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Creates or updates every object in `text` (multi-document YAML from `source`).
    ///
    /// The text is checked against the limits, then every document is decoded and checked;
    /// if any fails, nothing is applied and every failure is returned. Then the change is
    /// recorded (when the tables are persistent) and only then made: a record that cannot be
    /// written fails the call ([`Error::Record`], naming the file and the errno) and changes
    /// nothing. Documents are applied in order.
    pub fn apply(&self, source: &str, text: &str) -> Result<Vec<Outcome>> {
        self.apply_cancellable(source, text, &CancellationToken::new())
    }

    /// [`apply`](Resources::apply), abandoned with [`Error::Cancelled`] (nothing changed) when
    /// `cancel` is cancelled before the change is recorded: a request whose client went away
    /// stops costing work.
    pub fn apply_cancellable(
        &self,
        source: &str,
        text: &str,
        cancel: &CancellationToken,
    ) -> Result<Vec<Outcome>> {
        let prepared = self.abandoned(self.prepare(source, text, cancel))?;
        let mut state = self.lock_restored();
        if cancel.is_cancelled() {
            return self.abandoned(Err(Error::Cancelled));
        }
        let outcomes = self.commit_apply(&mut state, source, prepared)?;
        state.merge_and_report();
        Ok(outcomes)
    }

    /// Deletes every object named in `text`. A namespace takes its pods, policies, services
    /// and endpoint slices with it, as the namespace controller does; the system namespaces
    /// cannot be deleted. Recorded and made as [`apply`](Resources::apply) is.
    pub fn delete(&self, source: &str, text: &str) -> Result<Vec<Outcome>> {
        self.delete_cancellable(source, text, &CancellationToken::new())
    }

    /// Deletes the objects `keys` names, as [`delete`](Resources::delete) of their documents
    /// would.
    pub(crate) fn delete_objects(
        &self,
        source: &str,
        keys: Vec<(&'static str, ObjectKey)>,
    ) -> Result<Vec<Outcome>> {
        let mut state = self.lock_restored();
        let outcomes = state.commit_delete(source, keys)?;
        state.merge_and_report();
        Ok(outcomes)
    }

    /// A number that grows with every change to any table: equal numbers, equal tables.
    pub fn revision(&self) -> u64 {
        [
            self.namespaces.revision(),
            self.pods.revision(),
            self.network_policies.revision(),
            self.cilium_network_policies.revision(),
            self.cilium_clusterwide_network_policies.revision(),
            self.cilium_cidr_groups.revision(),
            self.services.revision(),
            self.endpoint_slices.revision(),
            self.nodes.revision(),
            self.cilium_nodes.revision(),
            self.cilium_identities.revision(),
            self.cilium_endpoints.revision(),
        ]
        .iter()
        .map(|r| *r.borrow())
        .sum()
    }

    /// [`delete`](Resources::delete), abandoned as
    /// [`apply_cancellable`](Resources::apply_cancellable) is.
    pub fn delete_cancellable(
        &self,
        source: &str,
        text: &str,
        cancel: &CancellationToken,
    ) -> Result<Vec<Outcome>> {
        let keys = self.abandoned(self.delete_keys(source, text, cancel))?;
        let mut state = self.lock_restored();
        if cancel.is_cancelled() {
            return self.abandoned(Err(Error::Cancelled));
        }
        let outcomes = state.commit_delete(source, keys)?;
        state.merge_and_report();
        Ok(outcomes)
    }

    /// How many applies and deletes were abandoned because their requester went away
    /// ([`Error::Cancelled`]).
    pub fn abandoned_requests(&self) -> u64 {
        self.abandoned.load(Ordering::Relaxed)
    }

    fn abandoned<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Cancelled) = &result {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "an apply or delete was abandoned before it changed anything: its client went away"
            );
        }
        result
    }

    /// Applies every recorded object again. A record that does not load (its kind unsupported
    /// by this version, a namespace whose record is unreadable, ...) is kept on disk, not in
    /// force, and makes the module Degraded naming the file and the reason; the rest loads.
    /// Returns how many objects were restored and how many records are not in force.
    pub(crate) fn restore(&self) -> (usize, usize) {
        let mut state = self.lock();
        let restored = self.restore_locked(&mut state);
        state.merge_and_report();
        (restored, state.stranded.len())
    }

    /// The apply lock, with the record read first if it was not yet (an apply before the
    /// restore reads it as the restore would).
    fn lock_restored(&self) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        if matches!(state.store, Store::Unread(_)) {
            self.restore_locked(&mut state);
        }
        state
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn restore_locked(&self, state: &mut State) -> usize {
        let Store::Unread(dir) = &state.store else {
            return 0;
        };
        let (record, loaded) = Record::open(dir.clone());
        state.store = Store::Record(record);
        for (path, reason) in loaded.problems {
            tracing::error!(file = %path, %reason, "a record cannot be read; it is kept, not in force");
            state.stranded.insert(path, reason);
        }
        let mut restored = 0;
        for (file, text) in loaded.objects {
            match self.load_record(state, &file, &text) {
                Ok(()) => restored += 1,
                Err(reason) => {
                    let path = Record::path_of(&file);
                    tracing::error!(file = %path, %reason, "a recorded object does not load; it is kept, not in force");
                    state.stranded.insert(path, reason);
                }
            }
        }
        state.writers.publish();
        state.writers.mark_all_synced();
        tracing::info!(
            restored,
            stranded = state.stranded.len(),
            "recorded objects restored"
        );
        restored
    }
}

impl State {
    /// Merges committed changes into the object files and reports the module's health.
    pub(crate) fn merge_and_report(&mut self) {
        if let Store::Record(record) = &mut self.store
            && record.has_pending()
        {
            self.merge_error = match record.merge() {
                Ok(()) => None,
                Err(e) => {
                    let reason = format!(
                        "{} not merged into the records (the change is in force and recorded there; retried at the next change): {}",
                        e.journal,
                        error_chain(&e.source)
                    );
                    tracing::error!("{reason}");
                    Some(reason)
                }
            };
        }
        self.report();
    }

    /// Reports the module's health: OK, or Degraded with every record not in force, a merge
    /// that failed and a change that could not be recorded.
    pub(crate) fn report(&self) {
        let rejected = self.rejected.iter().map(|((kind, key), r)| {
            (
                kind,
                format!("{kind} {key} (from the API server): {}", r.reason),
                &r.scope,
            )
        });
        let gaps: Vec<PolicyGap> = self
            .stranded
            .iter()
            .filter_map(|(path, reason)| {
                Some(PolicyGap {
                    text: format!("{path}: {reason}"),
                    scope: stranded_scope(path)?,
                })
            })
            .chain(
                rejected
                    .clone()
                    .filter(|(kind, _, _)| POLICY_KINDS.contains(&kind.as_str()))
                    .map(|(_, text, scope)| PolicyGap {
                        text,
                        scope: scope.clone(),
                    }),
            )
            .collect();
        self.gaps.send_if_modified(|old| {
            let changed = *old != gaps;
            *old = gaps;
            changed
        });
        let Some(reporter) = &self.reporter else {
            return;
        };
        let mut problems: Vec<String> = self
            .stranded
            .iter()
            .map(|(path, reason)| format!("{path}: {reason}"))
            .collect();
        if !problems.is_empty() {
            problems[0] = format!(
                "{} records kept on disk but not in force: {}",
                self.stranded.len(),
                problems[0]
            );
        }
        problems.extend(self.merge_error.clone());
        problems.extend(self.record_error.clone());
        // An object the API server holds but the agent cannot put in force is that object's
        // problem, not the node's: it is named here, and a policy's lockdown covers only what
        // it selects. Degraded would make CNI STATUS fail and stop every new pod of the node,
        // which would let one tenant's object take the node from all others.
        let not_in_force: Vec<String> = rejected
            .map(|(_, text, _)| format!("not in force: {text}"))
            .collect();
        let not_in_force = match not_in_force.is_empty() {
            true => String::new(),
            false => format!("; {}", not_in_force.join("; ")),
        };
        let unknown: String = self
            .unknown
            .iter()
            .map(|((kind, key), fields)| {
                format!(
                    "; in force without the fields this version does not know: {kind} {key} ({})",
                    fields.join(", ")
                )
            })
            .collect();
        let not_in_force = format!("{not_in_force}{unknown}");
        let objects = self.writers.count();
        if problems.is_empty() {
            match &self.api_server {
                Some(server) => reporter.ok(format!(
                    "{objects} objects in force, from the API server {server}{not_in_force}"
                )),
                None => reporter.ok(format!("{objects} objects in force, all recorded")),
            }
        } else {
            reporter.degraded(format!(
                "{objects} objects in force; {}{not_in_force}",
                problems.join("; ")
            ));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::apply::record::error_chain;

    pub(crate) const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop, labels: { team: a } }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 80 } ] } ] }
"#;

    pub(crate) fn default_range() -> ServiceRanges {
        ServiceRanges::new(&ResourcesConfig::default().service_cidr).unwrap()
    }

    /// Tables recorded in `state`, not restored yet.
    pub(crate) fn persisted(state: &Arc<StateDir>, range: ServiceRanges) -> Resources {
        Resources::build(Store::Unread(state.clone()), range, Limits::default(), None)
    }

    pub(crate) fn actions(outcomes: &[Outcome]) -> Vec<String> {
        outcomes
            .iter()
            .map(|o| format!("{} {} {}", o.kind, o.key, o.action))
            .collect()
    }

    #[test]
    fn apply_creates_then_reports_unchanged_and_configured() {
        let r = Resources::new();
        let out = r.apply("app.yaml", APP).unwrap();
        assert_eq!(
            actions(&out),
            vec!["Namespace shop created", "Pod shop/web created"]
        );
        let out = r.apply("app.yaml", APP).unwrap();
        assert_eq!(
            actions(&out),
            vec!["Namespace shop unchanged", "Pod shop/web unchanged"]
        );
        let out = r
            .apply("app.yaml", &APP.replace("team: a", "team: b"))
            .unwrap();
        assert_eq!(out[0].action, Action::Configured);
        let ns = r.namespaces.get(&ObjectKey::cluster("shop")).unwrap();
        assert_eq!(ns.labels["kubernetes.io/metadata.name"], "shop");
    }

    #[test]
    fn one_bad_document_applies_nothing_and_every_error_is_listed() {
        let r = Resources::new();
        let text = format!(
            "{APP}---\napiVersion: v1\nkind: Pod\nmetadata: {{ name: x, namespace: nowhere }}\nspec: {{ containers: [ {{ name: c }} ] }}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: s }}\n"
        );
        let err = r.apply("app.yaml", &text).unwrap_err().to_string();
        assert!(
            err.starts_with("2 invalid document(s), nothing applied"),
            "{err}"
        );
        assert!(err.contains("app.yaml: document 3 (Pod nowhere/x): metadata.namespace: namespace \"nowhere\" not found"), "{err}");
        assert!(
            err.contains("document 4 (Secret s): kind: unsupported kind v1/Secret"),
            "{err}"
        );
        assert!(r.pods.is_empty());
        assert!(r.namespaces.get(&ObjectKey::cluster("shop")).is_none());
    }

    #[test]
    fn deleting_a_namespace_takes_its_pods() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        let out = r
            .delete(
                "ns.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
            )
            .unwrap();
        assert_eq!(actions(&out), vec!["Namespace shop deleted"]);
        assert!(r.pods.is_empty());
        let out = r.delete("app.yaml", APP).unwrap();
        assert_eq!(
            actions(&out),
            vec!["Namespace shop not found", "Pod shop/web not found"]
        );
        let err = r
            .delete(
                "d.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: default}\n",
            )
            .unwrap_err();
        assert!(err.to_string().contains("may not be deleted"), "{err}");
    }

    const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  egress: [ { toEntities: [ world ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: no-telnet }
spec:
  endpointSelector: {}
  ingressDeny: [ { toPorts: [ { ports: [ { port: "23" } ] } ] } ]
"#;

    #[test]
    fn policies_apply_into_their_tables_and_delete() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        let out = r.apply("pol.yaml", POLICIES).unwrap();
        assert_eq!(
            actions(&out),
            vec![
                "NetworkPolicy shop/db created",
                "CiliumNetworkPolicy shop/web created",
                "CiliumClusterwideNetworkPolicy no-telnet created"
            ]
        );
        let np = r
            .network_policies
            .get(&ObjectKey::namespaced("shop", "db"))
            .unwrap();
        assert_eq!(np.policy_types, vec![crate::PolicyType::Ingress]);
        assert_eq!(r.cilium_clusterwide_network_policies.len(), 1);
        let out = r.delete("pol.yaml", POLICIES).unwrap();
        assert!(out.iter().all(|o| o.action == Action::Deleted), "{out:?}");
        assert!(r.network_policies.is_empty() && r.cilium_network_policies.is_empty());
        assert!(r.cilium_clusterwide_network_policies.is_empty());
    }

    #[test]
    fn a_policy_needs_its_namespace_and_goes_with_it() {
        let r = Resources::new();
        let err = r.apply("pol.yaml", POLICIES).unwrap_err().to_string();
        assert!(
            err.contains("pol.yaml: document 1 (NetworkPolicy shop/db): metadata.namespace: namespace \"shop\" not found"),
            "{err}"
        );
        assert!(
            r.cilium_clusterwide_network_policies.is_empty(),
            "all or nothing"
        );
        r.apply("app.yaml", APP).unwrap();
        r.apply("pol.yaml", POLICIES).unwrap();
        r.delete(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
        )
        .unwrap();
        assert!(r.network_policies.is_empty() && r.cilium_network_policies.is_empty());
        assert_eq!(r.cilium_clusterwide_network_policies.len(), 1);
    }

    #[test]
    fn policy_errors_name_document_field_and_reason() {
        let r = Resources::new();
        let text = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: l7}\nspec:\n  endpointSelector: {}\n  egress: [{toFQDNs: [{matchName: example.com}]}]\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]}\n";
        let err = r.apply("bad.yaml", text).unwrap_err().to_string();
        assert!(
            err.contains("bad.yaml: document 1 (CiliumNetworkPolicy l7): spec.egress[0].toFQDNs: not supported: DNS-based policy"),
            "{err}"
        );
        assert!(
            err.contains("bad.yaml: document 2 (NetworkPolicy np): spec.ingress[0].from[0].ipBlock.except[0]: 10.0.0.0/8 must be a strict subset"),
            "{err}"
        );
    }

    #[test]
    fn recorded_objects_come_back_after_a_restart_and_deleted_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let state = || Arc::new(StateDir::open_at(dir.path()).unwrap());
        let first_state = state();
        let first = persisted(&first_state, default_range());
        first.apply("app.yaml", APP).unwrap();
        let np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: deny, namespace: shop }\nspec: { podSelector: {} }\n";
        first.apply("np.yaml", np).unwrap();
        drop((first, first_state));

        let second_state = state();
        let second = persisted(&second_state, default_range());
        assert_eq!(second.restore(), (3, 0));
        assert!(
            second
                .pods
                .get(&ObjectKey::namespaced("shop", "web"))
                .is_some()
        );
        assert!(
            second
                .network_policies
                .get(&ObjectKey::namespaced("shop", "deny"))
                .is_some()
        );
        second
            .delete(
                "ns.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
            )
            .unwrap();
        drop((second, second_state));

        let third_state = state();
        let third = persisted(&third_state, default_range());
        assert_eq!(third.restore(), (0, 0));
        assert!(third.pods.is_empty() && third.network_policies.is_empty());
    }

    #[test]
    fn a_deeply_nested_or_huge_text_is_refused_before_it_is_decoded() {
        let r = Resources::new();
        // 200 KB of brackets: the decoder alone would take half a minute over it.
        let deep = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {}{}}}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let err = r.apply("deep.yaml", &deep).unwrap_err().to_string();
        assert!(
            err.contains("deep.yaml: document 1: nested more than 64 levels deep at line 3 column 80 (apply-max-depth)"),
            "{err}"
        );
        let huge = format!("# {}\n", "x".repeat(4 << 20));
        let err = r.apply("huge.yaml", &huge).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "huge.yaml: {} bytes is more than apply-max-bytes (3145728)",
                huge.len()
            )
        );
        let err = r.delete("huge.yaml", &huge).unwrap_err().to_string();
        assert!(err.contains("apply-max-bytes"), "{err}");
        assert_eq!(r.abandoned_requests(), 0);
    }

    #[test]
    fn a_cancelled_apply_changes_nothing() {
        let r = Resources::new();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let err = r.apply_cancellable("app.yaml", APP, &cancel).unwrap_err();
        assert!(matches!(err, Error::Cancelled), "{err}");
        assert!(r.pods.is_empty());
        assert_eq!(r.abandoned_requests(), 1);
    }

    #[test]
    fn a_change_that_cannot_be_recorded_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open_at(dir.path()).unwrap());
        let r = persisted(&state, default_range());
        r.apply("app.yaml", APP).unwrap();
        // The journal's directory cannot be made: a file stands in its way.
        std::fs::remove_dir(dir.path().join("resources/journal")).unwrap();
        std::fs::write(dir.path().join("resources/journal"), b"").unwrap();
        let np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: shop}\nspec: {podSelector: {}}\n";
        let err = r.apply("np.yaml", np).unwrap_err();
        assert!(matches!(err, Error::Record { .. }), "{err}");
        let chain = error_chain(&err);
        assert!(
            chain.starts_with(
                "np.yaml: cannot record the change in the state directory; nothing changed: create "
            ),
            "{chain}"
        );
        assert!(chain.contains("resources/journal"), "{chain}");
        assert!(chain.contains("(os error 17)"), "{chain}");
        assert!(r.network_policies.is_empty());
        let err = r.delete("app.yaml", APP).unwrap_err();
        assert!(matches!(err, Error::Record { .. }), "{err}");
        assert_eq!((r.namespaces.len(), r.pods.len()), (4, 1));
        drop((r, state));

        std::fs::remove_file(dir.path().join("resources/journal")).unwrap();
        let state = Arc::new(StateDir::open_at(dir.path()).unwrap());
        let again = persisted(&state, default_range());
        assert_eq!(again.restore(), (2, 0));
        assert!(again.network_policies.is_empty());
        assert_eq!(again.pods.len(), 1);
    }

    #[test]
    fn a_record_that_does_not_load_is_kept_and_the_rest_loads() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open_at(dir.path()).unwrap());
        let first = persisted(&state, default_range());
        first.apply("app.yaml", APP).unwrap();
        drop(first);
        let records = dir.path().join("resources");
        // A pod whose namespace's record is gone, and a record of another kind under a pod's
        // name.
        std::fs::write(
            records.join("Pod~gone~p.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: gone}\nspec: {containers: [{name: c}]}\n",
        )
        .unwrap();
        std::fs::write(
            records.join("Pod~shop~x.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n",
        )
        .unwrap();
        let second = persisted(&state, default_range());
        assert_eq!(second.restore(), (2, 2));
        assert_eq!(second.pods.len(), 1, "the rest loads");
        assert!(second.namespaces.get(&ObjectKey::cluster("x")).is_none());
        {
            let s = second.lock();
            let stranded: Vec<String> = s
                .stranded
                .iter()
                .map(|(f, r)| format!("{f}: {r}"))
                .collect();
            assert!(
                stranded[0].starts_with("resources/Pod~gone~p.yaml: 1 invalid document(s)"),
                "{stranded:?}"
            );
            assert!(
                stranded[0].contains("namespace \"gone\" not found"),
                "{stranded:?}"
            );
            assert_eq!(
                stranded[1],
                "resources/Pod~shop~x.yaml: holds Namespace x, not the Pod shop/x its name says"
            );
        }
        assert!(records.join("Pod~gone~p.yaml").exists(), "kept on disk");
        // Pods' labels are what policy selects by: both are gaps in it.
        let gaps = second.policy_gaps();
        assert_eq!(gaps.borrow().len(), 2, "{:?}", *gaps.borrow());
        // Deleting the objects removes their records; applying a good one replaces it.
        let out = second
            .delete(
                "p.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: gone}\n",
            )
            .unwrap();
        assert_eq!(actions(&out), vec!["Pod gone/p deleted"]);
        assert!(!records.join("Pod~gone~p.yaml").exists());
        second
            .apply("x.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: shop}\nspec: {containers: [{name: c}]}\n")
            .unwrap();
        assert!(second.lock().stranded.is_empty());
        assert!(gaps.borrow().is_empty(), "{:?}", *gaps.borrow());
    }

    #[test]
    fn only_records_policy_depends_on_are_gaps_in_it_each_scoped_by_its_name() {
        let shop = Some(GapScope::Namespace("shop".into()));
        for (path, scope) in [
            ("resources/NetworkPolicy~shop~db.yaml", shop.clone()),
            ("resources/CiliumNetworkPolicy~shop~db.yaml", shop),
            (
                "resources/CiliumClusterwideNetworkPolicy~~all.yaml",
                Some(GapScope::Everything),
            ),
            // Labels any policy anywhere may select or deny by.
            ("resources/Namespace~~shop.yaml", Some(GapScope::Everything)),
            ("resources/Pod~shop~web.yaml", Some(GapScope::Everything)),
            ("resources/Service~shop~web.yaml", None),
            ("resources/EndpointSlice~shop~web-1.yaml", None),
            // Whatever cannot be told apart may hold any policy.
            ("resources/", Some(GapScope::Everything)),
            ("resources/journal", Some(GapScope::Everything)),
            ("resources/strange name", Some(GapScope::Everything)),
        ] {
            assert_eq!(stranded_scope(path), scope, "{path}");
        }
    }

    #[test]
    fn a_namespace_goes_with_everything_recorded_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open_at(dir.path()).unwrap());
        let first = persisted(&state, default_range());
        first.apply("app.yaml", APP).unwrap();
        first
            .apply(
                "pol.yaml",
                &POLICIES
                    .replace(
                        "---\napiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy",
                        "---\napiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy",
                    )
                    .replace("name: no-telnet }", "name: no-telnet, namespace: shop }"),
            )
            .unwrap();
        drop(first);
        // A record of the namespace that does not load goes too.
        std::fs::write(
            dir.path().join("resources/Pod~shop~bad.yaml"),
            "not: a pod\n",
        )
        .unwrap();
        let second = persisted(&state, default_range());
        assert_eq!(second.restore(), (5, 1));
        second
            .delete(
                "ns.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
            )
            .unwrap();
        let left: Vec<_> = state.list("resources").unwrap();
        assert!(left.is_empty(), "{left:?}");
        assert!(second.lock().stranded.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_files_changes_are_announced_once_they_are_all_in() {
        let r = Resources::new();
        let mut services = r.services.revision();
        let watcher = r.clone();
        // Woken by the service, the consumer finds its slices already there.
        let seen = tokio::spawn(async move {
            services.changed().await.unwrap();
            watcher.endpoint_slices.len()
        });
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n---\n".to_string()
            + &(0..20)
                .map(|i| format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s-{i}, labels: {{kubernetes.io/service-name: s}}}}\naddressType: IPv4\nendpoints: [{{addresses: [10.244.0.{i}]}}]\n"))
                .collect::<Vec<_>>()
                .join("---\n");
        let applier = r.clone();
        tokio::task::spawn_blocking(move || applier.apply("s.yaml", &text).unwrap())
            .await
            .unwrap();
        assert_eq!(seen.await.unwrap(), 20);
    }

    #[test]
    fn empty_text_is_an_error() {
        let err = Resources::new().apply("e.yaml", "# nothing\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "e.yaml: no object found (empty text or only comments)"
        );
    }
}

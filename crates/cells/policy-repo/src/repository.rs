//! The policy repository: every policy's rules, the selector cache, CIDR identities, and
//! per-endpoint resolution with its revision.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_hive::Reporter;
use cellium_identity::{Identities, Identity};
use cellium_ipcache::Ipcache;
use cellium_labels::{Label, Labels, POD_NAMESPACE_LABEL, source};
use cellium_policy::{Direction, Verdict};
use cellium_resources::{
    CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy, CiliumPolicy, NetworkPolicy, Object,
    ObjectKey, PolicyGap, Resources,
};
use ipnet::IpNet;
use tokio::sync::watch;

use crate::cidr::{self, CidrIdentities};
use crate::lockdown::Lockdown;
use crate::resolve::{self, EndpointPolicy, PeerPorts, Subject};
use crate::rule::{Origin, Peer, PolicyKind, RuleSet};
use crate::selected_keys::{self, LabelKeyInfo, SelectedKeys};
use crate::selector_cache::SelectorCache;
use crate::translate;
use crate::translate::deps::{self, Deps};

type SourceKey = (PolicyKind, ObjectKey);

/// What a resolved policy depends on besides the revision: the identity (and so its labels)
/// and the endpoint's named ports.
type ResolveKey = (u32, Vec<(String, u16, cellium_resources::Protocol)>);

/// A rule (or a default deny) as `cellium policy get` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    /// The object it came from.
    pub origin: Origin,
    /// The subject selector.
    pub subject: String,
    /// The direction.
    pub direction: Direction,
    /// Allow or deny; `None` for a default deny (which allows nothing by itself).
    pub verdict: Option<Verdict>,
    /// Each peer selector (`<any>` for every peer) with the identities it matches now.
    pub peers: Vec<(String, Vec<u32>)>,
    /// The ports (`80/tcp`, `http/tcp`, `*` for everything).
    pub ports: Vec<String>,
    /// The labels that name the rule (`source:key=value`).
    pub labels: Vec<String>,
}

/// A cached selector as `cellium policy selectors` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorInfo {
    /// The selector's canonical text.
    pub selector: String,
    /// The identities it matches.
    pub identities: Vec<u32>,
    /// How many rules use it.
    pub users: usize,
}

#[derive(Debug, Default)]
struct State {
    sets: BTreeMap<SourceKey, Arc<RuleSet>>,
    /// The same sets by the one namespace their subjects require ([`RuleSet::namespace`];
    /// `None`: any), so that resolving an endpoint visits only the sets that may select it.
    by_scope: HashMap<Option<String>, BTreeMap<SourceKey, Arc<RuleSet>>>,
    problems: BTreeMap<SourceKey, String>,
    cidr_problems: Vec<String>,
    cache: SelectorCache,
    cidrs: CidrIdentities,
    pod_prefixes: BTreeSet<IpNet>,
    /// The named ports of the pods behind each identity, as the ipcache last had them.
    peer_ports: PeerPorts,
    /// Objects policy depends on that are not in force (`Resources::policy_gaps`): the
    /// endpoints they could have restricted enforce both directions.
    lockdown: Lockdown,
    revision: u64,
    resolved: HashMap<ResolveKey, Arc<EndpointPolicy>>,
    /// The tables Cilium rules name CIDR groups and services from; `None` until the first
    /// [`PolicyRepository::sync_resources`] (groups and services then select nothing).
    deps: Option<Deps>,
    /// The Cilium policies whose translation reads `deps`, translated again when those
    /// tables change ([`PolicyRepository::follow_dependencies`]).
    dependents: BTreeMap<SourceKey, CiliumPolicy>,
    /// The pod label keys the rules' selectors read (shared: every endpoint's labels are
    /// derived with it).
    selected_keys: Arc<SelectedKeys>,
}

/// The node's policy repository (see the crate docs).
///
/// Every change of rules, of the identities a rule's selector matches, or (when an egress
/// rule names a port) of the named ports of the pods behind identities increases the
/// revision; [`changes`](PolicyRepository::changes) wakes the endpoint manager, which
/// resolves each endpoint again ([`resolve`](PolicyRepository::resolve) answers from a cache
/// keyed by identity and named ports until the next revision).
#[derive(Debug)]
pub struct PolicyRepository {
    state: Mutex<State>,
    identities: Arc<Identities>,
    ipcache: Option<Arc<Ipcache>>,
    reporter: Option<Reporter>,
    revision: watch::Sender<u64>,
    cidr_changes: watch::Sender<u64>,
    audit_all: bool,
}

impl PolicyRepository {
    /// A repository that writes CIDR identities into `identities` and their prefixes into
    /// `ipcache` (when given), and reports its problems to `reporter` (when given). Nothing
    /// runs by itself: the cell's jobs (or a test) feed it.
    pub fn with_parts(
        identities: Arc<Identities>,
        ipcache: Option<Arc<Ipcache>>,
        reporter: Option<Reporter>,
    ) -> PolicyRepository {
        PolicyRepository {
            state: Mutex::new(State::default()),
            identities,
            ipcache,
            reporter,
            revision: watch::channel(0).0,
            cidr_changes: watch::channel(0).0,
            audit_all: false,
        }
    }

    /// The repository with every policy in audit mode or none (`policy-audit-mode`): set
    /// before any endpoint is resolved.
    pub fn with_audit_mode(mut self, on: bool) -> PolicyRepository {
        self.audit_all = on;
        self
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        *self.revision.borrow()
    }

    /// A receiver of the revision, changed with every change of rules or of any selector's
    /// identities.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// The `cidr:` labels an endpoint with address `ip` carries in its identity: one for each
    /// NetworkPolicy `ipBlock` prefix (block or exception) containing `ip`, so that an ipBlock
    /// selects the pods inside it as the upstream e2e suite expects.
    pub fn cidr_labels_for(&self, ip: IpAddr) -> Vec<Label> {
        cidr::labels_containing(ip, &self.lock().pod_prefixes)
    }

    /// The pod label keys the rules' selectors read, with the namespaces they matter in and
    /// the policies that read them: the endpoint manager keeps such labels in its endpoints'
    /// identities although the label filter drops them. Changes only with the rules, and
    /// before the revision of that change is published, so an endpoint regenerated at that
    /// revision is labelled for it.
    pub fn selected_keys(&self) -> Arc<SelectedKeys> {
        self.lock().selected_keys.clone()
    }

    /// The keys of the `k8s:` labels of every identity and of those the selectors read, each
    /// with why identities keep it (`cellium identity list --keys`).
    pub fn label_keys(&self) -> Vec<LabelKeyInfo> {
        let identities = self.identities.list();
        let selected = self.selected_keys();
        selected_keys::label_keys(identities.iter().map(|i| &i.identity.labels), &selected)
    }

    /// A receiver whose value changes when the set of prefixes behind
    /// [`cidr_labels_for`](PolicyRepository::cidr_labels_for) changes: the endpoint manager
    /// then derives its endpoints' identities again.
    pub fn cidr_label_changes(&self) -> watch::Receiver<u64> {
        self.cidr_changes.subscribe()
    }

    /// The policy of one endpoint at the current revision.
    pub fn resolve(&self, subject: &Subject<'_>) -> Arc<EndpointPolicy> {
        let mut st = self.lock();
        let mut ports: Vec<_> = subject
            .named_ports
            .iter()
            .map(|p| (p.name.clone(), p.port, p.protocol))
            .collect();
        ports.sort();
        let key = (subject.identity, ports);
        if let Some(p) = st.resolved.get(&key) {
            return p.clone();
        }
        let namespace = subject
            .labels
            .get(source::K8S, POD_NAMESPACE_LABEL)
            .map(|l| l.value.clone());
        let scopes = [None, namespace];
        let sets = scopes
            .iter()
            .filter_map(|scope| st.by_scope.get(scope))
            .flat_map(|sets| sets.values().map(|s| s.as_ref()));
        let policy = Arc::new(resolve::resolve(
            subject,
            sets,
            &st.cache,
            &st.peer_ports,
            st.revision,
            st.lockdown.covers(subject.labels),
            self.audit_all,
        ));
        st.resolved.insert(key, policy.clone());
        policy
    }

    /// Adds or replaces a NetworkPolicy.
    pub fn upsert_network_policy(&self, np: &NetworkPolicy) {
        let key = (PolicyKind::NetworkPolicy, np.key());
        self.set_source(key, translate::network_policy::translate(np));
    }

    /// Adds or replaces a CiliumNetworkPolicy.
    pub fn upsert_cilium_network_policy(&self, p: &CiliumNetworkPolicy) {
        self.set_cilium((PolicyKind::CiliumNetworkPolicy, p.key()), p);
    }

    /// Adds or replaces a CiliumClusterwideNetworkPolicy.
    pub fn upsert_cilium_clusterwide_network_policy(&self, p: &CiliumClusterwideNetworkPolicy) {
        self.set_cilium((PolicyKind::CiliumClusterwideNetworkPolicy, p.key()), p);
    }

    /// Translates a Cilium policy against the current CIDR groups and services, remembering
    /// it when it names any, so that it follows them.
    fn set_cilium(&self, key: SourceKey, p: &CiliumPolicy) {
        let mut st = self.lock();
        let translated = translate::cilium::translate(key.0, p, st.deps.as_ref());
        if deps::depends(p) {
            st.dependents.insert(key.clone(), p.clone());
        } else {
            st.dependents.remove(&key);
        }
        if self.take_source(&mut st, key, translated) {
            self.changed(&mut st);
        }
        self.report(&st);
    }

    /// Translates again the Cilium policies that name CIDR groups or services (level-triggered:
    /// the `feed` job calls it at every change of the CIDR groups, services and EndpointSlices).
    pub fn follow_dependencies(&self) {
        let mut st = self.lock();
        if st.dependents.is_empty() {
            return;
        }
        let translated: Vec<(SourceKey, Result<RuleSet, String>)> = st
            .dependents
            .iter()
            .map(|(key, p)| {
                let t = translate::cilium::translate(key.0, p, st.deps.as_ref());
                (key.clone(), t)
            })
            .collect();
        let mut changed = false;
        for (key, t) in translated {
            changed |= self.take_source(&mut st, key, t);
        }
        if changed {
            self.changed(&mut st);
        }
        self.report(&st);
    }

    /// Removes the rules of one object.
    pub fn remove(&self, kind: PolicyKind, key: &ObjectKey) {
        let mut st = self.lock();
        st.problems.remove(&(kind, key.clone()));
        st.dependents.remove(&(kind, key.clone()));
        if self.replace(&mut st, (kind, key.clone()), None) {
            self.changed(&mut st);
        }
        self.report(&st);
    }

    /// Makes the rules exactly those of the policy tables of `resources` (level-triggered: for
    /// the start and after missed events). One batch: the CIDR identities are reconciled, the
    /// revision increased and the health line composed once, not once per policy (which is
    /// quadratic in the number of policies at the start).
    pub fn sync_resources(&self, resources: &Resources) {
        let mut sources: Vec<(SourceKey, Result<RuleSet, String>)> =
            translate::all(&resources.network_policies.list(), |p| {
                let translated = translate::network_policy::translate(p);
                ((PolicyKind::NetworkPolicy, p.key()), translated)
            });
        let deps = Deps::of(resources);
        let kind = PolicyKind::CiliumNetworkPolicy;
        let cnps = resources.cilium_network_policies.list();
        sources.extend(translate::all(&cnps, |p| {
            (
                (kind, p.key()),
                translate::cilium::translate(kind, p, Some(&deps)),
            )
        }));
        let kind = PolicyKind::CiliumClusterwideNetworkPolicy;
        let ccnps = resources.cilium_clusterwide_network_policies.list();
        sources.extend(translate::all(&ccnps, |p| {
            (
                (kind, p.key()),
                translate::cilium::translate(kind, p, Some(&deps)),
            )
        }));
        let dependents: BTreeMap<SourceKey, CiliumPolicy> = cnps
            .iter()
            .map(|p| ((PolicyKind::CiliumNetworkPolicy, p.key()), &p.0))
            .chain(
                ccnps
                    .iter()
                    .map(|p| ((PolicyKind::CiliumClusterwideNetworkPolicy, p.key()), &p.0)),
            )
            .filter(|(_, p)| deps::depends(p))
            .map(|(k, p)| (k, p.clone()))
            .collect();
        let present: BTreeSet<SourceKey> = sources.iter().map(|(k, _)| k.clone()).collect();
        let mut st = self.lock();
        st.deps = Some(deps);
        st.dependents = dependents;
        let mut changed = false;
        for (key, translated) in sources {
            changed |= self.take_source(&mut st, key, translated);
        }
        let stale: Vec<SourceKey> = st
            .sets
            .keys()
            .chain(st.problems.keys())
            .filter(|k| !present.contains(k))
            .cloned()
            .collect();
        for key in stale {
            st.problems.remove(&key);
            changed |= self.replace(&mut st, key, None);
        }
        if changed {
            self.changed(&mut st);
        }
        self.report(&st);
    }

    /// Makes the known identities exactly those of `identities` (level-triggered).
    pub fn sync_identities(&self, identities: &[Arc<Identity>]) {
        let ids: BTreeSet<u32> = identities.iter().map(|i| i.id).collect();
        for identity in identities {
            self.identity_added(identity);
        }
        let stale: Vec<(u32, Labels)> = self
            .lock()
            .cache
            .known()
            .iter()
            .filter(|(id, _)| !ids.contains(id))
            .map(|(id, l)| (*id, l.clone()))
            .collect();
        for (id, labels) in stale {
            self.identity_removed(&Identity { id, labels });
        }
    }

    /// An identity now exists (or has new labels).
    pub fn identity_added(&self, identity: &Identity) {
        let mut st = self.lock();
        if st.cache.identity_added(identity.id, &identity.labels) {
            Self::bump(&mut st, &self.revision);
        }
    }

    /// An identity is gone.
    pub fn identity_removed(&self, identity: &Identity) {
        let mut st = self.lock();
        if st.cache.identity_removed(identity.id, &identity.labels) {
            Self::bump(&mut st, &self.revision);
        }
    }

    /// Takes the named ports of the pods behind each identity from the ipcache (where their
    /// endpoints' owners put them, see `Ipcache::set_named_ports`); the revision increases
    /// when they changed and an egress rule names a port (level-triggered: the `feed` job
    /// calls it at every change the ipcache announces).
    pub fn sync_named_ports(&self) {
        let Some(ipcache) = &self.ipcache else { return };
        // Read before taking the repository's lock: the repository writes to the ipcache
        // under its own lock, never the other way round.
        let ports = ipcache.named_ports();
        let mut st = self.lock();
        if st.peer_ports == ports {
            return;
        }
        st.peer_ports = ports;
        if st.sets.values().any(|s| s.uses_peer_named_ports()) {
            Self::bump(&mut st, &self.revision);
        }
    }

    /// Takes in the objects policy depends on that are not in force
    /// (`Resources::policy_gaps`). The repository cannot tell how their policies would
    /// restrict the endpoints in their scopes: it fails closed for those, which enforce both
    /// directions, allowing only what the policies in force allow them (and, for ingress, the
    /// node); every other endpoint keeps its policy. The revision increases when the gaps
    /// change.
    pub fn set_policy_gaps(&self, gaps: Vec<PolicyGap>) {
        let mut st = self.lock();
        if st.lockdown.gaps() == gaps.as_slice() {
            return;
        }
        if gaps.is_empty() {
            tracing::info!("every policy is in force again: lockdown lifted");
        } else {
            tracing::error!(gaps = ?gaps, "objects policy depends on are not in force: the endpoints they could select are locked down");
        }
        st.lockdown = Lockdown::new(gaps);
        Self::bump(&mut st, &self.revision);
        self.report(&st);
    }

    /// Every rule and default deny, with its origin.
    pub fn rules(&self) -> Vec<RuleInfo> {
        let st = self.lock();
        let mut out = Vec::new();
        for set in st.sets.values() {
            for e in &set.enforce {
                out.push(RuleInfo {
                    origin: (*e.origin).clone(),
                    subject: e.subject.to_string(),
                    direction: e.direction,
                    verdict: None,
                    peers: Vec::new(),
                    ports: Vec::new(),
                    labels: e.labels.clone(),
                });
            }
            for r in &set.rules {
                let peers = r
                    .peers
                    .iter()
                    .map(|p| match p {
                        Peer::All => (p.to_string(), vec![0]),
                        Peer::Selector(s) => (
                            s.to_string(),
                            st.cache
                                .identities(s)
                                .into_iter()
                                .flatten()
                                .copied()
                                .collect(),
                        ),
                    })
                    .collect();
                let ports = if r.ports.is_empty() {
                    vec!["*".to_string()]
                } else {
                    r.ports.iter().map(ToString::to_string).collect()
                };
                out.push(RuleInfo {
                    origin: (*r.origin).clone(),
                    subject: r.subject.to_string(),
                    direction: r.direction,
                    verdict: Some(r.verdict),
                    peers,
                    ports,
                    labels: r.labels.clone(),
                });
            }
        }
        out
    }

    /// Every cached selector.
    pub fn selectors(&self) -> Vec<SelectorInfo> {
        self.lock()
            .cache
            .entries()
            .into_iter()
            .map(|(text, e)| SelectorInfo {
                selector: text,
                identities: e.identities.into_iter().collect(),
                users: e.users,
            })
            .collect()
    }

    /// The identities held for rule prefixes.
    pub fn cidr_identities(&self) -> Vec<(IpNet, u32)> {
        self.lock().cidrs.list()
    }

    /// What is wrong now: policies that could not be translated, CIDR identities that could
    /// not be set up.
    pub fn problems(&self) -> Vec<String> {
        let st = self.lock();
        problems(&st)
    }

    fn set_source(&self, key: SourceKey, translated: Result<RuleSet, String>) {
        let mut st = self.lock();
        if self.take_source(&mut st, key, translated) {
            self.changed(&mut st);
        }
        self.report(&st);
    }

    /// Takes in the translation of one object; whether its rules changed. The caller then
    /// finishes the change ([`changed`](Self::changed)) and reports, once for a batch.
    fn take_source(
        &self,
        st: &mut State,
        key: SourceKey,
        translated: Result<RuleSet, String>,
    ) -> bool {
        match translated {
            Ok(set) => {
                st.problems.remove(&key);
                self.replace(st, key, Some(set))
            }
            Err(reason) => {
                let origin = Origin {
                    kind: key.0,
                    namespace: key.1.namespace.clone(),
                    name: key.1.name.clone(),
                    audit: false,
                    log: None,
                };
                tracing::warn!(%origin, %reason, "policy not enforced");
                st.problems
                    .insert(key.clone(), format!("{origin}: {reason}"));
                // The previous rules of the object go: enforcing a policy its author has
                // since changed would be worse than enforcing none of it.
                self.replace(st, key, None)
            }
        }
    }

    /// After rules changed: the CIDR identities their prefixes need, the keys their selectors
    /// read, and a new revision.
    fn changed(&self, st: &mut State) {
        self.reconcile_cidrs(st);
        let keys = SelectedKeys::of(st.sets.iter().map(|((kind, key), set)| {
            let origin = Origin {
                kind: *kind,
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                audit: false,
                log: None,
            };
            (origin, set.as_ref())
        }));
        if keys != *st.selected_keys {
            st.selected_keys = Arc::new(keys);
        }
        Self::bump(st, &self.revision);
    }

    /// Replaces the rules of one object; whether they changed.
    fn replace(&self, st: &mut State, key: SourceKey, new: Option<RuleSet>) -> bool {
        let old = st.sets.remove(&key);
        if old.as_deref() == new.as_ref() {
            if let Some(old) = old {
                st.sets.insert(key, old);
            }
            return false;
        }
        // New users first, so a selector both versions use keeps its computed set.
        if let Some(new) = &new {
            for sel in peer_selectors(new) {
                st.cache.add_user(sel);
            }
        }
        if let Some(old) = &old {
            for sel in peer_selectors(old) {
                st.cache.remove_user(sel);
            }
        }
        if let Some(old) = &old {
            let scope = old.namespace().map(str::to_string);
            if let Some(sets) = st.by_scope.get_mut(&scope) {
                sets.remove(&key);
                if sets.is_empty() {
                    st.by_scope.remove(&scope);
                }
            }
        }
        if let Some(new) = new {
            let new = Arc::new(new);
            let scope = new.namespace().map(str::to_string);
            st.by_scope
                .entry(scope)
                .or_default()
                .insert(key.clone(), new.clone());
            st.sets.insert(key, new);
        }
        true
    }

    fn reconcile_cidrs(&self, st: &mut State) {
        let wanted: BTreeSet<IpNet> = st
            .sets
            .values()
            .flat_map(|s| s.prefixes.iter().copied())
            .collect();
        let pods: BTreeSet<IpNet> = st
            .sets
            .values()
            .filter(|s| s.prefixes_cover_pods)
            .flat_map(|s| s.prefixes.iter().copied())
            .collect();
        let r = st
            .cidrs
            .reconcile(&wanted, &self.identities, self.ipcache.as_deref());
        for identity in &r.added {
            st.cache.identity_added(identity.id, &identity.labels);
        }
        for (id, labels) in &r.removed {
            st.cache.identity_removed(*id, labels);
        }
        for e in &r.errors {
            tracing::warn!("{e}");
        }
        st.cidr_problems = r.errors;
        if pods != st.pod_prefixes {
            st.pod_prefixes = pods;
            self.cidr_changes.send_modify(|n| *n += 1);
        }
    }

    fn bump(st: &mut State, revision: &watch::Sender<u64>) {
        st.revision += 1;
        st.resolved.clear();
        revision.send_replace(st.revision);
    }

    /// Reports the repository's state on the cell's health.
    pub(crate) fn report_now(&self) {
        let st = self.lock();
        self.report(&st);
    }

    fn report(&self, st: &State) {
        let Some(r) = &self.reporter else { return };
        let problems = problems(st);
        // A lockdown is the repository doing its job for the objects it names (their own
        // module reports why they are not in force): said, but not Degraded, which would stop
        // every new pod of the node through CNI STATUS.
        let lockdown = st
            .lockdown
            .describe()
            .map(|text| format!("; {text}"))
            .unwrap_or_default();
        if problems.is_empty() {
            let rules: usize = st.sets.values().map(|s| s.rules.len()).sum();
            r.ok(format!(
                "{} rules from {} policies, {} selectors, {} CIDR identities{lockdown}",
                rules,
                st.sets.len(),
                st.cache.len(),
                st.cidrs.list().len()
            ));
        } else {
            r.degraded(format!(
                "{} problem(s): {}{lockdown}",
                problems.len(),
                problems.join("; ")
            ));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation completes under the lock or leaves the state as it was, so a
        // poisoned lock still guards a consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn problems(st: &State) -> Vec<String> {
    st.problems
        .values()
        .cloned()
        .chain(st.cidr_problems.iter().cloned())
        .collect()
}

fn peer_selectors(set: &RuleSet) -> impl Iterator<Item = &cellium_labels::Selector> {
    set.rules.iter().flat_map(|r| {
        r.peers.iter().filter_map(|p| match p {
            Peer::Selector(s) => Some(s),
            Peer::All => None,
        })
    })
}

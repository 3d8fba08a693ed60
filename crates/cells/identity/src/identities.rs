//! The allocator: labels to identities, reference counts, events, restore.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter, Trigger};
use cellium_labels::Labels;
use cellium_statedir::StateDir;
use tokio::sync::broadcast;

use crate::cluster::{AllocationMode, ClusterNumbering, IdentityConfig};
use crate::error::{Error, Result};
use crate::identity::{Identity, Scope};
use crate::reserved::Reserved;
use crate::table::Table;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many events a subscriber may fall behind before it is told it lagged.
const EVENT_BUFFER: usize = 8192;

/// How often the table is written when a write failed and nothing triggers another.
const PERSIST_RETRY: Duration = Duration::from_secs(30);

/// A change to the set of identities.
#[derive(Debug, Clone)]
pub enum IdentityEvent {
    /// An identity now exists: allocated for the first time, or restored at start.
    Added(Arc<Identity>),
    /// An identity is gone: its last reference was released, or it was restored and never
    /// claimed again.
    Removed(Arc<Identity>),
}

/// An identity with its bookkeeping, as [`Identities::list`] shows it.
#[derive(Debug, Clone)]
pub struct IdentityInfo {
    /// The identity.
    pub identity: Arc<Identity>,
    /// How many holders reference it; 0 for reserved identities, which are not counted,
    /// and for restored identities nobody claimed yet.
    pub references: u64,
    /// Restored from the previous run and not allocated again since.
    pub restored: bool,
}

/// Writes the table in the background.
#[derive(Debug)]
pub(crate) struct Persister {
    pub(crate) dir: Arc<StateDir>,
    pub(crate) trigger: Trigger,
    /// The table generation last written.
    pub(crate) written: AtomicU64,
    /// Why the table must not be written (the file on disk could not be read, nor kept
    /// aside), if so.
    pub(crate) held: std::sync::Mutex<Option<String>>,
}

/// The node's security identities: reserved ones, and one per label set in use.
///
/// Allocation is reference counted: every [`allocate`](Identities::allocate) of a label set
/// takes a reference to the same identity, every [`release`](Identities::release) gives
/// one back, and the identity is gone when the last is. Pod label sets get numbers from
/// 256 to 65535, label sets holding a `cidr:` label node-local numbers from `1 << 24` up.
///
/// Numbers survive a restart of the agent: the table is kept in `identities.json` in the
/// state directory (written by a job, never on the allocation path) and loaded by the
/// start hook, before any cell that depends on identities starts. Restored identities
/// exist, unreferenced, until someone allocates their labels again (and gets the same
/// number) or [`release_unclaimed`](Identities::release_unclaimed) removes them.
///
/// ```
/// use cellium_identity::{Identities, IdentityEvent};
///
/// let ids = Identities::in_memory();
/// let (snapshot, mut events) = ids.snapshot_and_subscribe();
/// assert_eq!(snapshot.len(), 10); // the reserved identities
/// let web = ids.allocate(&"k8s:app=web".parse()?)?;
/// assert_eq!(web.id, 256);
/// assert!(matches!(events.try_recv(), Ok(IdentityEvent::Added(i)) if i.id == 256));
/// assert!(ids.release(web.id));
/// assert!(ids.get(256).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Identities {
    table: RwLock<Table>,
    reserved: HashMap<u32, Arc<Identity>>,
    pub(crate) events: broadcast::Sender<IdentityEvent>,
    pub(crate) persister: Option<Persister>,
    /// The cluster's numbering of pod label sets (`identity-allocation-mode: crd`), with the
    /// numbers learnt from it.
    cluster: Option<Cluster>,
    /// Moves at every [`retire`](Identities::retire): the holders of a retired number move.
    retirements: tokio::sync::watch::Sender<u64>,
}

/// The cluster's numbering and what it said so far.
#[derive(Debug)]
struct Cluster {
    numbering: Arc<dyn ClusterNumbering>,
    numbers: Mutex<HashMap<Labels, u32>>,
}

impl Identities {
    /// The cell's constructor: the table is restored from `state` by the start hook and
    /// written back by the `persist` job and the stop hook. With
    /// `identity-allocation-mode: crd` or `kvstore`, pod label sets are numbered by the
    /// contributed numbering of that mode (`crd`: Kubernetes mode's; `kvstore`: the kvstore
    /// cell's, with `kvstore: etcd`): without one, that mode fails the start.
    pub fn new(
        cfg: Config<IdentityConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        state: Arc<StateDir>,
        numberings: Vec<Arc<dyn ClusterNumbering>>,
    ) -> Result<Arc<Identities>> {
        let mode = cfg.identity_allocation_mode;
        let numbering = numberings
            .into_iter()
            .find(|n| n.mode() == mode && n.store().is_some());
        let cluster = match (mode, numbering) {
            (AllocationMode::Local, _) => None,
            (_, Some(numbering)) => Some(Cluster {
                numbering,
                numbers: Mutex::default(),
            }),
            (AllocationMode::Crd, None) => {
                return Err(Error::Mode(
                    "crd needs Kubernetes mode (k8s-api-server, k8s-kubeconfig-path or the in-cluster environment)".into(),
                ));
            }
            (AllocationMode::Kvstore, None) => {
                return Err(Error::Mode(
                    "kvstore needs `kvstore: etcd` and `kvstore-endpoints`".into(),
                ));
            }
        };
        let trigger = Trigger::new();
        let mut ids = Identities::build(
            Table::default(),
            Some(Persister {
                dir: state,
                trigger: trigger.clone(),
                written: AtomicU64::new(0),
                held: Default::default(),
            }),
        );
        ids.cluster = cluster;
        let ids = Arc::new(ids);
        let (start, stop) = (ids.clone(), ids.clone());
        lc.append(
            Hook::new("restore-identities")
                .on_start(move |_| async move {
                    let restored = tokio::task::spawn_blocking(move || start.restore()).await?;
                    if restored.problems.is_empty() {
                        reporter.ok(format!("{} identities restored", restored.count));
                    } else {
                        reporter.degraded(format!(
                            "{} identities restored; {}",
                            restored.count,
                            restored.problems.join("; ")
                        ));
                    }
                    Ok(())
                })
                .on_stop(move |_| async move {
                    match tokio::task::spawn_blocking(move || stop.persist()).await? {
                        // Reported since the start; the file is kept as it is on purpose.
                        Err(Error::Held { reason, .. }) => {
                            tracing::warn!("identity table not written at stop: {reason}");
                        }
                        other => {
                            other?;
                        }
                    }
                    Ok(())
                }),
        );
        let job = ids.clone();
        jobs.timer("persist", PERSIST_RETRY, move |ctx| {
            let ids = job.clone();
            async move {
                let wrote = tokio::task::spawn_blocking(move || ids.persist()).await??;
                if let Some(count) = wrote {
                    ctx.reporter().ok(format!("{count} identities written"));
                }
                Ok(())
            }
        })
        .trigger(trigger)
        .add();
        Ok(ids)
    }

    /// Identities kept in memory only: the reserved ones present, nothing restored or
    /// written. For tools, tests and benchmarks outside a hive.
    pub fn in_memory() -> Arc<Identities> {
        Arc::new(Identities::build(Table::default(), None))
    }

    pub(crate) fn build(table: Table, persister: Option<Persister>) -> Identities {
        let reserved = Reserved::ALL
            .into_iter()
            .map(|r| (r.id(), Arc::new(r.identity())))
            .collect();
        Identities {
            table: RwLock::new(table),
            reserved,
            events: broadcast::channel(EVENT_BUFFER).0,
            persister,
            cluster: None,
            retirements: tokio::sync::watch::channel(0).0,
        }
    }

    /// Where pod identities are numbered: `None` on this node alone, else the cluster's store.
    pub fn cluster_store(&self) -> Option<String> {
        self.cluster.as_ref().and_then(|c| c.numbering.store())
    }

    /// Learns the cluster-wide number of `labels` (`identity-allocation-mode: crd` or
    /// `kvstore`), so that [`allocate`](Identities::allocate) can give it. Does nothing in local
    /// mode, for reserved and node-local (`cidr:`) label sets, and for label sets that hold a
    /// number already (learnt, restored or in use).
    /// Asks the store otherwise: the one async step of allocating, taken before the allocation
    /// so that `allocate` stays synchronous.
    pub async fn resolve(&self, labels: &Labels) -> Result<()> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        if Scope::for_labels(labels) != Scope::Cluster
            || !matches!(Reserved::for_labels(labels), Ok(None))
            || lock(&cluster.numbers).contains_key(labels)
            // Held here already (restored at start, or in use): allocate gives that number
            // without the store, so a pod whose labels have one works while it is away.
            || self.read().by_labels.contains_key(labels)
        {
            return Ok(());
        }
        let number =
            cluster
                .numbering
                .number(labels)
                .await
                .map_err(|reason| Error::Unnumbered {
                    labels: labels.clone(),
                    reason,
                })?;
        lock(&cluster.numbers).insert(labels.clone(), number);
        Ok(())
    }

    /// The cluster's number of `labels`, when the mode has one and it is known.
    fn cluster_number(&self, labels: &Labels, scope: Scope) -> Option<Result<u32>> {
        let cluster = self.cluster.as_ref()?;
        if scope != Scope::Cluster {
            return None;
        }
        Some(
            lock(&cluster.numbers)
                .get(labels)
                .copied()
                .ok_or_else(|| Error::Unnumbered {
                    labels: labels.clone(),
                    reason: "not asked for yet (Identities::resolve)".into(),
                }),
        )
    }

    /// The identity of `labels`, taking a reference to it.
    ///
    /// The same labels give the same identity as long as it is referenced (and across
    /// restarts, see the type's docs). Reserved label sets give their reserved identity
    /// ([`Reserved::for_labels`]), which is not counted. A new identity is announced with
    /// [`IdentityEvent::Added`] before this returns.
    ///
    /// Errors: an empty label set, `reserved:` labels that name no reserved identity, and a
    /// scope with no number left. Nothing changes on error.
    pub fn allocate(&self, labels: &Labels) -> Result<Arc<Identity>> {
        if labels.is_empty() {
            return Err(Error::NoLabels);
        }
        match Reserved::for_labels(labels) {
            Ok(Some(r)) => return Ok(self.reserved[&r.id()].clone()),
            Ok(None) => {}
            Err(()) => {
                return Err(Error::UnknownReserved {
                    labels: labels.clone(),
                });
            }
        }
        let mut table = self.write();
        if let Some(id) = table.by_labels.get(labels).copied()
            && let Some(entry) = table.by_id.get_mut(&id)
        {
            entry.refs += 1;
            entry.restored = false;
            let (identity, first) = (entry.identity.clone(), entry.refs == 1);
            drop(table);
            if first && let Some(cluster) = &self.cluster {
                cluster.numbering.used(labels, identity.id);
            }
            return Ok(identity);
        }
        let scope = Scope::for_labels(labels);
        if let Some(number) = self.cluster_number(labels, scope) {
            let id = number?;
            if let Some(other) = table.by_id.get(&id) {
                // A number this node holds for other labels (restored from a local-mode run):
                // the cluster's numbering wins only once that holder is gone.
                return Err(Error::Unnumbered {
                    labels: labels.clone(),
                    reason: format!(
                        "the cluster numbers them {id}, which this node holds for {}",
                        other.identity.labels
                    ),
                });
            }
            let identity = self.insert_new(table, id, labels);
            if let Some(cluster) = &self.cluster {
                cluster.numbering.used(labels, id);
            }
            return Ok(identity);
        }
        let Some(id) = table.next_free(scope) else {
            return Err(Error::Exhausted {
                scope,
                capacity: table.range(scope).capacity(),
                labels: labels.clone(),
            });
        };
        Ok(self.insert_new(table, id, labels))
    }

    /// Adds identity `id` of `labels` with one reference, and announces it.
    fn insert_new(
        &self,
        mut table: RwLockWriteGuard<'_, Table>,
        id: u32,
        labels: &Labels,
    ) -> Arc<Identity> {
        let identity = Arc::new(Identity {
            id,
            labels: labels.clone(),
        });
        let before = table.announced(id).cloned();
        table.insert(identity.clone(), 1, false);
        // Sent under the lock: a snapshot taken under it is followed by exactly the
        // events after it. A number other nodes use was announced when it was learnt.
        let after = table.announced(id).cloned();
        self.announce(before, after);
        drop(table);
        tracing::debug!(id, %labels, "identity allocated");
        self.changed();
        identity
    }

    /// Gives back one reference to identity `id`; returns whether this removed the
    /// identity (it was the last reference). Reserved identities are never released;
    /// releasing an unknown number, or a restored identity nobody claimed, does nothing
    /// and returns `false`.
    pub fn release(&self, id: u32) -> bool {
        if self.reserved.contains_key(&id) {
            return false;
        }
        let mut table = self.write();
        let Some(entry) = table.by_id.get_mut(&id) else {
            tracing::warn!(id, "release of an unknown identity ignored");
            return false;
        };
        if entry.refs == 0 {
            tracing::warn!(id, "release of an unclaimed restored identity ignored");
            return false;
        }
        entry.refs -= 1;
        if entry.refs > 0 {
            return false;
        }
        let before = table.announced(id).cloned();
        let removed = table.remove(id).map(|e| e.identity);
        let after = table.announced(id).cloned();
        self.announce(before, after);
        drop(table);
        if let Some(identity) = &removed {
            tracing::debug!(id, labels = %identity.labels, "identity released");
            if let Some(cluster) = &self.cluster {
                cluster.numbering.release(&identity.labels, id);
            }
        }
        self.changed();
        removed.is_some()
    }

    /// Removes every restored identity that nobody allocated again since the start, and
    /// returns their numbers.
    ///
    /// Contract: the endpoint manager calls this once, after it restored every endpoint
    /// (and so re-allocated every label set still in use). Before that call restored
    /// identities stay, so that a restored endpoint gets its old number back; calling it
    /// earlier would renumber the endpoints restored later, and never calling it leaks the
    /// numbers of pods deleted while the agent was down. Policy identities (CIDRs) are
    /// re-allocated by the policy repository as it loads the rules, which must also happen
    /// before this call.
    pub fn release_unclaimed(&self) -> Vec<u32> {
        let mut table = self.write();
        let unclaimed: Vec<u32> = table
            .by_id
            .values()
            .filter(|e| e.restored && e.refs == 0)
            .map(|e| e.identity.id)
            .collect();
        let mut released = Vec::new();
        for id in &unclaimed {
            let before = table.announced(*id).cloned();
            if let Some(entry) = table.remove(*id) {
                let after = table.announced(*id).cloned();
                self.announce(before, after);
                released.push(entry.identity);
            }
        }
        drop(table);
        if let Some(cluster) = &self.cluster {
            for identity in &released {
                cluster.numbering.release(&identity.labels, identity.id);
            }
        }
        if !unclaimed.is_empty() {
            tracing::info!(
                count = unclaimed.len(),
                "unclaimed restored identities released"
            );
            self.changed();
        }
        unclaimed
    }

    /// Learns identity `id` of `labels`, which other nodes use (from the cluster's
    /// CiliumIdentity objects), so that policies select their pods. Announced with
    /// [`IdentityEvent::Added`] unless this node already holds it. In `crd` mode the number
    /// also answers [`resolve`](Identities::resolve) for these labels without asking.
    pub fn learn(&self, id: u32, labels: &Labels) {
        if self.reserved.contains_key(&id) {
            return;
        }
        if let Some(cluster) = &self.cluster {
            lock(&cluster.numbers).insert(labels.clone(), id);
        }
        let mut table = self.write();
        if table.remote.get(&id).is_some_and(|i| i.labels == *labels) {
            return;
        }
        let identity = Arc::new(Identity {
            id,
            labels: labels.clone(),
        });
        let before = table.announced(id).cloned();
        table.remote.insert(id, identity);
        let after = table.announced(id).cloned();
        self.announce(before, after);
    }

    /// Forgets identity `id` learnt with [`learn`](Identities::learn) (its CiliumIdentity is
    /// gone); announced with [`IdentityEvent::Removed`] unless this node still holds it.
    pub fn forget(&self, id: u32) {
        let mut table = self.write();
        let before = table.announced(id).cloned();
        let Some(old) = table.remote.remove(&id) else {
            return;
        };
        if let Some(cluster) = &self.cluster {
            let mut numbers = lock(&cluster.numbers);
            if numbers.get(&old.labels) == Some(&id) {
                numbers.remove(&old.labels);
            }
        }
        let after = table.announced(id).cloned();
        self.announce(before, after);
    }

    /// The cluster gave number `id`, which this node holds for `labels`, to other labels (in
    /// kvstore mode: taken by another node while this node's use of it had expired with its
    /// lease). The labels lose the number: their next allocation asks the cluster for a new
    /// one, the number's holders move off it as they regenerate (see
    /// [`retirements`](Identities::retirements)), and once the cluster's labels for the number
    /// are learnt they are what it means to policy. Returns whether `id` was held for
    /// `labels` and is retired now.
    pub fn retire(&self, id: u32, labels: &Labels) -> bool {
        let mut table = self.write();
        if table
            .by_id
            .get(&id)
            .is_none_or(|e| e.identity.labels != *labels)
        {
            return false;
        }
        let before = table.announced(id).cloned();
        if table.retire(id).is_none() {
            return false;
        }
        let after = table.announced(id).cloned();
        self.announce(before, after);
        drop(table);
        if let Some(cluster) = &self.cluster {
            let mut numbers = lock(&cluster.numbers);
            if numbers.get(labels) == Some(&id) {
                numbers.remove(labels);
            }
        }
        tracing::warn!(id, %labels, "identity number given to other labels by the cluster; its holders move to a new one");
        self.retirements.send_modify(|n| *n += 1);
        self.changed();
        true
    }

    /// Whether `id` is retired (see [`retire`](Identities::retire)) and still held.
    pub fn is_retired(&self, id: u32) -> bool {
        self.read().by_id.get(&id).is_some_and(|e| e.retired)
    }

    /// A counter that moves at every [`retire`](Identities::retire): whoever holds numbers
    /// (the endpoint manager) looks for retired ones then.
    pub fn retirements(&self) -> tokio::sync::watch::Receiver<u64> {
        self.retirements.subscribe()
    }

    /// Announces what changed in what a number means to policy: nothing when the same
    /// labels, else the old one removed and the new one added. Called under the table's lock.
    fn announce(&self, before: Option<Arc<Identity>>, after: Option<Arc<Identity>>) {
        if let (Some(b), Some(a)) = (&before, &after)
            && b.labels == a.labels
        {
            return;
        }
        if let Some(b) = before {
            let _ = self.events.send(IdentityEvent::Removed(b));
        }
        if let Some(a) = after {
            let _ = self.events.send(IdentityEvent::Added(a));
        }
    }

    /// The numbers learnt from other nodes.
    pub fn learnt(&self) -> Vec<u32> {
        self.read().remote.keys().copied().collect()
    }

    /// The identity numbered `id`.
    pub fn get(&self, id: u32) -> Option<Arc<Identity>> {
        if let Some(r) = self.reserved.get(&id) {
            return Some(r.clone());
        }
        self.read().announced(id).cloned()
    }

    /// The identity numbered `id` with its bookkeeping.
    pub fn info(&self, id: u32) -> Option<IdentityInfo> {
        if let Some(r) = self.reserved.get(&id) {
            return Some(IdentityInfo {
                identity: r.clone(),
                references: 0,
                restored: false,
            });
        }
        let table = self.read();
        table
            .by_id
            .get(&id)
            .map(|e| IdentityInfo {
                identity: e.identity.clone(),
                references: e.refs,
                restored: e.restored,
            })
            .or_else(|| {
                table.remote.get(&id).map(|identity| IdentityInfo {
                    identity: identity.clone(),
                    references: 0,
                    restored: false,
                })
            })
    }

    /// The identity of `labels`, if it exists, without taking a reference.
    pub fn lookup(&self, labels: &Labels) -> Option<Arc<Identity>> {
        match Reserved::for_labels(labels) {
            Ok(Some(r)) => return Some(self.reserved[&r.id()].clone()),
            Ok(None) => {}
            Err(()) => return None,
        }
        let table = self.read();
        match table.by_labels.get(labels) {
            Some(id) => table.by_id.get(id).map(|e| e.identity.clone()),
            None => table.remote.values().find(|i| i.labels == *labels).cloned(),
        }
    }

    /// Every identity, reserved ones included, by number.
    pub fn list(&self) -> Vec<IdentityInfo> {
        let table = self.read();
        let mut out: Vec<IdentityInfo> = Reserved::ALL
            .iter()
            .map(|r| IdentityInfo {
                identity: self.reserved[&r.id()].clone(),
                references: 0,
                restored: false,
            })
            .collect();
        out.extend(table.by_id.values().map(|e| IdentityInfo {
            identity: e.identity.clone(),
            references: e.refs,
            restored: e.restored,
        }));
        out.extend(
            table
                .remote
                .iter()
                .filter(|(id, _)| !table.by_id.contains_key(id))
                .map(|(_, identity)| IdentityInfo {
                    identity: identity.clone(),
                    references: 0,
                    restored: false,
                }),
        );
        out
    }

    /// Every identity now, and a receiver of every change after it, with no gap between
    /// and none twice.
    ///
    /// Trap: a receiver that falls more than 8192 events behind gets
    /// `RecvError::Lagged`; it must then call this again and diff against what it had.
    pub fn snapshot_and_subscribe(
        &self,
    ) -> (Vec<Arc<Identity>>, broadcast::Receiver<IdentityEvent>) {
        let table = self.read();
        let mut all: Vec<Arc<Identity>> = Reserved::ALL
            .iter()
            .map(|r| self.reserved[&r.id()].clone())
            .collect();
        all.extend(table.announced_all().cloned());
        (all, self.events.subscribe())
    }

    /// Asks the persister to write the table soon.
    pub(crate) fn changed(&self) {
        if let Some(p) = &self.persister {
            p.trigger.trigger();
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Table> {
        // Every mutation leaves both maps consistent before it can panic, so a poisoned
        // lock still guards a usable table.
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use cellium_labels::Label;

    use super::*;
    use crate::identity::{CLUSTER_IDENTITIES, LOCAL_IDENTITIES};

    fn labels(s: &str) -> Labels {
        s.parse().unwrap()
    }

    #[test]
    fn reserved_identities_always_exist_and_are_never_released() {
        let ids = Identities::in_memory();
        let list = ids.list();
        assert_eq!(list.len(), 10);
        assert!(
            list.iter()
                .all(|i| i.identity.is_reserved() && i.references == 0)
        );
        let host = ids.allocate(&labels("reserved:host")).unwrap();
        assert_eq!(host.id, 1);
        assert_eq!(
            ids.allocate(&labels("reserved:host,k8s:node=a"))
                .unwrap()
                .id,
            1
        );
        assert_eq!(ids.allocate(&labels("reserved:world-ipv6")).unwrap().id, 10);
        assert!(!ids.release(1));
        assert!(!ids.release(1));
        assert_eq!(ids.get(1).unwrap().labels, labels("reserved:host"));
        assert_eq!(ids.lookup(&labels("reserved:world")).unwrap().id, 2);
        assert_eq!(
            ids.get(9).unwrap().labels.to_string(),
            "reserved:world,reserved:world-ipv4"
        );
    }

    #[test]
    fn the_same_labels_give_the_same_identity_while_referenced() {
        let ids = Identities::in_memory();
        let web = labels("k8s:app=web,k8s:io.kubernetes.pod.namespace=shop");
        let a = ids.allocate(&web).unwrap();
        let b = ids.allocate(&web).unwrap();
        assert_eq!(a.id, 256);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(ids.allocate(&labels("k8s:app=db")).unwrap().id, 257);
        assert_eq!(ids.lookup(&web).unwrap().id, 256);
        let info = ids
            .list()
            .into_iter()
            .find(|i| i.identity.id == 256)
            .unwrap();
        assert_eq!(info.references, 2);
        assert!(!ids.release(256), "one reference is left");
        assert!(ids.get(256).is_some());
        assert!(ids.release(256), "the last reference removes it");
        assert!(ids.get(256).is_none());
        assert!(ids.lookup(&web).is_none());
        assert!(!ids.release(256));
        // A released number is not handed out again at once.
        assert_eq!(ids.allocate(&web).unwrap().id, 258);
    }

    #[test]
    fn cidr_label_sets_get_local_identities() {
        let ids = Identities::in_memory();
        let net = ids
            .allocate(&Labels::for_cidr("10.0.0.0/8".parse().unwrap()))
            .unwrap();
        assert_eq!(net.id, 1 << 24);
        assert!(net.is_local());
        assert_eq!(net.scope(), Scope::Local);
        let bare = ids
            .allocate(&Labels::from_iter([Label::cidr(
                "fd00::/64".parse().unwrap(),
            )]))
            .unwrap();
        assert_eq!(bare.id, (1 << 24) + 1);
        let pod = ids.allocate(&labels("k8s:app=web")).unwrap();
        assert_eq!(pod.scope(), Scope::Cluster);
    }

    #[test]
    fn bad_label_sets_are_refused_and_change_nothing() {
        let ids = Identities::in_memory();
        let err = ids.allocate(&Labels::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot allocate an identity for an empty label set"
        );
        let err = ids.allocate(&labels("reserved:nope")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no reserved identity has the labels reserved:nope"
        );
        assert_eq!(ids.list().len(), 10);
    }

    #[test]
    fn exhaustion_is_a_clear_error() {
        let ids = Identities::build(Table::with_ranges(256..=257, LOCAL_IDENTITIES), None);
        ids.allocate(&labels("k8s:a=1")).unwrap();
        ids.allocate(&labels("k8s:a=2")).unwrap();
        let err = ids.allocate(&labels("k8s:a=3")).unwrap_err();
        assert!(matches!(
            err,
            Error::Exhausted {
                capacity: 2,
                scope: Scope::Cluster,
                ..
            }
        ));
        assert!(
            err.to_string().starts_with(
                "all 2 cluster identities are in use: cannot allocate one for k8s:a=3"
            ),
            "{err}"
        );
        // Existing label sets still get their identity, and local ones have their own range.
        assert_eq!(ids.allocate(&labels("k8s:a=1")).unwrap().id, 256);
        assert!(ids.allocate(&labels("cidr:10.0.0.0/8")).is_ok());
        ids.release(257);
        assert_eq!(ids.allocate(&labels("k8s:a=3")).unwrap().id, 257);
    }

    #[test]
    fn the_full_cluster_range_is_usable() {
        let ids = Identities::in_memory();
        let capacity = CLUSTER_IDENTITIES.end() - CLUSTER_IDENTITIES.start() + 1;
        for i in 0..capacity {
            let id = ids.allocate(&labels(&format!("k8s:n={i}"))).unwrap();
            assert!(CLUSTER_IDENTITIES.contains(&id.id));
        }
        let err = ids.allocate(&labels("k8s:n=last")).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Exhausted {
                    capacity: 65280,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn snapshot_and_events_have_no_gap_and_no_repeat() {
        let ids = Identities::in_memory();
        let writer = {
            let ids = ids.clone();
            std::thread::spawn(move || {
                for i in 0..3000 {
                    let id = ids.allocate(&labels(&format!("k8s:n={i}"))).unwrap();
                    if i % 3 == 0 {
                        ids.release(id.id);
                    }
                }
            })
        };
        // Subscribe somewhere in the middle of the writes.
        while ids.list().len() < 500 {
            std::thread::yield_now();
        }
        let (snapshot, mut events) = ids.snapshot_and_subscribe();
        writer.join().unwrap();
        let mut seen: BTreeMap<u32, Labels> =
            snapshot.iter().map(|i| (i.id, i.labels.clone())).collect();
        assert_eq!(
            seen.len(),
            snapshot.len(),
            "no identity twice in the snapshot"
        );
        while let Ok(event) = events.try_recv() {
            match event {
                IdentityEvent::Added(i) => {
                    assert!(
                        seen.insert(i.id, i.labels.clone()).is_none(),
                        "added twice: {i}"
                    );
                }
                IdentityEvent::Removed(i) => {
                    assert!(seen.remove(&i.id).is_some(), "removed unseen: {i}");
                }
            }
        }
        let now: BTreeMap<u32, Labels> = ids
            .list()
            .into_iter()
            .map(|i| (i.identity.id, i.identity.labels.clone()))
            .collect();
        assert_eq!(seen, now);
        assert_eq!(now.len(), 10 + 2000);
    }

    #[test]
    fn allocation_and_its_event_are_cheap() {
        let ids = Identities::in_memory();
        let (_, mut events) = ids.snapshot_and_subscribe();
        let sets: Vec<Labels> = (0..5000)
            .map(|i| {
                Labels::for_pod(
                    &format!("ns{}", i % 7),
                    &BTreeMap::from([("app".into(), format!("a{i}"))]),
                    &BTreeMap::new(),
                )
            })
            .collect();
        let started = Instant::now();
        for l in &sets {
            ids.allocate(l).unwrap();
        }
        let took = started.elapsed();
        let mut received = 0;
        while events.try_recv().is_ok() {
            received += 1;
        }
        assert_eq!(received, 5000);
        // About 2 µs each in a debug build on this machine; the bound leaves room for load.
        assert!(took.as_millis() < 1000, "5000 allocations took {took:?}");
    }

    #[test]
    fn identities_of_other_nodes_are_known_announced_once_and_outlive_local_holders() {
        let ids = Identities::in_memory();
        let (_, mut events) = ids.snapshot_and_subscribe();
        let web: Labels = "k8s:app=web".parse().unwrap();
        ids.learn(3000, &web);
        ids.learn(3000, &web);
        assert!(matches!(events.try_recv(), Ok(IdentityEvent::Added(i)) if i.id == 3000));
        assert!(events.try_recv().is_err(), "learnt twice, announced once");
        assert_eq!(ids.get(3000).unwrap().labels, web);
        assert_eq!(ids.lookup(&web).unwrap().id, 3000);
        assert!(ids.list().iter().any(|i| i.identity.id == 3000));
        ids.forget(3000);
        assert!(matches!(events.try_recv(), Ok(IdentityEvent::Removed(i)) if i.id == 3000));
        assert!(ids.get(3000).is_none());
        // A number this node holds and other nodes use stays announced until both let go.
        let db = ids.allocate(&"k8s:app=db".parse().unwrap()).unwrap();
        while events.try_recv().is_ok() {}
        ids.learn(db.id, &db.labels);
        assert!(
            events.try_recv().is_err(),
            "already announced by the allocation"
        );
        ids.release(db.id);
        assert!(events.try_recv().is_err(), "other nodes still use it");
        assert!(ids.get(db.id).is_some());
        ids.forget(db.id);
        assert!(matches!(events.try_recv(), Ok(IdentityEvent::Removed(i)) if i.id == db.id));
    }
}

#[cfg(test)]
mod cluster_hooks {
    use super::*;
    use futures::FutureExt;
    use futures::future::BoxFuture;

    /// A numbering that gives 3000, then 3001, ..., and records what it was told.
    #[derive(Default)]
    struct Recorder {
        asked: Mutex<u32>,
        calls: Mutex<Vec<String>>,
    }

    impl ClusterNumbering for Recorder {
        fn mode(&self) -> AllocationMode {
            AllocationMode::Kvstore
        }
        fn store(&self) -> Option<String> {
            Some("a recorder".into())
        }
        fn number(&self, _labels: &Labels) -> BoxFuture<'static, std::result::Result<u32, String>> {
            let mut asked = lock(&self.asked);
            *asked += 1;
            let number = 2999 + *asked;
            async move { Ok(number) }.boxed()
        }
        fn used(&self, labels: &Labels, id: u32) {
            lock(&self.calls).push(format!("used {labels} {id}"));
        }
        fn release(&self, labels: &Labels, id: u32) {
            lock(&self.calls).push(format!("release {labels} {id}"));
        }
    }

    #[tokio::test]
    async fn the_store_hears_of_the_first_use_and_the_last_release_and_is_not_asked_twice() {
        let recorder = Arc::new(Recorder::default());
        let mut ids = Identities::build(Table::default(), None);
        ids.cluster = Some(Cluster {
            numbering: recorder.clone(),
            numbers: Mutex::default(),
        });
        let web: Labels = "k8s:app=web".parse().unwrap();
        ids.resolve(&web).await.unwrap();
        assert_eq!(ids.allocate(&web).unwrap().id, 3000);
        assert_eq!(ids.allocate(&web).unwrap().id, 3000);
        ids.resolve(&web).await.unwrap();
        assert_eq!(
            *lock(&recorder.asked),
            1,
            "held labels are not asked for again"
        );
        assert!(!ids.release(3000));
        assert!(ids.release(3000));
        assert_eq!(
            *lock(&recorder.calls),
            ["used k8s:app=web 3000", "release k8s:app=web 3000"]
        );
        // Node-local label sets never reach the store.
        let cidr: Labels = "cidr:10.0.0.0/8".parse().unwrap();
        ids.resolve(&cidr).await.unwrap();
        ids.allocate(&cidr).unwrap();
        assert_eq!(*lock(&recorder.asked), 1);
        assert_eq!(lock(&recorder.calls).len(), 2);
    }

    fn with_recorder() -> (Arc<Recorder>, Identities) {
        let recorder = Arc::new(Recorder::default());
        let mut ids = Identities::build(Table::default(), None);
        ids.cluster = Some(Cluster {
            numbering: recorder.clone(),
            numbers: Mutex::default(),
        });
        (recorder, ids)
    }

    fn event(events: &mut broadcast::Receiver<IdentityEvent>) -> Option<String> {
        events.try_recv().ok().map(|e| match e {
            IdentityEvent::Added(i) => format!("added {} {}", i.id, i.labels),
            IdentityEvent::Removed(i) => format!("removed {} {}", i.id, i.labels),
        })
    }

    #[tokio::test]
    async fn a_retired_number_moves_its_labels_to_a_new_one_and_goes_with_its_last_holder() {
        let (recorder, ids) = with_recorder();
        let (web, db): (Labels, Labels) = (
            "k8s:app=web".parse().unwrap(),
            "k8s:app=db".parse().unwrap(),
        );
        ids.resolve(&web).await.unwrap();
        assert_eq!(ids.allocate(&web).unwrap().id, 3000);
        assert_eq!(ids.allocate(&web).unwrap().id, 3000, "two holders");
        // The cluster's record of this node's own number, learnt like any other.
        ids.learn(3000, &web);
        let (_, mut events) = ids.snapshot_and_subscribe();
        let retirements = ids.retirements();

        // The cluster gave 3000 to db.
        assert!(
            !ids.retire(3000, &db),
            "only the labels this node holds it for"
        );
        assert!(ids.retire(3000, &web));
        assert!(!ids.retire(3000, &web), "retired once");
        assert!(retirements.has_changed().unwrap());
        assert!(ids.is_retired(3000));
        assert_eq!(
            event(&mut events),
            None,
            "3000 still means web until db is learnt"
        );
        ids.learn(3000, &db);
        assert_eq!(
            event(&mut events).as_deref(),
            Some("removed 3000 k8s:app=web")
        );
        assert_eq!(event(&mut events).as_deref(), Some("added 3000 k8s:app=db"));
        assert_eq!(ids.get(3000).unwrap().labels, db);

        // A holder moves: web is asked for again and gets a new number.
        ids.resolve(&web).await.unwrap();
        assert_eq!(*lock(&recorder.asked), 2);
        assert_eq!(ids.allocate(&web).unwrap().id, 3001);
        assert_eq!(
            event(&mut events).as_deref(),
            Some("added 3001 k8s:app=web")
        );
        assert_eq!(
            ids.allocate(&web).unwrap().id,
            3001,
            "the second holder follows"
        );
        // The old number's holders let go: it goes without taking web's new number along,
        // and without changing what 3000 means.
        assert!(!ids.release(3000));
        assert!(ids.release(3000));
        assert_eq!(event(&mut events), None);
        assert!(!ids.is_retired(3000));
        assert_eq!(ids.lookup(&web).unwrap().id, 3001);
        assert_eq!(ids.get(3000).unwrap().labels, db);
        assert_eq!(
            *lock(&recorder.calls),
            [
                "used k8s:app=web 3000",
                "used k8s:app=web 3001",
                "release k8s:app=web 3000"
            ]
        );
        let (snapshot, _) = ids.snapshot_and_subscribe();
        let numbered: Vec<String> = snapshot
            .iter()
            .filter(|i| !i.is_reserved())
            .map(|i| format!("{} {}", i.id, i.labels))
            .collect();
        assert_eq!(numbered, ["3000 k8s:app=db", "3001 k8s:app=web"]);
    }
}

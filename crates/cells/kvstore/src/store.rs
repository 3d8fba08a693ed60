//! The connection to etcd: one client, one session lease kept alive, the keys this node keeps
//! on that lease (written again whenever the lease is new or someone else deleted or changed
//! one), and the mirrors of the prefixes the agent reads.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, OnceCell, watch};

use crate::config::{KvstoreConfig, KvstoreKind};
use crate::etcd_config::{EtcdAccess, chain};
use crate::keys;
use crate::mirror::{Change, Mirror};

/// How long one request may take before it counts as failed: etcd away, or a partition.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the kept keys are compared with what was written, when nothing else asks.
const OWNED_RESYNC: Duration = Duration::from_secs(30);

/// The most operations put in one transaction (etcd's `--max-txn-ops` defaults to 128).
const TXN_BATCH: usize = 64;

/// Retries: from 50 ms, doubling, up to 5 s, so that an etcd that is away is not hammered.
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff(Duration::from_millis(50))
    }
    pub(crate) fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        d
    }
    pub(crate) fn reset(&mut self) {
        self.0 = Duration::from_millis(50);
    }
}

/// A key this node keeps on its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) value: String,
    /// For `value/<labels key>/<node IP>`: the identity's `id/<N>` key and the labels key it
    /// must hold; written with it when absent (the operator's GC may have removed it while
    /// this node was away), and the write refused when it holds other labels.
    pub(crate) master: Option<(String, String)>,
}

#[derive(Debug, Default)]
struct Owned {
    /// What should be in etcd.
    desired: BTreeMap<String, Kept>,
    /// What was written, with the lease it was written on.
    written: HashMap<String, (String, i64)>,
    /// `id/<N>` keys of numbers this node holds that someone rewrote with other labels: put
    /// back to (labels key, while this `value/` key is on this lease).
    restore: BTreeMap<String, (String, String, i64)>,
}

/// Numbers this node held that another node took while this node's references were gone (a
/// partition longer than the lease): their labels get new numbers.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// (labels key, number) for the identity cell to retire (`Identities::retire`).
    pub(crate) to_retire: Vec<(String, u32)>,
    /// Labels keys to the number taken from them, until they are numbered again.
    pub(crate) moving: HashMap<String, u32>,
}

#[derive(Debug, Default)]
struct Status {
    /// `None` before the first request.
    connected: Option<bool>,
    last_error: Option<(String, SystemTime)>,
}

/// The kvstore: the client, the session and the mirrors. Inactive without `kvstore: etcd`.
pub struct Kvstore {
    cfg: KvstoreConfig,
    /// The endpoints, with their TLS and credentials (`kvstore-opt etcd.config`).
    access: EtcdAccess,
    node: String,
    /// The last part of this node's `value/` keys, Cilium's `GetNodeSuffix`: the node's IPv4
    /// address, else its IPv6 one; set once, when the node's address is first known.
    suffix: OnceLock<String>,
    /// Numbers this node uses, by labels key, recorded before its suffix was known: kept as
    /// `value/` keys once it is.
    early_uses: Mutex<BTreeMap<String, u32>>,
    /// Why etcd refuses this node (its TLS handshake or credentials), while it does.
    refused: watch::Sender<Option<Refusal>>,
    client: OnceCell<Client>,
    /// The session lease, `None` while there is none.
    lease: watch::Sender<Option<i64>>,
    owned: Mutex<Owned>,
    owned_changed: Notify,
    nonce: AtomicU64,
    status: Mutex<Status>,
    /// `cilium/state/identities/v1/`: numbers, their users, locks.
    pub identities: Mirror,
    /// `cilium/state/ip/v1/default/`.
    pub ips: Mirror,
    /// `cilium/state/nodes/v1/`.
    pub nodes: Mirror,
    /// Labels keys to numbers, from the `id/` keys of [`identities`](Self::identities).
    numbers: Mutex<HashMap<String, u32>>,
    /// Allocations' first tries waiting for their transaction (`first_try`).
    pub(crate) first_tries: Mutex<crate::first_try::Queue>,
    /// `cellium_kvstore_identities_restored_total`: `id/<N>` keys of numbers this node
    /// holds rewritten with other labels by someone, and put back.
    pub(crate) restored: Counter,
    /// Numbers another node took from this one, their labels to be numbered again.
    pub(crate) taken: Mutex<Taken>,
    /// Moves whenever a number is found taken.
    taken_changes: watch::Sender<u64>,
    /// `cellium_kvstore_identity_reallocated_total`: label sets numbered again because
    /// another node took their number while this node's references were gone.
    pub(crate) reallocated: Counter,
}

impl fmt::Debug for Kvstore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kvstore")
            .field("endpoints", &self.access.endpoints)
            .field("node", &self.node)
            .field("lease", &self.lease_id())
            .finish()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` within [`REQUEST_TIMEOUT`], as a text error.
pub(crate) async fn timed<T>(
    what: &str,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {}", describe(&e))),
        Err(_) => Err(format!(
            "{what}: no answer within {}",
            humantime(REQUEST_TIMEOUT)
        )),
    }
}

pub(crate) fn humantime(d: Duration) -> String {
    humantime_serde::re::humantime::format_duration(d).to_string()
}

/// An etcd client's error with its causes: a refused TLS handshake is told only by the
/// innermost one.
pub(crate) fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let mut text = status.message().to_string();
            if let Some(source) = std::error::Error::source(status) {
                let more = chain(source);
                // tonic's message is often the source's first words: say them once.
                if more.starts_with(&text) {
                    text = more;
                } else if !text.contains(&more) {
                    text = format!("{text}: {more}");
                }
            }
            format!("{:?}: {text}", status.code())
        }
        etcd_client::Error::TransportError(e) => chain(e),
        other => other.to_string(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Kvstore {
    /// The kvstore of `node` as `cfg` says: inactive unless `kvstore: etcd`, which needs
    /// endpoints (with their TLS files readable and consistent, see `etcd_config`) and a node
    /// name. Nothing is contacted until [`run`](Self::run)'s loops or a request.
    pub fn new(cfg: KvstoreConfig, node: Option<String>) -> Result<Arc<Kvstore>, String> {
        let mut access = EtcdAccess::default();
        let node = match cfg.kvstore {
            KvstoreKind::None => node.unwrap_or_default(),
            KvstoreKind::Etcd => {
                access = EtcdAccess::from_config(&cfg)?;
                if cfg.kvstore_lease_ttl < Duration::from_secs(2) {
                    return Err(format!(
                        "kvstore-lease-ttl {} is below etcd's minimum of 2s",
                        humantime(cfg.kvstore_lease_ttl)
                    ));
                }
                match node {
                    Some(n) if !n.is_empty() && !n.contains('/') => n,
                    Some(n) => {
                        return Err(format!(
                            "kvstore: the node name {n:?} cannot be part of a key"
                        ));
                    }
                    None => {
                        return Err("kvstore: etcd needs a node name (Kubernetes mode)".into());
                    }
                }
            }
        };
        Ok(Arc::new(Kvstore {
            cfg,
            access,
            node,
            suffix: OnceLock::new(),
            early_uses: Mutex::default(),
            refused: watch::channel(None).0,
            client: OnceCell::new(),
            lease: watch::channel(None).0,
            owned: Mutex::default(),
            owned_changed: Notify::new(),
            nonce: AtomicU64::new(0),
            status: Mutex::default(),
            identities: Mirror::new(keys::IDENTITIES),
            ips: Mirror::new(keys::IP_PREFIX),
            nodes: Mirror::new(keys::NODES_PREFIX),
            numbers: Mutex::default(),
            first_tries: Mutex::default(),
            restored: Counter::default(),
            taken: Mutex::default(),
            taken_changes: watch::channel(0).0,
            reallocated: Counter::default(),
        }))
    }

    /// Whether `kvstore: etcd`.
    pub fn is_enabled(&self) -> bool {
        self.cfg.kvstore == KvstoreKind::Etcd
    }

    /// The configuration.
    pub fn config(&self) -> &KvstoreConfig {
        &self.cfg
    }

    /// The etcd endpoints, comma-separated.
    pub fn endpoints(&self) -> String {
        self.access.endpoints.join(",")
    }

    /// This node's name (its `nodes/v1/` key, its lock tokens).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Sets the last part of this node's `value/` keys from its address, as Cilium's agents
    /// do (`GetNodeSuffix`: its IPv4 address, else its IPv6 one), so that the keys read the
    /// same to Cilium's tools. Set once: a later address takes effect at the next start
    /// (the keys of the old one go with the old lease).
    pub fn set_node_ip(&self, addresses: &[IpAddr]) {
        let Some(ip) = addresses
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| addresses.first())
        else {
            return;
        };
        if self.suffix.set(ip.to_string()).is_err() {
            return;
        }
        let early = std::mem::take(&mut *lock(&self.early_uses));
        for (labels_key, id) in early {
            self.use_number(&labels_key, id);
        }
    }

    /// The last part of this node's `value/` keys, once its address is known.
    pub fn node_suffix(&self) -> Option<&str> {
        self.suffix.get().map(String::as_str)
    }

    /// As [`node_suffix`](Self::node_suffix), or why there is none yet.
    pub(crate) fn suffix(&self) -> Result<&str, String> {
        self.node_suffix().ok_or_else(|| {
            "this node has no address yet (its identity references in etcd end with it)".into()
        })
    }

    /// Records a use (`used`) or the end of one of `id` for `labels_key` made before the
    /// suffix is known; `false` when the suffix is known (then the caller keeps or drops the
    /// `value/` key itself).
    pub(crate) fn use_early(&self, labels_key: &str, id: u32, used: bool) -> bool {
        if self.suffix.get().is_some() {
            return false;
        }
        let mut early = lock(&self.early_uses);
        // Checked again under the lock: `set_node_ip` takes the early uses under it.
        if self.suffix.get().is_some() {
            return false;
        }
        if used {
            early.insert(labels_key.to_string(), id);
        } else if early.get(labels_key) == Some(&id) {
            early.remove(labels_key);
        }
        true
    }

    /// The session lease now, `None` while there is none.
    pub fn lease_id(&self) -> Option<i64> {
        *self.lease.borrow()
    }

    /// The session lease's changes.
    pub fn lease_changes(&self) -> watch::Receiver<Option<i64>> {
        self.lease.subscribe()
    }

    /// The number of `labels_key` as the `id/` keys say, if known here.
    pub fn known_number(&self, labels_key: &str) -> Option<u32> {
        lock(&self.numbers).get(labels_key).copied()
    }

    /// The client, built at first use (the connection itself is made, and made again, by
    /// the gRPC channel as requests need it).
    pub(crate) async fn client(&self) -> Result<Client, String> {
        self.client
            .get_or_try_init(|| async {
                let options = self
                    .access
                    .options()
                    .with_connect_timeout(REQUEST_TIMEOUT)
                    // A partition shows as a dead connection within this, not a silent watch.
                    .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
                    .with_keep_alive_while_idle(true);
                Client::connect(&self.access.endpoints, Some(options)).await
            })
            .await
            .cloned()
            .map_err(|e| format!("etcd client for {}: {}", self.endpoints(), describe(&e)))
    }

    /// Records a failed request.
    pub(crate) fn failed(&self, error: &str) {
        tracing::debug!(error, "kvstore request failed");
        let mut s = lock(&self.status);
        s.connected = Some(false);
        s.last_error = Some((error.to_string(), SystemTime::now()));
        drop(s);
        if let Some(kind) = refusal_kind(error) {
            let why = Some(Refusal {
                kind,
                why: error.to_string(),
            });
            self.refused.send_if_modified(|r| {
                let changed = r.is_none();
                *r = why;
                changed
            });
        }
    }

    /// Records an answer from etcd.
    pub(crate) fn answered(&self) {
        lock(&self.status).connected = Some(true);
        self.refused.send_if_modified(|r| r.take().is_some());
    }

    /// Why etcd refuses this node, while it does (`None` otherwise); changes each time it
    /// starts or stops refusing. Not for etcd being away: only a TLS handshake or
    /// credentials refused, which waiting does not mend.
    pub fn refusal(&self) -> watch::Receiver<Option<Refusal>> {
        self.refused.subscribe()
    }

    /// Whether the last request was answered (`None` before the first).
    pub fn connected(&self) -> Option<bool> {
        lock(&self.status).connected
    }

    /// The last error, if any.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.status)
            .last_error
            .as_ref()
            .map(|(e, _)| e.clone())
    }

    /// What `cellium status` says: `None` without a kvstore.
    pub fn note(&self) -> Option<String> {
        if !self.is_enabled() {
            return None;
        }
        let s = lock(&self.status);
        let connection = match s.connected {
            None => "connecting",
            Some(true) => "connected",
            Some(false) => "unreachable",
        };
        let lease = match self.lease_id() {
            Some(id) => format!(
                "lease {id:x} (ttl {})",
                humantime(self.cfg.kvstore_lease_ttl)
            ),
            None => "no lease".into(),
        };
        let error = match &s.last_error {
            Some((e, at)) => {
                let ago = at.elapsed().unwrap_or_default();
                format!(
                    "; last error {} ago: {e}",
                    humantime(Duration::from_secs(ago.as_secs()))
                )
            }
            None => String::new(),
        };
        Some(format!(
            "kvstore etcd {connection} at {}, {lease}, {} identities, {} ip entries, {} nodes, {} forged identity keys put back, {} identities re-allocated{error}",
            self.endpoints(),
            lock(&self.numbers).len(),
            self.ips.lock().len(),
            self.nodes.lock().len(),
            self.restored.get(),
            self.reallocated.get(),
        ))
    }

    /// Keeps `key` = `kept` on the lease (written in the background).
    pub(crate) fn keep(&self, key: String, kept: Kept) {
        let mut owned = lock(&self.owned);
        if owned.desired.get(&key) == Some(&kept) {
            return;
        }
        owned.desired.insert(key, kept);
        drop(owned);
        self.owned_changed.notify_one();
    }

    /// Stops keeping `key` while it is kept with `value`: deleted in the background, if still
    /// this node's.
    pub(crate) fn unkeep(&self, key: &str, value: &str) {
        let mut owned = lock(&self.owned);
        if owned.desired.get(key).is_some_and(|k| k.value == value) {
            owned.desired.remove(key);
            drop(owned);
            self.owned_changed.notify_one();
        }
    }

    /// Keeps exactly `entries` under `prefix`: the others under it are deleted.
    pub(crate) fn keep_all(&self, prefix: &str, entries: BTreeMap<String, Kept>) {
        let mut owned = lock(&self.owned);
        let before: BTreeMap<&String, &Kept> = owned
            .desired
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        if before.len() == entries.len() && entries.iter().all(|(k, v)| before.get(k) == Some(&v)) {
            return;
        }
        owned.desired.retain(|k, _| !k.starts_with(prefix));
        owned.desired.extend(entries);
        drop(owned);
        self.owned_changed.notify_one();
    }

    /// The labels key of `id_key` (`id/<N>`) while this node holds the number (keeps a
    /// `value/` key for it), with that `value/` key: what the `id/` key must say.
    pub(crate) fn held(&self, id_key: &str) -> Option<(String, String)> {
        lock(&self.owned).desired.iter().find_map(|(k, v)| {
            let (id, labels) = v.master.as_ref()?;
            (id == id_key).then(|| (labels.clone(), k.clone()))
        })
    }

    /// Whether `key` is one this node keeps.
    pub fn keeps(&self, key: &str) -> bool {
        lock(&self.owned).desired.contains_key(key)
    }

    /// Records that `key` = `value` was written on `lease` (by an allocation's transaction).
    pub(crate) fn written(&self, key: &str, value: &str, lease: i64) {
        lock(&self.owned)
            .written
            .insert(key.to_string(), (value.to_string(), lease));
    }

    /// A token naming this node and lease, unique in this process: a lock holder's value.
    pub(crate) fn token(&self, lease: i64) -> String {
        format!(
            "{}/{lease:x}/{}",
            self.node,
            self.nonce.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The loops of an enabled kvstore, until the future is dropped: the session, the kept
    /// keys, and the two mirrors.
    pub async fn run(self: Arc<Self>) {
        if !self.is_enabled() {
            return std::future::pending().await;
        }
        tokio::join!(
            self.clone().run_session(),
            self.clone().run_owned(),
            self.clone().run_mirror(Watched::Identities),
            self.clone().run_mirror(Watched::Ips),
            self.clone().run_mirror(Watched::Nodes),
        );
    }

    /// The session lease: granted, kept alive every third of its TTL, granted again when it
    /// expired (etcd away longer than the TTL); each new lease makes every kept key be
    /// written again on it.
    async fn run_session(self: Arc<Self>) {
        let ttl = self.cfg.kvstore_lease_ttl;
        let ttl_secs = ttl.as_secs().max(2) as i64;
        let mut backoff = Backoff::new();
        let mut current: Option<(i64, Instant)> = None;
        loop {
            let result: Result<(), String> = async {
                let mut client = self.client().await?;
                let id = match current {
                    Some((id, last)) if last.elapsed() < ttl => id,
                    _ => {
                        let granted =
                            timed("granting the lease", client.lease_grant(ttl_secs, None)).await?;
                        let id = granted.id();
                        current = Some((id, Instant::now()));
                        self.answered();
                        self.lease.send_replace(Some(id));
                        tracing::info!(lease = format!("{id:x}"), "kvstore session lease granted");
                        id
                    }
                };
                // Opening the stream sends the first keep-alive and reads its answer; a lease
                // etcd no longer has is refused there ("lease not found").
                let (mut keeper, mut stream) =
                    match timed("keeping the lease alive", client.lease_keep_alive(id)).await {
                        Ok(opened) => opened,
                        Err(e) if e.contains("lease not found") => {
                            current = None;
                            self.lease.send_replace(None);
                            return Err(format!("lease {id:x} expired"));
                        }
                        Err(e) => return Err(e),
                    };
                loop {
                    current = Some((id, Instant::now()));
                    self.answered();
                    backoff.reset();
                    tokio::time::sleep(ttl / 3).await;
                    timed("keeping the lease alive", keeper.keep_alive()).await?;
                    let answer = timed("keeping the lease alive", stream.message()).await?;
                    let Some(answer) = answer else {
                        return Err("the lease keep-alive stream ended".to_string());
                    };
                    if answer.ttl() <= 0 {
                        current = None;
                        self.lease.send_replace(None);
                        return Err(format!("lease {id:x} expired"));
                    }
                }
            }
            .await;
            if let Err(e) = result {
                self.failed(&e);
                tracing::warn!(error = %e, "kvstore session");
            }
            if current.is_some_and(|(_, last)| last.elapsed() >= ttl) {
                current = None;
                self.lease.send_replace(None);
            }
            tokio::time::sleep(backoff.next()).await;
        }
    }

    /// Writes the kept keys that are not written on the current lease, deletes those no
    /// longer kept: at every change, every new lease, and every [`OWNED_RESYNC`].
    async fn run_owned(self: Arc<Self>) {
        let mut lease_rx = self.lease.subscribe();
        let mut backoff = Backoff::new();
        loop {
            let lease = *lease_rx.borrow_and_update();
            let mut wait = OWNED_RESYNC;
            if let Some(lease) = lease {
                match self.write_owned(lease).await {
                    Ok(()) => backoff.reset(),
                    Err(e) => {
                        self.failed(&e);
                        wait = backoff.next();
                    }
                }
            }
            tokio::select! {
                _ = self.owned_changed.notified() => {}
                _ = lease_rx.changed() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn write_owned(&self, lease: i64) -> Result<(), String> {
        let (todo, gone, restore) = {
            let owned = lock(&self.owned);
            let todo: Vec<(String, Kept)> = owned
                .desired
                .iter()
                .filter(|(k, v)| owned.written.get(*k) != Some(&(v.value.clone(), lease)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let gone: Vec<(String, i64)> = owned
                .written
                .iter()
                .filter(|(k, _)| !owned.desired.contains_key(*k))
                .map(|(k, (_, l))| (k.clone(), *l))
                .collect();
            (todo, gone, owned.restore.clone())
        };
        if todo.is_empty() && gone.is_empty() && restore.is_empty() {
            return Ok(());
        }
        let mut client = self.client().await?;
        let (plain, mastered): (Vec<_>, Vec<_>) =
            todo.into_iter().partition(|(_, k)| k.master.is_none());
        for batch in plain.chunks(TXN_BATCH) {
            let ops: Vec<TxnOp> = batch
                .iter()
                .map(|(k, v)| {
                    TxnOp::put(
                        k.as_str(),
                        v.value.as_str(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                })
                .collect();
            timed(
                "writing this node's keys",
                client.txn(Txn::new().and_then(ops)),
            )
            .await?;
            self.answered();
            for (k, v) in batch {
                self.written(k, &v.value, lease);
            }
        }
        for (k, v) in mastered {
            let (id_key, labels_key) = v.master.clone().unwrap_or_default();
            let written = self
                .try_put_value(&mut client, &k, &v.value, &id_key, &labels_key, lease)
                .await?;
            if let Err(holder) = written {
                self.settle(
                    &mut client,
                    &k,
                    &v.value,
                    &id_key,
                    &labels_key,
                    &holder,
                    lease,
                )
                .await?;
            }
        }
        for (id_key, (labels_key, value_key, l)) in restore {
            // Only while this node's use of the number is still in etcd: with it there, no
            // GC freed the number, so other labels under it are a forgery.
            let txn = Txn::new()
                .when([Compare::lease(value_key.as_str(), CompareOp::Equal, l)])
                .and_then([TxnOp::put(id_key.as_str(), labels_key.as_str(), None)]);
            let r = timed("putting an identity back", client.txn(txn)).await?;
            self.answered();
            lock(&self.owned).restore.remove(&id_key);
            if r.succeeded() {
                self.restored.inc();
                tracing::warn!(
                    key = id_key,
                    labels = labels_key,
                    "an identity this node holds was rewritten with other labels; put back"
                );
            }
        }
        for (k, l) in gone {
            // Only if it is still on the lease it was written on: a key someone else wrote
            // since is theirs.
            let txn = Txn::new()
                .when([Compare::lease(k.as_str(), CompareOp::Equal, l)])
                .and_then([TxnOp::delete(k.as_str(), None)]);
            timed("deleting this node's keys", client.txn(txn)).await?;
            self.answered();
            let mut owned = lock(&self.owned);
            if !owned.desired.contains_key(&k) {
                owned.written.remove(&k);
            }
        }
        Ok(())
    }

    /// Writes `value/<labels key>/<node IP>` on `lease`, with `id/<N>` when absent (the number
    /// freed meanwhile). Refused, as `conflict: ...`, when `id/<N>` holds other labels.
    pub(crate) async fn put_value(
        &self,
        client: &mut Client,
        key: &str,
        value: &str,
        id_key: &str,
        labels_key: &str,
        lease: i64,
    ) -> Result<(), String> {
        self.try_put_value(client, key, value, id_key, labels_key, lease)
            .await?
            .map_err(|holder| format!("conflict: {id_key} holds {holder:?}, not {labels_key}"))
    }

    /// As [`put_value`](Self::put_value); when `id/<N>` holds other labels, what it holds.
    async fn try_put_value(
        &self,
        client: &mut Client,
        key: &str,
        value: &str,
        id_key: &str,
        labels_key: &str,
        lease: i64,
    ) -> Result<Result<(), String>, String> {
        let put = TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)));
        let txn = Txn::new()
            .when([Compare::create_revision(id_key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(id_key, labels_key, None), put.clone()])
            .or_else([TxnOp::get(id_key, None)]);
        let r = timed("writing an identity reference", client.txn(txn)).await?;
        self.answered();
        if !r.succeeded() {
            let holder = first_value(&r.op_responses()).unwrap_or_default();
            if holder != labels_key {
                return Ok(Err(holder));
            }
            let txn = Txn::new()
                .when([Compare::value(id_key, CompareOp::Equal, labels_key)])
                .and_then([put]);
            let r = timed("writing an identity reference", client.txn(txn)).await?;
            if !r.succeeded() {
                return Err(format!("{id_key} changed while writing {key}; retried"));
            }
        }
        self.written(key, value, lease);
        Ok(Ok(()))
    }

    /// This node's `value/` key `key` (number `value` for `labels_key`) is not on its lease and
    /// `id/<N>` holds `holder`'s labels. In one transaction: when no node has a `value/` key
    /// for `holder`, nobody took the number (a forgery): `id/<N>` is put back with this node's
    /// reference, as [`restored`](Self::restored). Else, when a node uses the number for
    /// `holder`, that node took it while this node's references were gone (a partition longer
    /// than the lease, and the GC freed the number): it is theirs, and `labels_key` gets a new
    /// number ([`number_taken`](Self::number_taken)). Anything else (the keys changed
    /// meanwhile) is looked at again at the next round.
    #[allow(clippy::too_many_arguments)]
    async fn settle(
        &self,
        client: &mut Client,
        key: &str,
        value: &str,
        id_key: &str,
        labels_key: &str,
        holder: &str,
        lease: i64,
    ) -> Result<(), String> {
        let users = keys::value_prefix(holder);
        let txn = Txn::new()
            .when([
                Compare::value(id_key, CompareOp::Equal, holder),
                Compare::create_revision(users.as_str(), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([
                TxnOp::put(id_key, labels_key, None),
                TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
            ])
            .or_else([
                TxnOp::get(
                    users.as_str(),
                    Some(GetOptions::new().with_prefix().with_limit(1)),
                ),
                TxnOp::get(id_key, None),
            ]);
        let r = timed("settling an identity reference", client.txn(txn)).await?;
        self.answered();
        if r.succeeded() {
            self.written(key, value, lease);
            self.restored.inc();
            tracing::warn!(
                key = id_key,
                labels = labels_key,
                forged = holder,
                "an identity this node holds was rewritten with labels no node uses; put back"
            );
            return Ok(());
        }
        let responses = r.op_responses();
        let user = responses
            .first()
            .and_then(|r| first_value(std::slice::from_ref(r)));
        let now = responses
            .get(1)
            .and_then(|r| first_value(std::slice::from_ref(r)));
        match (user, now) {
            (Some(user), Some(now)) if user == value && now == holder => {
                self.number_taken(key, value, labels_key, holder);
            }
            (user, now) => tracing::error!(
                key,
                id_key,
                holder = now,
                holder_uses = user,
                "identity reference not written: the number holds other labels; looked at again"
            ),
        }
        Ok(())
    }

    /// Number `value` of `labels_key` (this node's reference `key`) was taken by another node
    /// for `holder`: this node stops keeping its reference, the number means `holder` from now
    /// on, and the identity cell is told to retire it (`take_retired`), so that the labels
    /// get a new number and their endpoints move to it.
    fn number_taken(&self, key: &str, value: &str, labels_key: &str, holder: &str) {
        let Ok(id) = value.parse::<u32>() else {
            return;
        };
        self.unkeep(key, value);
        {
            let mut numbers = lock(&self.numbers);
            numbers.retain(|_, n| *n != id);
            numbers.insert(holder.to_string(), id);
        }
        {
            let mut taken = lock(&self.taken);
            taken.to_retire.push((labels_key.to_string(), id));
            taken.moving.insert(labels_key.to_string(), id);
        }
        tracing::warn!(
            id,
            labels = labels_key,
            holder,
            "another node took this identity's number while this node's references were gone \
             (its lease expired); the labels get a new number"
        );
        self.taken_changes.send_modify(|n| *n += 1);
    }

    /// The numbers found taken since the last call, with the labels keys they were this
    /// node's for: to be retired (`Identities::retire`).
    pub fn take_retired(&self) -> Vec<(String, u32)> {
        std::mem::take(&mut lock(&self.taken).to_retire)
    }

    /// A counter that moves whenever a number is found taken.
    pub fn taken_changes(&self) -> watch::Receiver<u64> {
        self.taken_changes.subscribe()
    }

    /// Lists `prefix` into its mirror, then watches it from the list's revision; again after
    /// any failure.
    async fn run_mirror(self: Arc<Self>, watched: Watched) {
        let identities = watched == Watched::Identities;
        let mirror = match watched {
            Watched::Identities => &self.identities,
            Watched::Ips => &self.ips,
            Watched::Nodes => &self.nodes,
        };
        let mut backoff = Backoff::new();
        loop {
            let result: Result<(), String> = async {
                let mut client = self.client().await?;
                let prefix = mirror.prefix().to_string();
                let list = timed(
                    "listing",
                    client.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
                )
                .await?;
                self.answered();
                let revision = list.header().map(|h| h.revision()).unwrap_or(0);
                let map: BTreeMap<String, String> = list
                    .kvs()
                    .iter()
                    .map(|kv| (text(kv.key()), text(kv.value())))
                    .collect();
                let changes = mirror.replace(map);
                self.seen(identities, &changes);
                let mut stream = timed(
                    "watching",
                    client.watch(
                        prefix.as_str(),
                        Some(
                            WatchOptions::new()
                                .with_prefix()
                                .with_start_revision(revision + 1),
                        ),
                    ),
                )
                .await?;
                backoff.reset();
                loop {
                    let Some(answer) = stream
                        .message()
                        .await
                        .map_err(|e| format!("watching {prefix}: {}", describe(&e)))?
                    else {
                        return Err(format!("the watch of {prefix} ended"));
                    };
                    if answer.canceled() {
                        return Err(format!(
                            "the watch of {prefix} was cancelled ({}; compacted at {})",
                            answer.cancel_reason(),
                            answer.compact_revision()
                        ));
                    }
                    let changes: Vec<Change> = answer
                        .events()
                        .iter()
                        .filter_map(|ev| {
                            let kv = ev.kv()?;
                            Some(match ev.event_type() {
                                etcd_client::EventType::Put => Change::Put {
                                    key: text(kv.key()),
                                    value: text(kv.value()),
                                },
                                etcd_client::EventType::Delete => Change::Delete {
                                    key: text(kv.key()),
                                },
                            })
                        })
                        .collect();
                    mirror.apply(&changes);
                    self.seen(identities, &changes);
                }
            }
            .await;
            if let Err(e) = result {
                self.failed(&e);
                tracing::warn!(error = %e, prefix = mirror.prefix(), "kvstore watch");
            }
            tokio::time::sleep(backoff.next()).await;
        }
    }

    /// Follows what a mirror saw: the numbers index, and this node's keys changed or deleted
    /// by someone else (forgotten as written, so the writer puts them back).
    fn seen(&self, identities: bool, changes: &[Change]) {
        let mut rewrite = false;
        {
            let mut owned = lock(&self.owned);
            for c in changes {
                let (key, value) = match c {
                    Change::Put { key, value } => (key, Some(value)),
                    Change::Delete { key } => (key, None),
                };
                if let Some((ours, _)) = owned.written.get(key)
                    && value != Some(ours)
                {
                    owned.written.remove(key);
                    rewrite = true;
                }
            }
        }
        if identities {
            for c in changes {
                if let Change::Put { key, value } = c
                    && let Some((labels, value_key)) = self.forged(key, value)
                {
                    let mut owned = lock(&self.owned);
                    if let Some((_, lease)) = owned.written.get(&value_key).cloned() {
                        owned
                            .restore
                            .insert(key.clone(), (labels, value_key, lease));
                        rewrite = true;
                    }
                }
            }
        }
        if rewrite {
            tracing::info!("kvstore keys of this node changed by someone else; writing them again");
            self.owned_changed.notify_one();
        }
        if identities {
            let mut numbers = lock(&self.numbers);
            for c in changes {
                match c {
                    // A number this node holds keeps its labels here: the forgery is put back.
                    Change::Put { key, value } if self.forged(key, value).is_some() => {}
                    Change::Put { key, value } => {
                        if let Some(id) = key
                            .strip_prefix(keys::ID_PREFIX)
                            .and_then(|n| n.parse().ok())
                        {
                            numbers.retain(|_, n| *n != id);
                            numbers.insert(value.clone(), id);
                        }
                    }
                    Change::Delete { key } => {
                        if let Some(id) = key
                            .strip_prefix(keys::ID_PREFIX)
                            .and_then(|n| n.parse::<u32>().ok())
                        {
                            numbers.retain(|_, n| *n != id);
                        }
                    }
                }
            }
        }
    }
}

impl Kvstore {
    /// For an `id/<N>` key = `value` of a number this node holds with other labels: those
    /// labels and this node's `value/` key.
    pub(crate) fn forged(&self, key: &str, value: &str) -> Option<(String, String)> {
        key.strip_prefix(keys::ID_PREFIX)?;
        self.held(key).filter(|(labels, _)| labels != value)
    }
}

/// Why etcd and this node do not talk: what was refused, and the error that told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The TLS handshake, or the user.
    pub kind: RefusalKind,
    /// The failed request's error.
    pub why: String,
}

/// What etcd (or this node) refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// A certificate: etcd's, refused by this node, or this node's, refused by etcd.
    Tls,
    /// The user name and password, or the user's rights on the keys.
    Credentials,
}

/// Whether, and how, a request failed because etcd or this client refused the other's
/// certificate, or etcd refused the credentials (as tonic, rustls and etcd tell it), rather
/// than because etcd is away. etcd's errors arrive as text through the client's status.
fn refusal_kind(error: &str) -> Option<RefusalKind> {
    let e = error.to_ascii_lowercase();
    let signs = |signs: &[&str]| signs.iter().any(|sign| e.contains(sign));
    if signs(&[
        "authentication failed",
        "invalid auth token",
        "user name is empty",
        "unauthenticated",
        "permissiondenied",
        "permission denied",
    ]) {
        Some(RefusalKind::Credentials)
    } else if signs(&["certificate", "fatal alert", "handshake", "unknownissuer"]) {
        Some(RefusalKind::Tls)
    } else {
        None
    }
}

/// The prefixes the kvstore mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watched {
    Identities,
    Ips,
    Nodes,
}

/// The value of the first key a transaction's get returned.
pub(crate) fn first_value(responses: &[TxnOpResponse]) -> Option<String> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| text(kv.value())),
        _ => None,
    })
}

/// The lease of the first key a transaction's get returned.
pub(crate) fn first_lease(responses: &[TxnOpResponse]) -> Option<i64> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
        _ => None,
    })
}

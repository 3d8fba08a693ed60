//! Identities numbered through etcd (`identity-allocation-mode: kvstore`), in Cilium's layout.
//!
//! A label set's number, in order:
//! 1. known here: an `id/<N>` key holding its labels key was seen by the watch (no request;
//!    this node's use is recorded in the background, see below);
//! 2. else, in one transaction without the lock, the label set's first probe number (see
//!    `first_try`, which sends the first tries asked for at the same time in one
//!    transaction): created when absent, nobody holds the lock and no node uses the labels;
//!    taken when it already holds these labels;
//! 3. else, under the label set's lock (`locks/<labels key>`, a key created only when absent,
//!    on this node's lease, so a dead holder frees it when its lease expires): any node's
//!    `value/<labels key>/` entry; else the first number of the label set's probe sequence
//!    whose `id/<N>` is absent (created there, in the same transaction as this node's
//!    `value/` key) or already holds these labels. The transaction is the arbiter, the lock
//!    keeps two nodes from probing the same labels at once (a number freed by the GC
//!    between their probes would otherwise split them); both walk the same sequence.
//!
//! A node's use of a number is its `value/<labels key>/<node IP>` key, on its lease, kept while
//! any of its pods has the labels and written again (with `id/<N>` if that went) after etcd
//! comes back or someone deletes it. Every step is bounded by `kvstore-allocation-timeout`:
//! past it the allocation fails naming etcd and its last error, and the CNI ADD with it.

use std::sync::Arc;
use std::time::Duration;

use cellium_identity::{AllocationMode, ClusterNumbering};
use cellium_labels::Labels;
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::keys;
use crate::store::{Kept, Kvstore, first_lease, first_value, humantime, lock, timed};

/// How many numbers are tried for one label set before giving up.
const MAX_PROBES: usize = 4096;

/// The longest wait between two tries of a held lock.
const LOCK_POLL_MAX: Duration = Duration::from_millis(50);

/// The numbering over etcd, as the identity cell takes it.
#[derive(Debug)]
pub struct KvNumbering {
    kv: Arc<Kvstore>,
}

impl KvNumbering {
    /// As the identity cell takes it (a member of the numberings group).
    pub fn provide(kv: Arc<Kvstore>) -> Arc<dyn ClusterNumbering> {
        Arc::new(KvNumbering { kv })
    }
}

impl ClusterNumbering for KvNumbering {
    fn mode(&self) -> AllocationMode {
        AllocationMode::Kvstore
    }

    fn store(&self) -> Option<String> {
        self.kv
            .is_enabled()
            .then(|| format!("etcd at {}", self.kv.endpoints()))
    }

    fn number(&self, labels: &Labels) -> BoxFuture<'static, Result<u32, String>> {
        let (kv, labels) = (self.kv.clone(), labels.clone());
        async move { kv.number(&labels).await }.boxed()
    }

    fn used(&self, labels: &Labels, id: u32) {
        self.kv.use_number(&keys::labels_key(labels), id);
    }

    fn release(&self, labels: &Labels, id: u32) {
        let key = keys::labels_key(labels);
        if !self.kv.use_early(&key, id, false)
            && let Ok(suffix) = self.kv.suffix()
        {
            // Only this number's reference: the labels may have another one now.
            self.kv
                .unkeep(&keys::value_key(&key, suffix), &id.to_string());
        }
    }
}

impl Kvstore {
    /// Records this node's use of `id` for `labels_key`: its `value/` key, kept on the lease
    /// (once the node's address, the key's last part, is known).
    pub fn use_number(&self, labels_key: &str, id: u32) {
        if !self.renumbered(labels_key, id) {
            return;
        }
        if self.use_early(labels_key, id, true) {
            return;
        }
        let Ok(suffix) = self.suffix() else {
            return;
        };
        self.keep(
            keys::value_key(labels_key, suffix),
            Kept {
                value: id.to_string(),
                master: Some((keys::id_key(id), labels_key.to_string())),
            },
        );
    }

    /// Whether `id` may be used for `labels_key`: not when another node took it from them
    /// (`number_taken`). A new number for labels whose number was taken is the end of their
    /// move: counted and told, with both numbers.
    fn renumbered(&self, labels_key: &str, id: u32) -> bool {
        let mut taken = lock(&self.taken);
        match taken.moving.get(labels_key).copied() {
            Some(old) if old == id => false,
            Some(old) => {
                taken.moving.remove(labels_key);
                drop(taken);
                self.reallocated.inc();
                tracing::warn!(
                    old,
                    new = id,
                    labels = labels_key,
                    "identity re-allocated: its number was taken by another node during a partition longer than the lease"
                );
                true
            }
            None => true,
        }
    }

    /// The cluster's number of `labels`: known, found or allocated (see the module's docs),
    /// within `kvstore-allocation-timeout`.
    pub async fn number(self: &Arc<Self>, labels: &Labels) -> Result<u32, String> {
        let key = keys::labels_key(labels);
        let timeout = self.config().kvstore_allocation_timeout;
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(20);
        let mut last = String::from("no answer");
        loop {
            if let Some(id) = self.known_number(&key) {
                self.use_number(&key, id);
                return Ok(id);
            }
            match tokio::time::timeout_at(deadline, self.allocate(&key)).await {
                Ok(Ok(id)) => return Ok(id),
                Ok(Err(e)) => {
                    self.failed(&e);
                    last = e;
                }
                Err(_) => break,
            }
            if Instant::now() + delay >= deadline {
                break;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
        Err(format!(
            "no identity from etcd at {} within kvstore-allocation-timeout {}: {last}",
            self.endpoints(),
            humantime(timeout)
        ))
    }

    /// One try: the first without the lock (batched with others, `first_try`), then under
    /// the label set's lock.
    async fn allocate(self: &Arc<Self>, labels_key: &str) -> Result<u32, String> {
        self.suffix()?;
        if let Some(id) = self.first_try(labels_key).await? {
            return Ok(id);
        }
        let lease = self.lease_id().ok_or_else(|| match self.last_error() {
            Some(e) => format!("no session lease yet (etcd: {e})"),
            None => "no session lease yet".to_string(),
        })?;
        let mut client = self.client().await?;
        let token = self.lock(&mut client, labels_key, lease).await?;
        let result = self.allocate_locked(&mut client, labels_key, lease).await;
        // A lock left behind (etcd gone between the two) is freed with the lease, or taken
        // back by this node's next try.
        let unlock = Txn::new()
            .when([Compare::value(
                keys::lock_key(labels_key),
                CompareOp::Equal,
                token.as_str(),
            )])
            .and_then([TxnOp::delete(keys::lock_key(labels_key), None)]);
        if let Err(e) = timed("unlocking", client.txn(unlock)).await {
            tracing::warn!(error = e, labels = labels_key, "identity lock not released");
        }
        result
    }

    /// Takes `locks/<labels key>`: created when absent, on `lease`. Waits while another holds
    /// it (the caller's deadline bounds the wait). A lock this node left behind on this
    /// lease is taken back.
    async fn lock(
        &self,
        client: &mut Client,
        labels_key: &str,
        lease: i64,
    ) -> Result<String, String> {
        let key = keys::lock_key(labels_key);
        let token = self.token(lease);
        let mine = format!("{}/{lease:x}/", self.node());
        let mut delay = Duration::from_millis(2);
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    token.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let r = timed("locking", client.txn(txn)).await?;
            self.answered();
            if r.succeeded() {
                return Ok(token);
            }
            let responses = r.op_responses();
            if let Some(holder) = first_value(&responses)
                && holder.starts_with(&mine)
                && first_lease(&responses) == Some(lease)
            {
                return Ok(holder);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(LOCK_POLL_MAX);
        }
    }

    /// Under the lock: a number another node uses, else the first free (or already ours)
    /// number of the probe sequence.
    async fn allocate_locked(
        &self,
        client: &mut Client,
        labels_key: &str,
        lease: i64,
    ) -> Result<u32, String> {
        let users = timed(
            "looking up the labels",
            client.get(
                keys::value_prefix(labels_key),
                Some(GetOptions::new().with_prefix().with_limit(1)),
            ),
        )
        .await?;
        if let Some(id) = users
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<u32>().ok())
        {
            let value_key = keys::value_key(labels_key, self.suffix()?);
            self.put_value(
                client,
                &value_key,
                &id.to_string(),
                &keys::id_key(id),
                labels_key,
                lease,
            )
            .await?;
            self.use_number(labels_key, id);
            return Ok(id);
        }
        for id in keys::probe_sequence(labels_key).take(MAX_PROBES) {
            let (id_key, value_key) = (
                keys::id_key(id),
                keys::value_key(labels_key, self.suffix()?),
            );
            let value = id.to_string();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    id_key.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([
                    TxnOp::put(id_key.as_str(), labels_key, None),
                    TxnOp::put(
                        value_key.as_str(),
                        value.as_str(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                ])
                .or_else([TxnOp::get(id_key.as_str(), None)]);
            let r = timed("allocating", client.txn(txn)).await?;
            self.answered();
            if r.succeeded() {
                tracing::info!(id, labels = labels_key, "identity allocated in etcd");
                self.written(&value_key, &value, lease);
                self.use_number(labels_key, id);
                return Ok(id);
            }
            if first_value(&r.op_responses()).as_deref() == Some(labels_key) {
                self.put_value(client, &value_key, &value, &id_key, labels_key, lease)
                    .await?;
                self.use_number(labels_key, id);
                return Ok(id);
            }
        }
        Err(format!(
            "no free identity number for {labels_key} within {MAX_PROBES} tries"
        ))
    }
}

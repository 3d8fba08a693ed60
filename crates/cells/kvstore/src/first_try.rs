//! The first try of an allocation, without the lock, for many label sets in one etcd
//! transaction.
//!
//! A label set's first try (the module docs of `numbering` say what it checks) is a
//! transaction of its own; the first tries asked for while one is in flight go together in
//! the next: a transaction whose success branch holds each label set's transaction, nested.
//! etcd evaluates each nested transaction on its own (its compares, then its branch), so
//! they succeed or fail one by one exactly as they would apart, in one round trip and one
//! revision. A node allocating 1,000 label sets at once (a burst of new pods) then makes a
//! few dozen requests instead of 1,000. Two label sets whose first numbers are the same go in
//! different transactions: etcd refuses a transaction that may write one key twice.

use std::collections::BTreeSet;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::oneshot;

use crate::keys;
use crate::store::{Kvstore, lock, timed};

/// Most label sets in one transaction: half of etcd's default `--max-txn-ops` (128).
const BATCH_MAX: usize = 64;

/// What a first try found: the number (created or already these labels'), or `None` when
/// the caller must take the lock.
pub(crate) type Outcome = Result<Option<u32>, String>;

/// A first try waiting for its transaction.
#[derive(Debug)]
pub(crate) struct Pending {
    labels_key: String,
    reply: oneshot::Sender<Outcome>,
}

/// The first tries waiting, and whether a task is sending them.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    pending: Vec<Pending>,
    sending: bool,
}

/// One label set's first try.
struct FirstTry {
    id: u32,
    labels_key: String,
    value_key: String,
    txn: Txn,
}

impl FirstTry {
    /// The label set's first probe number, created with this node's `value/` key when it is
    /// absent, nobody holds the lock and no node has a `value/` key for the labels (so no
    /// allocation under the lock is under way or done); or, nested, this node's `value/` key
    /// alone when that number already holds these labels. Two nodes racing here agree, as the
    /// creation is atomic with those checks: the loser's nested branch takes the winner's
    /// number.
    fn new(labels_key: &str, suffix: &str, lease: i64) -> Option<FirstTry> {
        let id = keys::probe_sequence(labels_key).next()?;
        let (id_key, value_key) = (keys::id_key(id), keys::value_key(labels_key, suffix));
        let value = id.to_string();
        let put_value = TxnOp::put(
            value_key.as_str(),
            value.as_str(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let taken = Txn::new()
            .when([Compare::value(
                id_key.as_str(),
                CompareOp::Equal,
                labels_key,
            )])
            .and_then([put_value.clone()]);
        let txn = Txn::new()
            .when([
                Compare::create_revision(id_key.as_str(), CompareOp::Equal, 0),
                Compare::create_revision(keys::lock_key(labels_key), CompareOp::Equal, 0),
                // Over the prefix: true when no key is in it.
                Compare::create_revision(keys::value_prefix(labels_key), CompareOp::Equal, 0)
                    .with_prefix(),
            ])
            .and_then([TxnOp::put(id_key.as_str(), labels_key, None), put_value])
            .or_else([TxnOp::txn(taken)]);
        Some(FirstTry {
            id,
            labels_key: labels_key.to_string(),
            value_key,
            txn,
        })
    }

    /// Whether this try got its number: created (logged) or already these labels'.
    fn got(&self, response: &TxnResponse) -> bool {
        if response.succeeded() {
            tracing::info!(
                id = self.id,
                labels = self.labels_key,
                "identity allocated in etcd"
            );
            return true;
        }
        response
            .op_responses()
            .into_iter()
            .any(|op| matches!(op, TxnOpResponse::Txn(t) if t.succeeded()))
    }
}

impl Kvstore {
    /// The first try for `labels_key`, sent with the others asked for meanwhile.
    pub(crate) async fn first_try(self: &Arc<Self>, labels_key: &str) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queue = lock(&self.first_tries);
            queue.pending.push(Pending {
                labels_key: labels_key.to_string(),
                reply,
            });
            !std::mem::replace(&mut queue.sending, true)
        };
        // A task of its own: a caller giving up (its deadline) must not stop the others'.
        if start {
            tokio::spawn(self.clone().send_first_tries());
        }
        answer
            .await
            .map_err(|_| "the allocation's transaction was abandoned".to_string())?
    }

    /// Sends the waiting first tries, a transaction at a time, until none waits.
    async fn send_first_tries(self: Arc<Self>) {
        // Should this task end early (a panic), waiters must not wait on it forever.
        let mut guard = Sending {
            kv: &self,
            done: false,
        };
        loop {
            let batch = {
                let mut queue = lock(&self.first_tries);
                if queue.pending.is_empty() {
                    queue.sending = false;
                    guard.done = true;
                    return;
                }
                take_batch(&mut queue.pending)
            };
            match self.send_batch(&batch).await {
                Ok(outcomes) => {
                    for (p, got) in batch.into_iter().zip(outcomes) {
                        let _ = p.reply.send(Ok(got));
                    }
                }
                Err(e) => {
                    for p in batch {
                        let _ = p.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// One transaction for `batch`; the number each try got, in order.
    async fn send_batch(&self, batch: &[Pending]) -> Result<Vec<Option<u32>>, String> {
        let lease = self.lease_id().ok_or_else(|| match self.last_error() {
            Some(e) => format!("no session lease yet (etcd: {e})"),
            None => "no session lease yet".to_string(),
        })?;
        let suffix = self.suffix()?;
        let tries: Vec<Option<FirstTry>> = batch
            .iter()
            .map(|p| FirstTry::new(&p.labels_key, suffix, lease))
            .collect();
        let ops: Vec<TxnOp> = tries
            .iter()
            .flatten()
            .map(|t| TxnOp::txn(t.txn.clone()))
            .collect();
        let mut client = self.client().await?;
        let r = timed("allocating", client.txn(Txn::new().and_then(ops))).await?;
        self.answered();
        let mut responses = r.op_responses().into_iter();
        Ok(tries
            .iter()
            .map(|t| {
                let t = t.as_ref()?;
                let Some(TxnOpResponse::Txn(response)) = responses.next() else {
                    return None;
                };
                if !t.got(&response) {
                    return None;
                }
                self.written(&t.value_key, &t.id.to_string(), lease);
                self.use_number(&t.labels_key, t.id);
                Some(t.id)
            })
            .collect())
    }
}

/// Takes up to [`BATCH_MAX`] tries from `pending`, no two of the same labels or first
/// number; the rest wait for the next transaction, in their order.
fn take_batch(pending: &mut Vec<Pending>) -> Vec<Pending> {
    let (mut labels, mut ids) = (BTreeSet::new(), BTreeSet::new());
    let mut batch = Vec::new();
    let mut rest = Vec::new();
    for p in pending.drain(..) {
        let id = keys::probe_sequence(&p.labels_key).next();
        let fits = batch.len() < BATCH_MAX
            && !labels.contains(&p.labels_key)
            && id.is_none_or(|id| !ids.contains(&id));
        if fits {
            labels.insert(p.labels_key.clone());
            ids.extend(id);
            batch.push(p);
        } else {
            rest.push(p);
        }
    }
    *pending = rest;
    batch
}

/// Clears the queue if the sending task ends without emptying it.
struct Sending<'a> {
    kv: &'a Kvstore,
    done: bool,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = lock(&self.kv.first_tries);
            queue.sending = false;
            // Dropping the senders tells every waiter its try was abandoned.
            queue.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(labels_key: &str) -> Pending {
        Pending {
            labels_key: labels_key.to_string(),
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn a_batch_never_holds_the_same_labels_or_first_number_twice() {
        let mut queue: Vec<Pending> = (0..200)
            .map(|i| pending(&format!("k8s:app=a{i};")))
            .collect();
        queue.push(pending("k8s:app=a0;"));
        let mut batches = Vec::new();
        while !queue.is_empty() {
            batches.push(take_batch(&mut queue));
        }
        assert!(
            batches
                .iter()
                .all(|b| !b.is_empty() && b.len() <= BATCH_MAX)
        );
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 201);
        for b in &batches {
            let labels: BTreeSet<_> = b.iter().map(|p| &p.labels_key).collect();
            let ids: BTreeSet<_> = b
                .iter()
                .map(|p| keys::probe_sequence(&p.labels_key).next())
                .collect();
            assert_eq!((labels.len(), ids.len()), (b.len(), b.len()));
        }
    }
}

//! The garbage collection of identities no node uses, for the operator: an `id/<N>` key
//! with no `value/<labels key>/` key is a candidate; a candidate of the previous round that
//! is still one, unchanged, is deleted. Two rounds, so that a number allocated a moment ago
//! (its `value/` key being written) is not taken away.
//!
//! The delete is a transaction that holds only if `id/<N>` did not change since it was read
//! and no `value/<labels key>/` key exists at that moment (a compare over the prefix: every
//! key's create revision 0, which is true of an empty range). A node that starts using the
//! number after the delete writes `id/<N>` again with its `value/` key (see `put_value`).

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use crate::keys;
use crate::store::timed;

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcRound {
    /// Numbers in use (some node has a `value/` key for their labels).
    pub in_use: usize,
    /// Numbers unused for the first time: deleted next round if still unused.
    pub marked: usize,
    /// Numbers deleted.
    pub deleted: Vec<u32>,
}

/// The collector's memory between rounds: unused numbers with the revision they had.
#[derive(Debug, Default)]
pub struct IdentityGc {
    candidates: BTreeMap<u32, i64>,
}

impl IdentityGc {
    /// A collector with no candidates yet.
    pub fn new() -> IdentityGc {
        IdentityGc::default()
    }

    /// One round against etcd.
    pub async fn round(&mut self, client: &mut Client) -> Result<GcRound, String> {
        let ids = timed(
            "listing identities",
            client.get(keys::ID_PREFIX, Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let values = timed(
            "listing identity users",
            client.get(
                keys::VALUE_PREFIX,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        )
        .await?;
        // The labels keys some node uses: a value key is `value/<labels key>/<node IP>`.
        let used: BTreeSet<String> = values
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = std::str::from_utf8(kv.key()).ok()?;
                let rest = key.strip_prefix(keys::VALUE_PREFIX)?;
                Some(rest[..rest.rfind('/')?].to_string())
            })
            .collect();
        let mut round = GcRound::default();
        let mut next = BTreeMap::new();
        for kv in ids.kvs() {
            let (Ok(key), Ok(labels_key)) = (
                std::str::from_utf8(kv.key()),
                std::str::from_utf8(kv.value()),
            ) else {
                continue;
            };
            let Some(id) = key
                .strip_prefix(keys::ID_PREFIX)
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if used.contains(labels_key) {
                round.in_use += 1;
                continue;
            }
            let revision = kv.mod_revision();
            if self.candidates.get(&id) != Some(&revision) {
                next.insert(id, revision);
                round.marked += 1;
                continue;
            }
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key, CompareOp::Equal, revision),
                    Compare::create_revision(keys::value_prefix(labels_key), CompareOp::Equal, 0)
                        .with_prefix(),
                ])
                .and_then([TxnOp::delete(key, None)]);
            let r = timed("deleting an unused identity", client.txn(txn)).await?;
            if r.succeeded() {
                tracing::info!(id, labels = labels_key, "unused identity deleted from etcd");
                round.deleted.push(id);
            }
        }
        self.candidates = next;
        Ok(round)
    }
}

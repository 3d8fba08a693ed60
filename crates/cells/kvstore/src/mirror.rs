//! A prefix of etcd kept in memory: listed, then watched from the list's revision; listed
//! again after any watch failure (etcd gone, the revision compacted), so that what changed
//! meanwhile, deletions included, is seen.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

/// A change one list or watch brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `key` now holds `value`.
    Put {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// `key` is gone.
    Delete {
        /// The key.
        key: String,
    },
}

/// The keys under one prefix, as last seen.
#[derive(Debug)]
pub struct Mirror {
    prefix: String,
    map: Mutex<BTreeMap<String, String>>,
    /// Moves at every change; `synced` once a first list was applied.
    revision: watch::Sender<u64>,
    synced: watch::Sender<bool>,
}

impl Mirror {
    /// An empty mirror of `prefix`.
    pub fn new(prefix: &str) -> Mirror {
        Mirror {
            prefix: prefix.into(),
            map: Mutex::default(),
            revision: watch::channel(0).0,
            synced: watch::channel(false).0,
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The keys and values now.
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A counter that moves whenever the content does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// Whether a first list was applied.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Replaces the content with a full list; returns the changes.
    pub fn replace(&self, list: BTreeMap<String, String>) -> Vec<Change> {
        let mut map = self.lock();
        let mut changes = Vec::new();
        for key in map.keys() {
            if !list.contains_key(key) {
                changes.push(Change::Delete { key: key.clone() });
            }
        }
        for (key, value) in &list {
            if map.get(key) != Some(value) {
                changes.push(Change::Put {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        *map = list;
        drop(map);
        self.synced.send_replace(true);
        self.bump(!changes.is_empty());
        changes
    }

    /// Applies watch events.
    pub fn apply(&self, changes: &[Change]) {
        let mut map = self.lock();
        for c in changes {
            match c {
                Change::Put { key, value } => {
                    map.insert(key.clone(), value.clone());
                }
                Change::Delete { key } => {
                    map.remove(key);
                }
            }
        }
        drop(map);
        self.bump(!changes.is_empty());
    }

    fn bump(&self, changed: bool) {
        if changed {
            self.revision.send_modify(|r| *r += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relist_reports_what_vanished_meanwhile() {
        let m = Mirror::new("p/");
        let first = m.replace(BTreeMap::from([("p/a".into(), "1".into())]));
        assert_eq!(first.len(), 1);
        assert!(m.is_synced());
        m.apply(&[Change::Put {
            key: "p/b".into(),
            value: "2".into(),
        }]);
        let again = m.replace(BTreeMap::from([("p/b".into(), "3".into())]));
        assert_eq!(
            again,
            [
                Change::Delete { key: "p/a".into() },
                Change::Put {
                    key: "p/b".into(),
                    value: "3".into()
                }
            ]
        );
    }
}

//! The table of allocated identities: numbers, labels, references.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::sync::Arc;

use cellium_labels::Labels;

use crate::identity::{CLUSTER_IDENTITIES, Identity, LOCAL_IDENTITIES, Scope};

/// One allocated identity.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) identity: Arc<Identity>,
    /// Holders that allocated it and have not released it.
    pub(crate) refs: u64,
    /// Restored from disk and not allocated again since.
    pub(crate) restored: bool,
    /// The cluster gave the number to other labels: its labels no longer map to it (they get
    /// a new number at their next allocation), and its holders move off it.
    pub(crate) retired: bool,
}

/// The numbers of one scope and where the next search for a free one starts.
#[derive(Debug)]
pub(crate) struct Range {
    pub(crate) ids: RangeInclusive<u32>,
    /// The last number handed out: the search continues after it, so a released number is
    /// not reused at once (a datapath entry or a peer's cache may still name it).
    cursor: u32,
    /// How many numbers of the range are in use.
    used: u32,
}

impl Range {
    fn new(ids: RangeInclusive<u32>) -> Range {
        let cursor = ids.end().to_owned();
        Range {
            ids,
            cursor,
            used: 0,
        }
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.ids.end() - self.ids.start() + 1
    }
}

/// Allocated (non-reserved) identities, by number and by labels.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) by_id: BTreeMap<u32, Entry>,
    pub(crate) by_labels: HashMap<Labels, u32>,
    pub(crate) cluster: Range,
    pub(crate) local: Range,
    /// Identities other nodes use, learnt from the cluster (CiliumIdentity objects): known
    /// so that policies select their pods; never persisted, never counted.
    pub(crate) remote: BTreeMap<u32, Arc<Identity>>,
    /// Bumped at every addition or removal, so the persister knows what it wrote.
    pub(crate) generation: u64,
}

impl Default for Table {
    fn default() -> Self {
        Table::with_ranges(CLUSTER_IDENTITIES, LOCAL_IDENTITIES)
    }
}

impl Table {
    pub(crate) fn with_ranges(cluster: RangeInclusive<u32>, local: RangeInclusive<u32>) -> Table {
        Table {
            by_id: BTreeMap::new(),
            by_labels: HashMap::new(),
            cluster: Range::new(cluster),
            local: Range::new(local),
            remote: BTreeMap::new(),
            generation: 0,
        }
    }

    pub(crate) fn range(&self, scope: Scope) -> &Range {
        match scope {
            Scope::Local => &self.local,
            _ => &self.cluster,
        }
    }

    fn range_of(&mut self, id: u32) -> Option<&mut Range> {
        [&mut self.cluster, &mut self.local]
            .into_iter()
            .find(|r| r.ids.contains(&id))
    }

    /// Makes the search for a free number of `scope` continue after `id`.
    pub(crate) fn set_cursor(&mut self, scope: Scope, id: u32) {
        match scope {
            Scope::Local => self.local.cursor = id,
            _ => self.cluster.cursor = id,
        }
    }

    /// Picks the next free number of `scope` after the cursor, wrapping around.
    pub(crate) fn next_free(&mut self, scope: Scope) -> Option<u32> {
        let range = match scope {
            Scope::Local => &mut self.local,
            _ => &mut self.cluster,
        };
        let (start, end) = (*range.ids.start(), *range.ids.end());
        if range.used >= range.capacity() {
            return None;
        }
        let mut id = range.cursor;
        loop {
            id = if id >= end { start } else { id + 1 };
            if !self.by_id.contains_key(&id) {
                range.cursor = id;
                return Some(id);
            }
        }
    }

    pub(crate) fn insert(&mut self, identity: Arc<Identity>, refs: u64, restored: bool) {
        if let Some(range) = self.range_of(identity.id) {
            range.used += 1;
        }
        self.by_labels.insert(identity.labels.clone(), identity.id);
        self.by_id.insert(
            identity.id,
            Entry {
                identity,
                refs,
                restored,
                retired: false,
            },
        );
        self.generation += 1;
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<Entry> {
        let entry = self.by_id.remove(&id)?;
        if let Some(range) = self.range_of(id) {
            range.used -= 1;
        }
        // Its labels may have moved to another number meanwhile (`retire`): that one stays.
        if self.by_labels.get(&entry.identity.labels) == Some(&id) {
            self.by_labels.remove(&entry.identity.labels);
        }
        self.generation += 1;
        Some(entry)
    }

    /// Retires number `id`: its labels no longer map to it, its entry stays while referenced.
    /// Returns its labels, or `None` when no entry holds it or it was retired already.
    pub(crate) fn retire(&mut self, id: u32) -> Option<Labels> {
        let entry = self.by_id.get_mut(&id).filter(|e| !e.retired)?;
        entry.retired = true;
        let labels = entry.identity.labels.clone();
        if self.by_labels.get(&labels) == Some(&id) {
            self.by_labels.remove(&labels);
        }
        self.generation += 1;
        Some(labels)
    }

    /// What number `id` means to policy: this node's identity, unless retired and the cluster
    /// gave the number to other labels; else the cluster's.
    pub(crate) fn announced(&self, id: u32) -> Option<&Arc<Identity>> {
        let local = self.by_id.get(&id);
        match (local, self.remote.get(&id)) {
            (Some(e), Some(remote)) if e.retired => Some(remote),
            (Some(e), _) => Some(&e.identity),
            (None, remote) => remote,
        }
    }

    /// Every number with what it means to policy ([`announced`](Self::announced)).
    pub(crate) fn announced_all(&self) -> impl Iterator<Item = &Arc<Identity>> {
        let ids: std::collections::BTreeSet<u32> = self
            .by_id
            .keys()
            .chain(self.remote.keys())
            .copied()
            .collect();
        ids.into_iter().filter_map(|id| self.announced(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: u32, labels: &str) -> Arc<Identity> {
        Arc::new(Identity {
            id,
            labels: labels.parse().unwrap(),
        })
    }

    #[test]
    fn numbers_go_round_and_skip_used_ones() {
        let mut t = Table::with_ranges(256..=259, LOCAL_IDENTITIES);
        assert_eq!(t.next_free(Scope::Cluster), Some(256));
        t.insert(identity(256, "k8s:a=1"), 1, false);
        t.insert(identity(258, "k8s:a=3"), 1, false);
        assert_eq!(t.next_free(Scope::Cluster), Some(257));
        t.insert(identity(257, "k8s:a=2"), 1, false);
        assert_eq!(t.next_free(Scope::Cluster), Some(259));
        t.insert(identity(259, "k8s:a=4"), 1, false);
        assert_eq!(t.next_free(Scope::Cluster), None);
        t.remove(257);
        assert_eq!(t.next_free(Scope::Cluster), Some(257));
        assert_eq!(
            t.next_free(Scope::Local),
            Some(LOCAL_IDENTITIES.start().to_owned())
        );
        assert_eq!(t.range(Scope::Cluster).capacity(), 4);
    }

    #[test]
    fn labels_move_from_a_retired_number_to_a_new_one_and_the_old_holder_goes_alone() {
        let mut t = Table::with_ranges(256..=259, LOCAL_IDENTITIES);
        t.insert(identity(256, "k8s:a=1"), 1, false);
        t.remote.insert(256, identity(256, "k8s:a=1"));
        assert_eq!(t.retire(256), Some("k8s:a=1".parse().unwrap()));
        assert_eq!(t.retire(256), None, "retired once");
        assert!(!t.by_labels.contains_key(&"k8s:a=1".parse().unwrap()));
        // The cluster gave 256 to other labels: that is what it means to policy now.
        t.remote.insert(256, identity(256, "k8s:b=2"));
        assert_eq!(t.announced(256).unwrap().labels.to_string(), "k8s:b=2");
        // The labels' new number; the old one's last holder goes without taking them along.
        t.insert(identity(258, "k8s:a=1"), 1, false);
        assert!(t.remove(256).is_some());
        assert_eq!(t.by_labels.get(&"k8s:a=1".parse().unwrap()), Some(&258));
        assert_eq!(t.announced(258).unwrap().labels.to_string(), "k8s:a=1");
        let all: Vec<u32> = t.announced_all().map(|i| i.id).collect();
        assert_eq!(all, [256, 258]);
        assert_eq!(t.range(Scope::Cluster).used, 1);
    }
}

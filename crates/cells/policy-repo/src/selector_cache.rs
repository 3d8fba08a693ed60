//! The selector cache: each distinct peer selector's set of identities.
//!
//! A selector's set is computed once, when its first user arrives, against every identity
//! known then; afterwards each identity event only tests that identity against each cached
//! selector, so adding an identity costs one match per selector, never a recomputation of
//! everything. Entries are counted by the number of rules using them and dropped with the
//! last one.

use cellium_labels::{Labels, Selector};
use std::collections::{BTreeSet, HashMap};

/// One cached selector.
#[derive(Debug, Clone)]
pub struct CachedSelector {
    /// The selector.
    pub selector: Selector,
    /// The identities it matches.
    pub identities: BTreeSet<u32>,
    /// How many rules use it.
    pub users: usize,
}

/// The cache, keyed by selector (equal selectors have equal canonical texts: their
/// requirements are kept sorted and without duplicates). Keyed by the value, not by its text,
/// because every resolution looks up every peer of every rule that selects the endpoint:
/// hashing a selector costs less than writing it out.
#[derive(Debug, Default)]
pub struct SelectorCache {
    entries: HashMap<Selector, CachedSelector>,
    identities: HashMap<u32, Labels>,
}

impl SelectorCache {
    /// Adds a user of `selector`, computing its set when it is new. Returns whether the
    /// set of cached selectors changed.
    pub fn add_user(&mut self, selector: &Selector) -> bool {
        if let Some(e) = self.entries.get_mut(selector) {
            e.users += 1;
            return false;
        }
        let identities = self
            .identities
            .iter()
            .filter(|(_, labels)| selector.matches(labels))
            .map(|(id, _)| *id)
            .collect();
        self.entries.insert(
            selector.clone(),
            CachedSelector {
                selector: selector.clone(),
                identities,
                users: 1,
            },
        );
        true
    }

    /// Removes a user of `selector`; the entry goes with its last user.
    pub fn remove_user(&mut self, selector: &Selector) {
        if let Some(e) = self.entries.get_mut(selector) {
            e.users = e.users.saturating_sub(1);
            if e.users == 0 {
                self.entries.remove(selector);
            }
        }
    }

    /// The identities `selector` matches (empty when it is not cached).
    pub fn identities(&self, selector: &Selector) -> Option<&BTreeSet<u32>> {
        self.entries.get(selector).map(|e| &e.identities)
    }

    /// Records an identity (or its new labels). Returns whether any selector's set changed.
    pub fn identity_added(&mut self, id: u32, labels: &Labels) -> bool {
        if self.identities.get(&id) == Some(labels) {
            return false;
        }
        self.identities.insert(id, labels.clone());
        let mut changed = false;
        for e in self.entries.values_mut() {
            changed |= if e.selector.matches(labels) {
                e.identities.insert(id)
            } else {
                e.identities.remove(&id)
            };
        }
        changed
    }

    /// Forgets an identity, but only if it still has `labels` (a number may have been
    /// reused since). Returns whether any selector's set changed.
    pub fn identity_removed(&mut self, id: u32, labels: &Labels) -> bool {
        if self.identities.get(&id) != Some(labels) {
            return false;
        }
        self.identities.remove(&id);
        let mut changed = false;
        for e in self.entries.values_mut() {
            changed |= e.identities.remove(&id);
        }
        changed
    }

    /// The identities known, with their labels.
    pub fn known(&self) -> &HashMap<u32, Labels> {
        &self.identities
    }

    /// Every entry, ordered by selector text.
    pub fn entries(&self) -> Vec<(String, CachedSelector)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// How many selectors are cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> Labels {
        s.parse().unwrap()
    }

    #[test]
    fn sets_follow_identities_and_users() {
        let mut c = SelectorCache::default();
        c.identity_added(300, &l("k8s:app=web"));
        let web: Selector = Selector::from_labels(&l("k8s:app=web"));
        assert!(c.add_user(&web));
        assert!(!c.add_user(&web));
        assert_eq!(
            c.identities(&web)
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![300]
        );
        assert!(c.identity_added(301, &l("k8s:app=web,k8s:x=y")));
        assert!(!c.identity_added(302, &l("k8s:app=db")));
        assert_eq!(c.identities(&web).unwrap().len(), 2);
        assert!(
            !c.identity_removed(301, &l("k8s:app=other")),
            "labels differ: a reused number"
        );
        assert!(c.identity_removed(301, &l("k8s:app=web,k8s:x=y")));
        assert_eq!(c.entries()[0].1.users, 2);
        c.remove_user(&web);
        assert_eq!(c.len(), 1);
        c.remove_user(&web);
        assert!(c.is_empty());
    }
}

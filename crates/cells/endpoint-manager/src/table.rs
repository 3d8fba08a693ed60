//! The endpoints in memory: by id and by the runtime's key, the ids in use, one lock per key,
//! and the counter that tells consumers the set changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::locks::{KeyGuard, KeyLocks};

/// The runtime's key of an endpoint: (container id, interface name).
pub(crate) type Key = (String, String);

/// The node's endpoints in memory.
#[derive(Debug)]
pub(crate) struct Endpoints {
    table: Mutex<Table>,
    locks: KeyLocks,
    /// Bumped whenever the set of endpoints changes.
    changes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Table {
    /// Shared, so that listing (the API, every regeneration) copies pointers, not records.
    by_id: BTreeMap<u16, Arc<Endpoint>>,
    by_key: HashMap<Key, u16>,
    next_id: u16,
    /// Ids that are not handed out although no endpoint has them: ids the datapath still
    /// holds entries for that no record accounts for (a record that could not be read, a
    /// leftover the sweep could not remove). A new endpoint under such an id would inherit
    /// its policy entries.
    held: BTreeSet<u16>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints {
            table: Mutex::default(),
            locks: KeyLocks::default(),
            changes: watch::channel(0).0,
        }
    }
}

impl Endpoints {
    /// Takes a free id and records the endpoint `make` builds with it, in one step, so that
    /// two creates never get the same id.
    pub(crate) fn reserve(&self, make: impl FnOnce(u16) -> Endpoint) -> Result<Endpoint> {
        let mut table = self.table();
        let id = table.take_id()?;
        let ep = make(id);
        table.insert(ep.clone());
        Ok(ep)
    }

    /// Records `ep`, replacing the record of its id.
    pub(crate) fn insert(&self, ep: Endpoint) {
        self.table().insert(ep);
    }

    /// Changes the recorded `ep` with `f`, if its id still belongs to it (same runtime key).
    pub(crate) fn update(&self, ep: &Endpoint, f: impl FnOnce(&mut Endpoint)) {
        let mut table = self.table();
        if let Some(current) = table.by_id.get_mut(&ep.id)
            && current.key() == ep.key()
        {
            f(Arc::make_mut(current));
        }
    }

    /// Removes `ep` if its id still belongs to it (same runtime key).
    pub(crate) fn forget(&self, ep: &Endpoint) {
        let mut table = self.table();
        if table.by_id.get(&ep.id).is_some_and(|e| e.key() == ep.key()) {
            table.remove(ep.id);
        }
    }

    /// The `n` ids the next reservations will get, if no endpoint comes or goes meanwhile.
    pub(crate) fn upcoming_ids(&self, n: usize) -> Vec<u16> {
        self.table().upcoming(n)
    }

    /// Keeps `ids` from being handed out (see `Table::held`).
    pub(crate) fn hold_ids(&self, ids: impl IntoIterator<Item = u16>) {
        self.table().held.extend(ids);
    }

    /// The endpoint with `id`.
    pub(crate) fn get(&self, id: u16) -> Option<Arc<Endpoint>> {
        self.table().by_id.get(&id).cloned()
    }

    /// The endpoint of (`container_id`, `ifname`).
    pub(crate) fn find(&self, container_id: &str, ifname: &str) -> Option<Arc<Endpoint>> {
        let table = self.table();
        let id = table
            .by_key
            .get(&(container_id.to_string(), ifname.to_string()))?;
        table.by_id.get(id).cloned()
    }

    /// Every endpoint, by id.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Endpoint>> {
        self.table().by_id.values().cloned().collect()
    }

    /// Waits for and takes the lock of one key: creates, deletes and regenerations of one
    /// endpoint run one after the other.
    pub(crate) async fn lock(&self, key: Key) -> KeyGuard<'_> {
        self.locks.lock(key).await
    }

    /// Tells subscribers of [`Endpoints::changes`] to look again.
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// A receiver of the change counter.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Every mutation is a single insert or remove, so a poisoned table is consistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Table {
    fn insert(&mut self, ep: Endpoint) {
        if let Some(old) = self.by_id.get(&ep.id)
            && old.key() != ep.key()
        {
            self.by_key.remove(&old.key());
        }
        self.by_key.insert(ep.key(), ep.id);
        self.by_id.insert(ep.id, Arc::new(ep));
    }

    fn remove(&mut self, id: u16) {
        if let Some(ep) = self.by_id.remove(&id) {
            self.by_key.remove(&ep.key());
        }
    }

    /// The next free id, round-robin from the last one, so a deleted endpoint's id (and any
    /// policy entry a failed cleanup left under it) is not reused at once.
    fn take_id(&mut self) -> Result<u16> {
        let capacity = usize::from(u16::MAX);
        if self.by_id.len() + self.held.len() >= capacity {
            return Err(Error::IdsExhausted(capacity));
        }
        let id = self.free_after(self.next_id);
        self.next_id = id;
        Ok(id)
    }

    /// The first free id after `id`, round-robin; there is one (see `take_id`).
    fn free_after(&self, mut id: u16) -> u16 {
        loop {
            id = id.checked_add(1).unwrap_or(1);
            if !self.by_id.contains_key(&id) && !self.held.contains(&id) {
                return id;
            }
        }
    }

    /// The ids `take_id` would hand out next, at most `n` (fewer when fewer are free).
    fn upcoming(&self, n: usize) -> Vec<u16> {
        let free = usize::from(u16::MAX).saturating_sub(self.by_id.len() + self.held.len());
        let mut out = Vec::with_capacity(n.min(free));
        let mut id = self.next_id;
        while out.len() < n.min(free) {
            id = self.free_after(id);
            out.push(id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::endpoint;

    #[test]
    fn ids_are_round_robin_and_skip_held_ones() {
        let eps = Endpoints::default();
        eps.hold_ids([2]);
        let a = eps.reserve(|id| endpoint(id, "a")).unwrap();
        let b = eps.reserve(|id| endpoint(id, "b")).unwrap();
        assert_eq!((a.id, b.id), (1, 3), "2 is held");
        eps.forget(&a);
        let c = eps.reserve(|id| endpoint(id, "c")).unwrap();
        assert_eq!(c.id, 4, "a freed id is not reused at once");
        eps.hold_ids([6]);
        assert_eq!(
            eps.upcoming_ids(3),
            [5, 7, 8],
            "what the next reservations get"
        );
        assert_eq!(eps.reserve(|id| endpoint(id, "d")).unwrap().id, 5);
        assert_eq!(eps.find("a", "eth0"), None);
        assert_eq!(eps.find("c", "eth0").map(|e| e.id), Some(4));
    }

    #[test]
    fn forget_leaves_an_id_that_went_to_another_endpoint() {
        let eps = Endpoints::default();
        let a = eps.reserve(|id| endpoint(id, "a")).unwrap();
        eps.insert(endpoint(a.id, "other"));
        eps.forget(&a);
        assert_eq!(
            eps.get(a.id).map(|e| e.container_id.clone()),
            Some("other".into())
        );
        assert_eq!(eps.find("a", "eth0"), None);
    }
}

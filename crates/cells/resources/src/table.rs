//! A table of one kind: the current objects and a stream of their changes.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::{broadcast, watch};

use cellium_k8s_objects::{Object, ObjectKey};

/// How many unread events a subscriber may fall behind before it is told it lagged.
const EVENT_BUFFER: usize = 4096;

/// A change to a table.
#[derive(Debug, Clone)]
pub enum Event<T> {
    /// An object was created (`old` is `None`) or changed.
    Upsert {
        /// The previous version.
        old: Option<Arc<T>>,
        /// The new version.
        new: Arc<T>,
    },
    /// An object was deleted.
    Delete(Arc<T>),
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The object is new.
    Created,
    /// The object existed and differs now.
    Configured,
    /// The object existed as it is.
    Unchanged,
}

/// What a table's reader and its writer share.
#[derive(Debug)]
struct Shared<T> {
    objects: RwLock<BTreeMap<ObjectKey, Arc<T>>>,
    events: broadcast::Sender<Event<T>>,
    revision: watch::Sender<u64>,
    /// Whether the table holds its source's complete state: the record restored (standalone),
    /// or the API server's first complete list (Kubernetes mode).
    synced: watch::Sender<bool>,
}

/// The objects of one kind, keyed by namespace and name: a reader.
///
/// Readers get `Arc`s of immutable objects, so a read never blocks the writer for longer than
/// a map lookup. Changes are broadcast as [`Event`]s; a subscriber that lags behind receives
/// `RecvError::Lagged` and must re-read the table (level-triggered consumers do so anyway).
///
/// A table has exactly one [`Writer`], as a kube-runtime reflector's store has: the apply
/// path in standalone mode (a Kubernetes watcher would take it otherwise). Two writers would
/// clobber each other's objects; readers are cheap to clone and hand out.
///
/// ```
/// use cellium_resources::{Change, Namespace, Object, ObjectKey, Writer};
///
/// let mut writer = Writer::<Namespace>::default();
/// let reader = writer.as_reader();
/// let mut events = reader.subscribe();
/// let shop = Namespace::new("shop", Default::default()).unwrap();
/// assert_eq!(writer.upsert(shop), Change::Created);
/// assert!(reader.get(&ObjectKey::cluster("shop")).is_some());
/// writer.publish();
/// assert!(events.try_recv().is_ok());
/// ```
#[derive(Debug)]
pub struct Table<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Table<T> {
    fn clone(&self) -> Self {
        Table {
            shared: self.shared.clone(),
        }
    }
}

/// The one writer of a [`Table`]: it is not `Clone`, and its methods take `&mut self`, so
/// whoever holds it is the table's only source of changes.
///
/// A change is in the table (`get`, `list`) as soon as it is made, but its event and the
/// revision bump wait for [`publish`](Writer::publish): a batch of changes (the objects of one
/// applied file, across tables) is announced once it is all in, so a consumer woken by it never
/// works from half of it. A snapshot taken before `publish` may already hold changes whose
/// events follow: consumers apply events idempotently, and nothing is ever missed.
#[derive(Debug)]
pub struct Writer<T> {
    shared: Arc<Shared<T>>,
    staged: Vec<Event<T>>,
}

impl<T: Object> Default for Writer<T> {
    fn default() -> Self {
        Writer {
            shared: Arc::new(Shared {
                objects: RwLock::new(BTreeMap::new()),
                events: broadcast::channel(EVENT_BUFFER).0,
                revision: watch::channel(0).0,
                synced: watch::channel(false).0,
            }),
            staged: Vec::new(),
        }
    }
}

impl<T: Object> Writer<T> {
    /// A reader of this writer's table.
    pub fn as_reader(&self) -> Table<T> {
        Table {
            shared: self.shared.clone(),
        }
    }

    /// Creates or replaces the object with `obj`'s key.
    pub fn upsert(&mut self, obj: T) -> Change {
        let mut objects = self.shared.write();
        // One search of the map per object: a sync upserts every object of a kind.
        let (old, new, change) = match objects.entry(obj.key()) {
            Entry::Occupied(mut e) => {
                if **e.get() == obj {
                    return Change::Unchanged;
                }
                let new = Arc::new(obj);
                let old = e.insert(new.clone());
                (Some(old), new, Change::Configured)
            }
            Entry::Vacant(e) => {
                let new = Arc::new(obj);
                e.insert(new.clone());
                (None, new, Change::Created)
            }
        };
        self.staged.push(Event::Upsert { old, new });
        change
    }

    /// Deletes the object named `key`, returning it.
    pub fn delete(&mut self, key: &ObjectKey) -> Option<Arc<T>> {
        let old = self.shared.write().remove(key)?;
        self.staged.push(Event::Delete(old.clone()));
        Some(old)
    }

    /// Sends the events of the changes made since the last call, in the order they were made,
    /// and bumps the revision once per change.
    pub fn publish(&mut self) {
        for event in self.staged.drain(..) {
            self.shared.publish(event);
        }
    }

    /// The object named `key` (the writer reads what it wrote).
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.shared.read().get(key).cloned()
    }

    /// The keys of every object, ordered.
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.shared.read().keys().cloned().collect()
    }

    /// Says that the table now holds its source's complete state (see [`Table::synced`]).
    /// Call it after [`publish`](Writer::publish), so that whoever waits for it finds the
    /// events of the complete state sent.
    pub fn mark_synced(&mut self) {
        self.shared.synced.send_replace(true);
    }
}

impl<T: Object> Table<T> {
    /// The object named `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.shared.read().get(key).cloned()
    }

    /// Every object, ordered by key.
    pub fn list(&self) -> Vec<Arc<T>> {
        self.shared.read().values().cloned().collect()
    }

    /// The objects of one namespace, ordered by name.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<T>> {
        self.shared
            .read()
            .range(ObjectKey::namespaced(namespace, "")..)
            .take_while(|(k, _)| k.namespace == namespace)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// How many objects there are.
    pub fn len(&self) -> usize {
        self.shared.read().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.shared.read().is_empty()
    }

    /// The current objects and a receiver of every change after them, with no gap between.
    pub fn snapshot_and_subscribe(&self) -> (Vec<Arc<T>>, broadcast::Receiver<Event<T>>) {
        let objects = self.shared.read();
        (
            objects.values().cloned().collect(),
            self.shared.events.subscribe(),
        )
    }

    /// A receiver of every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event<T>> {
        self.shared.events.subscribe()
    }

    /// A counter that increases with every change, for consumers that only need to know
    /// that something changed.
    pub fn revision(&self) -> watch::Receiver<u64> {
        self.shared.revision.subscribe()
    }

    /// Whether the table holds its source's complete state yet (its record restored, or the
    /// API server's first complete list in): until then an object missing from it may only
    /// not have arrived, so nothing may be garbage-collected for its absence.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.shared.synced.subscribe()
    }

    /// Whether the table is [synced](Table::synced) now.
    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }
}

impl<T> Shared<T> {
    fn publish(&self, event: Event<T>) {
        // No subscriber is not an error: nobody needs to hear about the change.
        let _ = self.events.send(event);
        self.revision.send_modify(|r| *r += 1);
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<ObjectKey, Arc<T>>> {
        // Writers replace whole entries, so a poisoned map is still consistent.
        self.objects.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<ObjectKey, Arc<T>>> {
        self.objects.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Thing {
        ns: &'static str,
        name: &'static str,
        value: u32,
    }

    impl Object for Thing {
        const KIND: &'static str = "Thing";
        fn key(&self) -> ObjectKey {
            ObjectKey::namespaced(self.ns, self.name)
        }
    }

    fn thing(ns: &'static str, name: &'static str, value: u32) -> Thing {
        Thing { ns, name, value }
    }

    #[test]
    fn upserts_report_what_changed_and_publish_events() {
        let mut writer = Writer::<Thing>::default();
        let table = writer.as_reader();
        let (snapshot, mut rx) = table.snapshot_and_subscribe();
        assert!(snapshot.is_empty());
        assert_eq!(writer.upsert(thing("a", "x", 1)), Change::Created);
        assert_eq!(writer.upsert(thing("a", "x", 1)), Change::Unchanged);
        assert_eq!(writer.upsert(thing("a", "x", 2)), Change::Configured);
        assert!(writer.delete(&ObjectKey::namespaced("a", "x")).is_some());
        assert!(writer.delete(&ObjectKey::namespaced("a", "x")).is_none());
        assert!(
            rx.try_recv().is_err(),
            "nothing is announced before publish"
        );
        assert_eq!(*table.revision().borrow(), 0);
        writer.publish();
        assert!(matches!(rx.try_recv(), Ok(Event::Upsert { old: None, .. })));
        match rx.try_recv() {
            Ok(Event::Upsert {
                old: Some(old),
                new,
            }) => assert_eq!((old.value, new.value), (1, 2)),
            other => panic!("expected a change from 1 to 2, got {other:?}"),
        }
        assert!(matches!(rx.try_recv(), Ok(Event::Delete(_))));
        assert!(rx.try_recv().is_err());
        assert_eq!(*table.revision().borrow(), 3);
    }

    #[test]
    fn namespaces_are_listed_apart() {
        let mut writer = Writer::<Thing>::default();
        let table = writer.as_reader();
        for (ns, name) in [("b", "1"), ("a", "2"), ("a", "1"), ("ab", "1")] {
            writer.upsert(thing(ns, name, 0));
        }
        let names: Vec<_> = table.list_namespace("a").iter().map(|t| t.name).collect();
        assert_eq!(names, vec!["1", "2"]);
        assert_eq!(table.len(), 4);
    }
}

//! Watches: the events kept for resuming, the fan-out to open watches, and the faults.

use super::{Store, namespace_of};
use crate::error::{Error, Result};
use crate::selector::Selector;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a watch event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Deleted.
    Deleted,
}

/// One change, as kept in the history and fanned out to watches.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion this write produced.
    pub rv: u64,
    /// Index into [`KINDS`](crate::registry::KINDS).
    pub kind: usize,
    /// What happened.
    pub kind_of_change: EventType,
    /// The object after the change (the last state, for a deletion).
    pub object: Arc<Value>,
    /// The object before the change, for selector transitions.
    pub previous: Option<Arc<Value>>,
}

/// What a watch's channel carries.
#[derive(Debug)]
pub enum WatchMsg {
    /// A change to pass through the watch's filters.
    Event(Arc<Event>),
    /// History was compacted under the watch: send ERROR 410 and close.
    Expire,
    /// End the stream abruptly.
    Drop,
    /// Send a BOOKMARK at this resourceVersion.
    Bookmark(u64),
}

/// A watch just opened: the events it starts with, its id and its channel.
pub type OpenedWatch = (
    Vec<(EventType, Arc<Value>)>,
    u64,
    mpsc::UnboundedReceiver<WatchMsg>,
);

/// Who a watch is and what it wants.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// Index into [`KINDS`](crate::registry::KINDS).
    pub kind: usize,
    /// Only this namespace, or all.
    pub namespace: Option<String>,
    /// label and field selectors.
    pub selector: Selector,
}

impl WatchSpec {
    /// Whether `obj` is in the watch's view.
    pub fn sees(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| namespace_of(obj) == ns)
            && self.selector.matches(obj)
    }

    /// Turns a store event into what this watch sends, if anything: an object leaving the
    /// view is DELETED, one entering it is ADDED, as the real server does.
    pub fn translate(&self, event: &Event) -> Option<(EventType, Arc<Value>)> {
        if event.kind != self.kind {
            return None;
        }
        let now = self.sees(&event.object);
        let before = event.previous.as_deref().is_some_and(|p| self.sees(p));
        match event.kind_of_change {
            EventType::Added => now.then(|| (EventType::Added, event.object.clone())),
            EventType::Deleted => {
                (now || before).then(|| (EventType::Deleted, event.object.clone()))
            }
            EventType::Modified => match (before, now) {
                (true, true) => Some((EventType::Modified, event.object.clone())),
                (false, true) => Some((EventType::Added, event.object.clone())),
                (true, false) => Some((EventType::Deleted, event.object.clone())),
                (false, false) => None,
            },
        }
    }
}

pub(super) struct Watcher {
    id: u64,
    kind: usize,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

impl Store {
    pub(super) fn emit(
        &mut self,
        kind: usize,
        kind_of_change: EventType,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) {
        let event = Arc::new(Event {
            rv: self.rv,
            kind,
            kind_of_change,
            object,
            previous,
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // A watch whose stream is gone has dropped its receiver: forget it here.
        self.watchers
            .retain(|w| w.kind != kind || w.tx.send(WatchMsg::Event(event.clone())).is_ok());
    }

    /// Opens a watch: returns the events it starts with and its channel. `since` None means
    /// "from now, after an ADDED for every current object"; an `since` older than the history
    /// is `Err(Expired)`.
    pub fn watch(&mut self, spec: &WatchSpec, since: Option<u64>) -> Result<OpenedWatch> {
        let initial = match since {
            None => self
                .objects(spec.kind, spec.namespace.as_deref())
                .into_iter()
                .filter(|o| spec.selector.matches(o))
                .map(|o| (EventType::Added, o))
                .collect(),
            Some(rv) if rv < self.compacted => {
                return Err(Error::Expired {
                    requested: rv,
                    oldest: self.compacted,
                });
            }
            Some(rv) => {
                let start = self.history.partition_point(|e| e.rv <= rv);
                self.history
                    .range(start..)
                    .filter_map(|e| spec.translate(e))
                    .collect()
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.next_id += 1;
        let id = self.next_id;
        self.watchers.push(Watcher {
            id,
            kind: spec.kind,
            tx,
        });
        Ok((initial, id, rx))
    }

    /// Queues a BOOKMARK at the current resourceVersion behind every event already sent to
    /// watch `id`, so the bookmark never claims a version the watch has not seen.
    pub fn bookmark(&self, id: u64) {
        if let Some(w) = self.watchers.iter().find(|w| w.id == id) {
            let _ = w.tx.send(WatchMsg::Bookmark(self.rv));
        }
    }

    /// Ends every watch abruptly.
    pub fn drop_watches(&mut self) {
        for w in self.watchers.drain(..) {
            let _ = w.tx.send(WatchMsg::Drop);
        }
    }

    /// Sends every watch an ERROR 410 and forgets the history, so older versions are expired.
    pub fn expire_watches(&mut self) {
        for w in self.watchers.drain(..) {
            let _ = w.tx.send(WatchMsg::Expire);
        }
        self.history.clear();
        self.compacted = self.rv;
        self.snapshots.clear();
        self.snapshot_order.clear();
    }

    /// The oldest resourceVersion a watch may start from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::by_kind;
    use crate::selector::LabelSelector;
    use crate::store::tests_support::pod;
    use serde_json::json;

    #[test]
    fn watch_translates_selector_transitions_and_expires() {
        let mut s = Store::new(3);
        let pods = by_kind("v1", "Pod").unwrap();
        let spec = WatchSpec {
            kind: pods,
            namespace: None,
            selector: Selector {
                labels: LabelSelector::parse("app=a").unwrap(),
                ..Default::default()
            },
        };
        let created = s
            .create(pods, None, pod("p", "default", "b"), false)
            .unwrap();
        let (_, _, mut rx) = s.watch(&spec, Some(s.rv())).unwrap();
        let mut relabel = (*created).clone();
        relabel["metadata"]["labels"]["app"] = json!("a");
        let now_a = s.update(pods, None, "p", relabel, false, false).unwrap();
        let mut back = (*now_a).clone();
        back["metadata"]["labels"]["app"] = json!("b");
        s.update(pods, None, "p", back, false, false).unwrap();
        let mut seen = Vec::new();
        while let Ok(WatchMsg::Event(e)) = rx.try_recv() {
            seen.extend(spec.translate(&e).map(|(t, _)| t));
        }
        assert_eq!(seen, vec![EventType::Added, EventType::Deleted]);
        // The history holds 3 events: the first namespace creations are compacted away.
        assert!(matches!(
            s.watch(&spec, Some(1)),
            Err(Error::Expired { .. })
        ));
        s.expire_watches();
        assert!(matches!(rx.try_recv(), Ok(WatchMsg::Expire)));
        assert!(s.watch(&spec, Some(s.rv())).is_ok());
    }
}

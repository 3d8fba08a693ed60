//! The ring of the last flows and the followers fed from it.
//!
//! One lock orders everything: a flow is put in the ring and sent to followers under it, and
//! a new follower takes its copy of the ring and subscribes under it, so a follower sees
//! every flow exactly once: in the copy or from the channel, never both, never neither.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{broadcast, watch};

use crate::flow::Flow;

/// Where events were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostSource {
    /// The datapath's ring buffer was full: the agent did not read fast enough.
    Datapath,
    /// A follower's queue was full: the client did not read fast enough.
    Follower,
}

/// What followers receive.
#[derive(Debug, Clone)]
pub enum Item {
    /// A new flow.
    Flow(Arc<Flow>),
    /// Events lost in the datapath since the previous report.
    Lost(u64),
}

/// The flows kept and the counters, shared by the reader, the API and the metrics.
#[derive(Debug)]
pub struct Ring {
    inner: Mutex<Inner>,
    capacity: usize,
    seen: AtomicU64,
    lost_datapath: AtomicU64,
    lost_followers: AtomicU64,
    started: Instant,
    stopping: watch::Sender<bool>,
}

#[derive(Debug)]
struct Inner {
    flows: VecDeque<Arc<Flow>>,
    tx: broadcast::Sender<Item>,
}

/// What a new follower starts from.
#[derive(Debug)]
pub struct Subscription {
    /// The ring's flows at the moment of subscribing, oldest first.
    pub backlog: Vec<Arc<Flow>>,
    /// Every flow after those.
    pub rx: broadcast::Receiver<Item>,
    /// Becomes true when the agent stops.
    pub stopping: watch::Receiver<bool>,
}

impl Ring {
    /// A ring keeping the last `capacity` flows, whose followers may lag `queue` items.
    pub fn new(capacity: usize, queue: usize) -> Ring {
        let (tx, _) = broadcast::channel(queue.max(1));
        Ring {
            inner: Mutex::new(Inner {
                flows: VecDeque::with_capacity(capacity.max(1)),
                tx,
            }),
            capacity: capacity.max(1),
            seen: AtomicU64::new(0),
            lost_datapath: AtomicU64::new(0),
            lost_followers: AtomicU64::new(0),
            started: Instant::now(),
            stopping: watch::Sender::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `flow`, forgetting the oldest when full, and hands it to every follower.
    pub fn push(&self, flow: Flow) {
        let flow = Arc::new(flow);
        let mut inner = self.lock();
        if inner.flows.len() == self.capacity {
            inner.flows.pop_front();
        }
        inner.flows.push_back(flow.clone());
        // No follower is not an error.
        let _ = inner.tx.send(Item::Flow(flow));
        self.seen.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `n` events lost in the datapath and tells the followers.
    pub fn lost(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.lost_datapath.fetch_add(n, Ordering::Relaxed);
        let _ = self.lock().tx.send(Item::Lost(n));
    }

    /// Records `n` flows a follower skipped.
    pub fn follower_lagged(&self, n: u64) {
        self.lost_followers.fetch_add(n, Ordering::Relaxed);
    }

    /// The ring's flows and a subscription to the next ones.
    pub fn subscribe(&self) -> Subscription {
        let inner = self.lock();
        Subscription {
            backlog: inner.flows.iter().cloned().collect(),
            rx: inner.tx.subscribe(),
            stopping: self.stopping.subscribe(),
        }
    }

    /// The ring's flows, oldest first.
    pub fn flows(&self) -> Vec<Arc<Flow>> {
        self.lock().flows.iter().cloned().collect()
    }

    /// Ends every follow (they end with UNAVAILABLE, saying the agent is stopping).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// How many flows the ring holds.
    pub fn len(&self) -> usize {
        self.lock().flows.len()
    }

    /// Whether the ring holds no flow.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Flows seen since start.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }

    /// Events lost in the datapath since start (as far as this agent read the counter).
    pub fn lost_datapath(&self) -> u64 {
        self.lost_datapath.load(Ordering::Relaxed)
    }

    /// Flows followers skipped since start.
    pub fn lost_followers(&self) -> u64 {
        self.lost_followers.load(Ordering::Relaxed)
    }

    /// Since when the ring exists.
    pub fn started(&self) -> Instant {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::Enricher;
    use crate::enrich::tests::{FakeSources, event};

    fn flow(e: &mut Enricher, port: u16) -> Flow {
        let mut ev = event("10.0.0.1", "10.0.0.2");
        ev.dport = port;
        e.flow(ev)
    }

    #[test]
    fn the_ring_keeps_exactly_the_last_n() {
        let mut e = Enricher::new(Arc::new(FakeSources::default()));
        let ring = Ring::new(3, 16);
        for port in 1..=5 {
            ring.push(flow(&mut e, port));
        }
        let ports: Vec<u16> = ring.flows().iter().map(|f| f.event.dport).collect();
        assert_eq!(ports, [3, 4, 5]);
        assert_eq!((ring.len(), ring.seen()), (3, 5));
    }

    #[tokio::test]
    async fn a_follower_sees_every_flow_once_across_the_backlog_and_the_channel() {
        let mut e = Enricher::new(Arc::new(FakeSources::default()));
        let ring = Ring::new(10, 16);
        ring.push(flow(&mut e, 1));
        let mut sub = ring.subscribe();
        ring.push(flow(&mut e, 2));
        ring.lost(3);
        assert_eq!(sub.backlog.len(), 1);
        match sub.rx.recv().await.unwrap() {
            Item::Flow(f) => assert_eq!(f.event.dport, 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(sub.rx.recv().await.unwrap(), Item::Lost(3)));
        assert_eq!(ring.lost_datapath(), 3);
        ring.stop();
        assert!(*sub.stopping.borrow_and_update());
    }

    #[tokio::test]
    async fn a_slow_follower_is_told_how_many_it_skipped() {
        let mut e = Enricher::new(Arc::new(FakeSources::default()));
        let ring = Ring::new(10, 2);
        let mut sub = ring.subscribe();
        for port in 1..=5 {
            ring.push(flow(&mut e, port));
        }
        match sub.rx.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => assert_eq!(n, 3),
            other => panic!("{other:?}"),
        }
    }
}

//! Regenerating endpoints when what their identity or policy derives from changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellium_hive::{Jobs, Trigger};
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::{BroadcastStream, WatchStream};

use crate::endpoint::{Endpoint, State};
use crate::manager::EndpointManager;

/// Starts two jobs: `watch-changes` turns every policy revision, every change of the
/// NetworkPolicy ipBlock prefixes and every pod or namespace event into a trigger, and
/// `regenerate` (run only when triggered; triggers coalesce, so a burst of changes costs one
/// pass) recomputes every endpoint's labels, identity and policy and writes what differs.
pub fn regenerate_on_change(jobs: &Jobs, manager: Arc<EndpointManager>) {
    let trigger = Trigger::new();
    let signals = signals(&manager);
    let pull = trigger.clone();
    jobs.observer("watch-changes", signals, move |(), _ctx| {
        pull.trigger();
        async { Ok(()) }
    })
    .add();
    jobs.timer("regenerate", Duration::ZERO, move |ctx| {
        let manager = manager.clone();
        async move {
            let started = Instant::now();
            let (done, failed) = manager.regenerate_all().await;
            let took = started.elapsed();
            if failed == 0 {
                ctx.reporter().ok(format!(
                    "{done} endpoints at revision {} ({took:.1?})",
                    manager.policy.revision()
                ));
                Ok(())
            } else {
                Err(format!(
                    "{failed} of {} endpoints could not be regenerated",
                    done + failed
                )
                .into())
            }
        }
    })
    .trigger(trigger)
    .add();
}

/// One `()` per change anything an endpoint derives from.
fn signals(manager: &EndpointManager) -> impl Stream<Item = ()> + Send + Unpin + 'static {
    let unit = |_| ();
    futures::stream::select_all([
        WatchStream::from_changes(manager.policy.changes())
            .map(unit)
            .boxed(),
        WatchStream::from_changes(manager.policy.cidr_label_changes())
            .map(unit)
            .boxed(),
        BroadcastStream::new(manager.resources.pods.subscribe())
            .map(|_| ())
            .boxed(),
        BroadcastStream::new(manager.resources.namespaces.subscribe())
            .map(|_| ())
            .boxed(),
    ])
}

impl EndpointManager {
    /// Regenerates every ready endpoint, each under its own lock (so a concurrent create or
    /// delete of it is never undone); returns how many succeeded and failed.
    pub(crate) async fn regenerate_all(&self) -> (usize, usize) {
        let Ok(dp) = self.loader.datapath() else {
            return (0, 0);
        };
        let (mut done, mut failed) = (0, 0);
        for listed in self.snapshot() {
            let _serial = self.lock(listed.key()).await;
            let Some(ep) = self.find_shared(&listed.container_id, &listed.ifname) else {
                continue;
            };
            if ep.state != State::Ready {
                continue;
            }
            // The record is copied only when its identity must change.
            let relabelled = ep.identity == 0
                || crate::labels::of(&ep, &self.resources, &self.policy) != ep.labels;
            let result = if relabelled {
                let mut ep = Endpoint::clone(&ep);
                self.identify(&mut ep).and_then(|changed| {
                    if changed {
                        self.store.save(&ep)?;
                        self.table().insert(ep.clone());
                        tracing::info!(endpoint = %ep.describe(), identity = ep.identity, "identity changed");
                    }
                    self.enforce(&dp, &ep)
                })
            } else {
                self.enforce(&dp, &ep)
            };
            match result {
                Ok(_) => done += 1,
                Err(e) => {
                    failed += 1;
                    tracing::warn!(endpoint = %ep.describe(), error = %e, "regeneration failed");
                }
            }
        }
        (done, failed)
    }
}

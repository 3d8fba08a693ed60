//! Regenerating endpoints when what their identity or policy derives from changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellium_hive::{Jobs, Trigger};
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::{BroadcastStream, WatchStream};

use super::{Backends, EndpointManager};
use crate::endpoint::{Endpoint, State};
use crate::error::{Result, chain};

/// What one pass did.
#[derive(Debug, Default)]
pub(crate) struct Pass {
    /// Endpoints regenerated.
    pub(crate) done: usize,
    /// Endpoints that failed, described, with why.
    pub(crate) failed: Vec<(String, String)>,
}

/// Starts two jobs: `watch-changes` turns every policy revision, every change of the
/// NetworkPolicy ipBlock prefixes and every pod or namespace event into a trigger, and
/// `regenerate` (run only when triggered; triggers coalesce, so a burst of changes costs one
/// pass) recomputes every endpoint's labels, identity and policy and writes what differs.
pub(super) fn start(
    jobs: &Jobs,
    manager: Arc<EndpointManager>,
    policy: &PolicyRepository,
    resources: &Resources,
) {
    let trigger = Trigger::new();
    let pull = trigger.clone();
    jobs.observer(
        "watch-changes",
        signals(policy, resources),
        move |(), _ctx| {
            pull.trigger();
            async { Ok(()) }
        },
    )
    .add();
    jobs.timer("regenerate", Duration::ZERO, move |ctx| {
        let manager = manager.clone();
        async move {
            let started = Instant::now();
            let pass = manager.regenerate_all().await;
            let took = started.elapsed();
            if pass.failed.is_empty() {
                ctx.reporter().ok(format!(
                    "{} endpoints at revision {} ({took:.1?})",
                    pass.done,
                    manager.enforcement.revision()
                ));
                Ok(())
            } else {
                Err(format!(
                    "{} of {} endpoints could not be regenerated",
                    pass.failed.len(),
                    pass.done + pass.failed.len()
                )
                .into())
            }
        }
    })
    .trigger(trigger)
    .add();
}

/// One `()` per change of anything an endpoint derives from.
fn signals(
    policy: &PolicyRepository,
    resources: &Resources,
) -> impl Stream<Item = ()> + Send + Unpin + 'static {
    let unit = |_| ();
    futures::stream::select_all([
        WatchStream::from_changes(policy.changes())
            .map(unit)
            .boxed(),
        WatchStream::from_changes(policy.cidr_label_changes())
            .map(unit)
            .boxed(),
        BroadcastStream::new(resources.pods.subscribe())
            .map(|_| ())
            .boxed(),
        BroadcastStream::new(resources.namespaces.subscribe())
            .map(|_| ())
            .boxed(),
    ])
}

impl EndpointManager {
    /// Regenerates every ready endpoint, each under its own lock (so a concurrent create or
    /// delete of it is never undone).
    pub(crate) async fn regenerate_all(&self) -> Pass {
        let mut pass = Pass::default();
        let Ok(b) = self.backends().cloned() else {
            return pass;
        };
        for listed in self.snapshot() {
            let _serial = self.endpoints.lock(listed.key()).await;
            let Some(ep) = self.endpoints.find(&listed.container_id, &listed.ifname) else {
                continue;
            };
            if ep.state != State::Ready {
                continue;
            }
            match self.regenerate(&b, &ep) {
                Ok(()) => pass.done += 1,
                Err(e) => {
                    let why = chain(&e);
                    tracing::warn!(endpoint = %ep.describe(), error = %why, "regeneration failed");
                    pass.failed.push((ep.describe(), why));
                }
            }
        }
        pass
    }

    /// Brings one endpoint's labels, identity and enforcement up to date. The record is
    /// copied only when its identity must change.
    fn regenerate(&self, b: &Backends, ep: &Arc<Endpoint>) -> Result<()> {
        let relabelled = ep.identity == 0 || self.identity.labels(ep) != ep.labels;
        if !relabelled {
            return self.enforcement.enforce(&*b.datapath, ep).map(|_| ());
        }
        let mut ep = Endpoint::clone(ep);
        if self.identity.identify(&mut ep)? {
            // The table follows what is claimed before anything can fail: a retry must start
            // from the identity now held, or it would give back the old one twice.
            self.endpoints.insert(ep.clone());
            tracing::info!(endpoint = %ep.describe(), identity = ep.identity, "identity changed");
            self.store.save(&ep)?;
        }
        self.enforcement.enforce(&*b.datapath, &ep).map(|_| ())
    }
}

//! Spare policy maps: the `cel_policy` changes an ADD or a DEL would wait for, done beforehand
//! or afterwards by a job of their own.
//!
//! Putting an endpoint's policy map into `cel_policy`, or taking it out, waits for an RCU
//! grace period (8 to 16 ms here), which was most of an ADD and of a DEL. So the ids the next
//! endpoints will get (ids are handed out round-robin, so they are known) have an empty map
//! waiting in `cel_policy`, and a DEL retires its endpoint's map, which this job then takes
//! out. An ADD whose id has no spare (a burst larger than the spares) creates its map as
//! before; fail closed either way: an empty map allows nothing.

use std::sync::Arc;
use std::time::Duration;

use cellium_hive::Jobs;

use super::EndpointManager;
use crate::error::chain;

/// How many of the next ids have a map waiting: more than a burst of pods a node starts at
/// once, for little (an empty map is a few hundred bytes of kernel memory).
pub(crate) const SPARE_POLICY_MAPS: usize = 64;

/// Adds the `spare-policy-maps` job: at start, after the restore (which retires the maps of
/// endpoints gone), and whenever an endpoint comes or goes.
pub(crate) fn start(jobs: &Jobs, manager: Arc<EndpointManager>) {
    let trigger = manager.policy_maps.clone();
    trigger.trigger();
    jobs.timer("spare-policy-maps", Duration::ZERO, move |_ctx| {
        let manager = manager.clone();
        async move {
            manager.keep_policy_maps().await;
            Ok(())
        }
    })
    .trigger(trigger)
    .add();
}

impl EndpointManager {
    /// One pass of the job. A failure is logged, not reported as the job's health: an ADD
    /// without a spare only waits for the grace period it would have waited for anyway, and
    /// a retired map left in `cel_policy` is named by no endpoint; the next pass tries again.
    async fn keep_policy_maps(&self) {
        let Ok(b) = self.backends() else {
            return;
        };
        let datapath = b.datapath.clone();
        let spares = self.endpoints.upcoming_ids(SPARE_POLICY_MAPS);
        let kept = tokio::task::spawn_blocking(move || datapath.keep_policy_maps(&spares)).await;
        match kept {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %chain(&e), "keeping spare policy maps"),
            Err(e) => tracing::warn!(error = %e, "keeping spare policy maps"),
        }
    }
}

//! Kubernetes mode's start: the [`ApiSource`] runs, and the cells that read the tables start
//! only once every kind holds the API server's complete list.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_hive::{Hook, HookContext, Lifecycle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::feed::{API_KINDS, ApiSource, Feed};
use crate::resources::Resources;

/// How often the start says which kinds it still waits for.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Appends the `sync-from-api-server` hook: it starts the source and returns once every kind
/// is synced. Within `start-timeout`, or the start fails naming the kinds that are not: the
/// agent does not serve CNI calls from tables it knows to be incomplete. (The datapath's pinned
/// maps keep enforcing the previous state meanwhile.) The stop hook stops the source.
pub(crate) fn hook(lc: &Lifecycle, resources: Arc<Resources>, source: Arc<dyn ApiSource>) {
    let cancel = CancellationToken::new();
    let task: Arc<Mutex<Option<JoinHandle<()>>>> = Arc::default();
    let (stop_cancel, stop_task) = (cancel.clone(), task.clone());
    let server = source.server().unwrap_or_default();
    lc.append(
        Hook::new("sync-from-api-server")
            .on_start(move |ctx| async move {
                let run = source.clone().run(Feed::new(resources.clone()), cancel);
                *task.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::spawn(run));
                wait_synced(&resources, &server, &ctx).await
            })
            .on_stop(move |_| async move {
                stop_cancel.cancel();
                let handle = stop_task.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(handle) = handle {
                    let _ = handle.await;
                }
                Ok(())
            }),
    );
}

/// The kinds not synced yet.
pub(crate) fn unsynced(resources: &Resources) -> Vec<&'static str> {
    let state = resources.lock();
    API_KINDS
        .iter()
        .map(|(_, kind)| *kind)
        .filter(|kind| !state.writers.is_synced(kind))
        .collect()
}

async fn wait_synced(
    resources: &Resources,
    server: &str,
    ctx: &HookContext,
) -> Result<(), cellium_hive::BoxError> {
    // Each table signals its own sync: the start goes on as soon as the last kind is in.
    let signals: Vec<_> = {
        let state = resources.lock();
        API_KINDS
            .iter()
            .filter_map(|(_, kind)| state.writers.synced(kind))
            .collect()
    };
    let all_synced = async move {
        for mut signal in signals {
            // The table outlives the wait (`resources` is held): an error cannot happen.
            let _ = signal.wait_for(|synced| *synced).await;
        }
    };
    tokio::pin!(all_synced);
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    progress.tick().await;
    loop {
        tokio::select! {
            _ = &mut all_synced => {
                tracing::info!(server, "every kind synced from the API server");
                return Ok(());
            }
            _ = progress.tick() => {
                let missing = unsynced(resources);
                tracing::info!(server, waiting_for = ?missing, "waiting for the API server's first complete lists");
            }
            _ = ctx.cancelled() => {
                let missing = unsynced(resources);
                return Err(format!(
                    "the API server {server} did not give a complete list of {} before start-timeout; the agent does not start from incomplete tables",
                    missing.join(", ")
                ).into());
            }
        }
    }
}

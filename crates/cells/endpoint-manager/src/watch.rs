//! Keeping endpoints' labels in step with their pods and namespaces.

use std::sync::Arc;

use cellium_hive::Jobs;
use cellium_resources::Event;

use crate::labels;
use crate::manager::EndpointManager;

/// Starts the `follow-labels` job: when a pod or namespace is applied, changed or deleted,
/// the labels of the endpoints it concerns are recomputed and their records rewritten.
pub fn follow_labels(jobs: &Jobs, manager: Arc<EndpointManager>) {
    let pods = manager.resources.pods.subscribe();
    let namespaces = manager.resources.namespaces.subscribe();
    let stream = futures::stream::select(
        tokio_stream_of(pods, |e: Event<cellium_resources::Pod>| match e {
            Event::Upsert { new, .. } => new.namespace.clone(),
            Event::Delete(old) => old.namespace.clone(),
        }),
        tokio_stream_of(
            namespaces,
            |e: Event<cellium_resources::Namespace>| match e {
                Event::Upsert { new, .. } => new.name.clone(),
                Event::Delete(old) => old.name.clone(),
            },
        ),
    );
    jobs.observer(
        "follow-labels",
        stream,
        move |namespace: Option<String>, _ctx| {
            let manager = manager.clone();
            async move {
                manager.refresh_labels(namespace.as_deref()).await;
                Ok(())
            }
        },
    )
    .add();
}

/// The namespace each event concerns; `None` after lagging behind (everything is refreshed).
fn tokio_stream_of<T: Clone + Send + Sync + 'static>(
    rx: tokio::sync::broadcast::Receiver<Event<T>>,
    namespace_of: fn(Event<T>) -> String,
) -> impl futures::Stream<Item = Option<String>> + Send + Unpin {
    Box::pin(futures::stream::unfold(rx, move |mut rx| async move {
        use tokio::sync::broadcast::error::RecvError;
        match rx.recv().await {
            Ok(event) => Some((Some(namespace_of(event)), rx)),
            Err(RecvError::Lagged(_)) => Some((None, rx)),
            Err(RecvError::Closed) => None,
        }
    }))
}

impl EndpointManager {
    /// Recomputes the labels of the endpoints of `namespace` (all endpoints for `None`).
    /// Each endpoint is updated under its own lock, so a concurrent delete cannot be undone
    /// by a late write of its record.
    pub(crate) async fn refresh_labels(&self, namespace: Option<&str>) {
        for ep in self.list() {
            let Some(pod) = &ep.pod else { continue };
            if namespace.is_some_and(|ns| ns != pod.namespace) {
                continue;
            }
            let _serial = self.lock(ep.key()).await;
            let Some(mut ep) = self.find(&ep.container_id, &ep.ifname) else {
                continue;
            };
            let Some(pod) = &ep.pod else { continue };
            let fresh = labels::of_pod(&self.resources, pod);
            if fresh == ep.labels {
                continue;
            }
            ep.labels = fresh;
            if let Err(e) = self.store.save(&ep) {
                tracing::warn!(endpoint = %ep.describe(), error = %e, "saving new labels failed");
            }
            tracing::info!(endpoint = %ep.describe(), "labels updated");
            self.table().insert(ep);
        }
    }
}

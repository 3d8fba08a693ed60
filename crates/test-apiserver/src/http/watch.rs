//! WATCH responses: newline-delimited `{"type", "object"}` JSON, one chunk per event.

use super::{Body, error_response};
use crate::error::Error;
use crate::registry::KINDS;
use crate::server::ApiServer;
use crate::store::{EventType, WatchMsg, WatchSpec};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Response, StatusCode, header};
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

type Chunk = Result<Frame<Bytes>, std::io::Error>;

/// Opens a watch and answers with its stream. An expired `since` is not an HTTP error but
/// an in-stream ERROR 410: kube-runtime's watcher relists on the latter and retries the
/// same version forever on the former.
pub fn respond(
    server: &ApiServer,
    spec: WatchSpec,
    since: Option<u64>,
    options: Options,
) -> Response<Body> {
    let (opened, now) = {
        let mut store = server.store();
        (store.watch(&spec, since), store.rv())
    };
    let (tx, rx) = mpsc::channel::<Chunk>(256);
    match opened {
        Ok((initial, id, events)) => {
            let server = server.clone();
            tokio::spawn(async move {
                run(server, spec, initial, now, id, events, tx, options).await;
            });
        }
        Err(error @ Error::Expired { .. }) => {
            let _ = tx.try_send(Ok(Frame::data(error_line(&error))));
        }
        Err(other) => return error_response(&other),
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let mut response = Response::new(StreamBody::new(stream).boxed());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// What the client asked of a watch besides where to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// `timeoutSeconds`: end the stream (cleanly) after this long.
    pub timeout_seconds: Option<u64>,
    /// `allowWatchBookmarks`
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: after the initial ADDED events, a BOOKMARK annotated
    /// `k8s.io/initial-events-end` (kube-runtime's `streaming_lists` waits for it).
    pub initial_events: bool,
    /// Send `PartialObjectMetadata` instead of whole objects.
    pub metadata: bool,
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
async fn run(
    server: ApiServer,
    spec: WatchSpec,
    initial: Vec<(EventType, Arc<Value>)>,
    opened_at: u64,
    id: u64,
    mut events: mpsc::UnboundedReceiver<WatchMsg>,
    tx: mpsc::Sender<Chunk>,
    options: Options,
) {
    let Options {
        timeout_seconds,
        bookmarks,
        initial_events,
        metadata,
    } = options;
    // The version this watch has delivered up to, for the message of an expiry.
    let mut last_rv = 0u64;
    for (kind_of_change, obj) in initial {
        last_rv = last_rv.max(rv_of(&obj));
        if tx
            .send(Ok(Frame::data(event_line(kind_of_change, &obj, metadata))))
            .await
            .is_err()
        {
            return;
        }
    }
    if initial_events {
        let end = bookmark_line(spec.kind, opened_at, true);
        last_rv = opened_at;
        if tx.send(Ok(Frame::data(end))).await.is_err() {
            return;
        }
    }
    // Without timeoutSeconds a watch lasts until the client or the server ends it.
    let timeout = tokio::time::sleep(Duration::from_secs(timeout_seconds.unwrap_or(365 * 86_400)));
    tokio::pin!(timeout);
    let period = server.bookmark_interval().max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        let chunk = tokio::select! {
            _ = &mut timeout => break,
            _ = tx.closed() => break,
            _ = ticker.tick(), if bookmarks => {
                // Queued behind the events already fanned out to this watch.
                server.store().bookmark(id);
                continue;
            }
            msg = events.recv() => match msg {
                None => break,
                Some(WatchMsg::Event(event)) => match spec.translate(&event).inspect(|_| last_rv = event.rv) {
                    Some((kind_of_change, obj)) => Ok(Frame::data(event_line(kind_of_change, &obj, metadata))),
                    None => continue,
                },
                Some(WatchMsg::Bookmark(rv)) => {
                    last_rv = rv;
                    Ok(Frame::data(bookmark_line(spec.kind, rv, false)))
                }
                Some(WatchMsg::Expire) => {
                    let expired = Error::Expired { requested: last_rv, oldest: server.store().compacted() };
                    let _ = tx.send(Ok(Frame::data(error_line(&expired)))).await;
                    break;
                }
                // An error chunk makes hyper cut the connection without the final chunk.
                Some(WatchMsg::Drop) => Err(std::io::Error::other("watch dropped by fault injection")),
            },
        };
        let last = chunk.is_err();
        if tx.send(chunk).await.is_err() || last {
            break;
        }
    }
    tracing::debug!(id, "watch ended");
}

fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

fn event_line(kind_of_change: EventType, obj: &Value, metadata: bool) -> Bytes {
    let name = match kind_of_change {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    };
    let mut out = Vec::with_capacity(1024);
    let _ = write!(out, "{{\"type\":\"{name}\",\"object\":");
    let _ = if metadata {
        serde_json::to_writer(&mut out, &super::metadata_only(obj))
    } else {
        serde_json::to_writer(&mut out, obj)
    };
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn bookmark_line(kind: usize, rv: u64, initial_events_end: bool) -> Bytes {
    let k = &KINDS[kind];
    let mut obj = json!({"kind": k.kind, "apiVersion": k.api_version(), "metadata": {"resourceVersion": rv.to_string()}});
    if initial_events_end {
        obj["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    Bytes::from(format!("{}\n", json!({"type": "BOOKMARK", "object": obj})))
}

fn error_line(error: &Error) -> Bytes {
    Bytes::from(format!(
        "{}\n",
        json!({"type": "ERROR", "object": error.status()})
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_single_json_objects() {
        let line = event_line(
            EventType::Modified,
            &json!({"metadata": {"name": "a"}}),
            false,
        );
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["type"], "MODIFIED");
        assert!(line.ends_with(b"\n"));
        let pods = crate::registry::by_kind("v1", "Pod").unwrap();
        let v: Value = serde_json::from_slice(&bookmark_line(pods, 7, false)).unwrap();
        assert_eq!(
            v["object"],
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}})
        );
        let v: Value = serde_json::from_slice(&error_line(&Error::Expired {
            requested: 1,
            oldest: 5,
        }))
        .unwrap();
        assert_eq!(
            (v["type"].as_str(), v["object"]["code"].as_u64()),
            (Some("ERROR"), Some(410))
        );
        assert_eq!(v["object"]["reason"], "Expired");
    }
}

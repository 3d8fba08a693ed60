//! [`ApiServer`]: the shared store, the fault controls and the accept loop.

use crate::error::{Error, Result};
use crate::rbac::{self, Attributes, AuditEntry, User};
use crate::registry::{self, KINDS};
use crate::store::{self, Store};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Default number of events kept for watches resuming at an older resourceVersion.
pub const DEFAULT_HISTORY: usize = 100_000;

/// A test API server: the store plus fault controls. Cheap to clone (an `Arc` inside);
/// every clone is the same server.
#[derive(Clone)]
pub struct ApiServer {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    store: Mutex<Store>,
    requests: AtomicU64,
    latency: Mutex<Duration>,
    /// The next `failures` requests answer with `failure_code`.
    failures: AtomicUsize,
    failure_code: AtomicUsize,
    bookmark_interval: Mutex<Duration>,
    /// Cancelled by `stop`: the accept loop and every connection select on it.
    serving: Mutex<CancellationToken>,
    /// The listeners being served; `stop` drops them.
    listeners: Mutex<Vec<Arc<tokio::net::TcpListener>>>,
    auth: Mutex<Auth>,
}

/// Authentication and authorization ([`rbac`]), off until [`ApiServer::enable_rbac`].
#[derive(Default)]
struct Auth {
    enabled: bool,
    /// The bearer tokens issued, and whose they are.
    tokens: HashMap<String, User>,
    /// Every request a token's user made, allowed or not, in order.
    audit: Vec<AuditEntry>,
}

impl Default for ApiServer {
    fn default() -> Self {
        ApiServer::new()
    }
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, ignoring poisoning: every critical section leaves its data consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn kind_index(api_version: &str, kind: &str) -> Result<usize> {
    registry::by_kind(api_version, kind)
        .ok_or_else(|| Error::UnknownKind(format!("{api_version}, Kind={kind}")))
}

impl ApiServer {
    /// A server with every kind of [`KINDS`] registered and the namespaces `default`,
    /// `kube-system` and `kube-public`; keeps [`DEFAULT_HISTORY`] events.
    pub fn new() -> ApiServer {
        ApiServer::with_history(DEFAULT_HISTORY)
    }

    /// Like [`ApiServer::new`], keeping `events` events of history for watches.
    pub fn with_history(events: usize) -> ApiServer {
        ApiServer {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::new(events)),
                requests: AtomicU64::new(0),
                latency: Mutex::new(Duration::ZERO),
                failures: AtomicUsize::new(0),
                failure_code: AtomicUsize::new(500),
                bookmark_interval: Mutex::new(Duration::from_secs(2)),
                serving: Mutex::new(CancellationToken::new()),
                listeners: Mutex::new(Vec::new()),
                auth: Mutex::new(Auth::default()),
            }),
        }
    }

    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.inner.store)
    }

    /// Serves HTTP on `listener` (already bound, maybe inside another network namespace)
    /// until [`ApiServer::stop`]; returns at once, the work runs on the current tokio runtime.
    ///
    /// Panics outside a tokio runtime.
    pub fn serve(&self, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = Arc::new(tokio::net::TcpListener::from_std(listener)?);
        // The accept loop holds the listener only while polling it, so `stop` closes the
        // socket before it returns and the address can be bound again at once.
        let weak = Arc::downgrade(&listener);
        lock(&self.inner.listeners).push(listener);
        let token = lock(&self.inner.serving).clone();
        let server = self.clone();
        tokio::spawn(async move {
            loop {
                let accept = std::future::poll_fn(|cx| match weak.upgrade() {
                    Some(listener) => listener.poll_accept(cx).map(Some),
                    None => std::task::Poll::Ready(None),
                });
                let accepted = tokio::select! {
                    _ = token.cancelled() => break,
                    accepted = accept => accepted,
                };
                match accepted {
                    None => break,
                    Some(Ok((stream, peer))) => {
                        tracing::debug!(%peer, "connection");
                        tokio::spawn(crate::http::serve_connection(
                            server.clone(),
                            stream,
                            token.clone(),
                        ));
                    }
                    Some(Err(error)) => {
                        tracing::debug!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(())
    }

    /// Like a killed process: closes the listener and every open connection and watch at
    /// once. The store is kept, so [`ApiServer::serve`] on a new listener restarts it.
    pub fn stop(&self) {
        // Dropping the listeners closes their sockets now, as a killed process's would be.
        lock(&self.inner.listeners).clear();
        let mut serving = lock(&self.inner.serving);
        serving.cancel();
        *serving = CancellationToken::new();
        drop(serving);
        self.store().drop_watches();
    }

    /// Ends every open watch stream abruptly (the connection is cut mid-stream).
    pub fn drop_watches(&self) {
        self.store().drop_watches();
    }

    /// Every open watch gets an in-stream ERROR 410 Expired, and the history is compacted,
    /// so resuming at an older resourceVersion also gets 410.
    pub fn expire_watches(&self) {
        self.store().expire_watches();
    }

    /// Answers every request `d` later.
    pub fn set_latency(&self, d: Duration) {
        *lock(&self.inner.latency) = d;
    }

    pub(crate) fn latency(&self) -> Duration {
        *lock(&self.inner.latency)
    }

    /// The next `n` requests fail with HTTP status `code` (and a `Status` body).
    pub fn fail_requests(&self, n: usize, code: u16) {
        self.inner.failure_code.store(code.into(), Ordering::SeqCst);
        self.inner.failures.store(n, Ordering::SeqCst);
    }

    /// Takes one injected failure, if any are pending.
    pub(crate) fn take_failure(&self) -> Option<u16> {
        self.inner
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| self.inner.failure_code.load(Ordering::SeqCst) as u16)
    }

    /// How often watches that allow bookmarks get one (default 2 s).
    pub fn set_bookmark_interval(&self, d: Duration) {
        *lock(&self.inner.bookmark_interval) = d;
    }

    pub(crate) fn bookmark_interval(&self) -> Duration {
        *lock(&self.inner.bookmark_interval)
    }

    /// Turns authentication and RBAC on ([`rbac`]): from now on a request with a bearer token
    /// is authorized against the Roles, ClusterRoles and bindings in the store, and recorded.
    pub fn enable_rbac(&self) {
        lock(&self.inner.auth).enabled = true;
    }

    /// Issues a bearer token for ServiceAccount `namespace/name` (which need not exist, as
    /// with a token made by hand).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let token = format!("sa-{}", crate::util::new_uid());
        lock(&self.inner.auth)
            .tokens
            .insert(token.clone(), User::service_account(namespace, name));
        token
    }

    /// Every resource request made with a token since RBAC was enabled, allowed or not.
    pub fn audit(&self) -> Vec<AuditEntry> {
        lock(&self.inner.auth).audit.clone()
    }

    /// The user of a request: `None` (allowed everything) with RBAC off or without a token
    /// (the test's own requests), unless it impersonates someone (`Impersonate-User`, as
    /// `kubectl --as` sends: kubectl sends no token over plain HTTP); a token not issued here
    /// is refused.
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&str>,
        impersonate: Option<&str>,
    ) -> Result<Option<User>> {
        let auth = lock(&self.inner.auth);
        if !auth.enabled {
            return Ok(None);
        }
        match (authorization, impersonate) {
            (Some(header), _) => {
                let token = header.strip_prefix("Bearer ").unwrap_or("").trim();
                auth.tokens
                    .get(token)
                    .cloned()
                    .map(Some)
                    .ok_or(Error::Unauthorized)
            }
            (None, Some(name)) => Ok(Some(User::named(name))),
            (None, None) => Ok(None),
        }
    }

    /// Authorizes a request of `user` by RBAC and records it.
    pub(crate) fn authorize(&self, user: &User, attributes: Attributes) -> Result<()> {
        let allowed = rbac::allowed(&self.store(), user, &attributes);
        let refused = (!allowed).then(|| attributes.forbidden(user));
        lock(&self.inner.auth).audit.push(AuditEntry {
            user: user.name.clone(),
            attributes,
            allowed,
        });
        match refused {
            None => Ok(()),
            Some(message) => {
                tracing::info!(%message, "refused by RBAC");
                Err(Error::Forbidden(message))
            }
        }
    }

    pub(crate) fn count_request(&self) {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// How many HTTP requests were served.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Creates an object as a POST would (its `apiVersion` and `kind` pick the table;
    /// a namespaced object without a namespace goes to `default`); returns the stored object.
    pub fn create(&self, obj: Value) -> Result<Value> {
        let kind = kind_index(
            obj.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
            obj.get("kind").and_then(Value::as_str).unwrap_or(""),
        )?;
        Ok((*self.store().create(kind, None, obj, false)?).clone())
    }

    /// Creates or replaces every document of a (multi-document) YAML text, in order.
    /// A replace keeps the stored status of kinds with a status subresource.
    pub fn apply_yaml(&self, text: &str) -> Result<()> {
        for doc in serde_yaml::Deserializer::from_str(text) {
            let value: Value =
                serde::Deserialize::deserialize(doc).map_err(|e| Error::Decode(e.to_string()))?;
            if value.is_null() {
                continue;
            }
            let kind = kind_index(
                value
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                value.get("kind").and_then(Value::as_str).unwrap_or(""),
            )?;
            let mut store = self.store();
            let name = store::name_of(&value).to_string();
            let ns = match store::namespace_of(&value) {
                "" if KINDS[kind].namespaced => "default".to_string(),
                ns => ns.to_string(),
            };
            if store
                .get(kind, if KINDS[kind].namespaced { &ns } else { "" }, &name)
                .is_some()
            {
                let url_ns = KINDS[kind].namespaced.then_some(ns.as_str());
                store.update(kind, url_ns, &name, value, false, false)?;
            } else {
                store.create(kind, None, value, false)?;
            }
        }
        Ok(())
    }

    /// One object, if it exists.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let kind = registry::by_kind(api_version, kind)?;
        let ns = if KINDS[kind].namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        self.store().get(kind, ns, name).map(|o| (*o).clone())
    }

    /// Deletes an object (a namespace with everything in it), emitting DELETED events.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<()> {
        let kind = kind_index(api_version, kind)?;
        self.store()
            .delete(kind, namespace.unwrap_or("default"), name, false)
            .map(|_| ())
    }

    /// Every object of a kind, in all namespaces, ordered by namespace and name.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let Some(kind) = registry::by_kind(api_version, kind) else {
            return Vec::new();
        };
        self.store()
            .objects(kind, None)
            .into_iter()
            .map(|o| (*o).clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn direct_access() {
        let s = ApiServer::new();
        assert_eq!(s.list("v1", "Namespace").len(), 3);
        let pod = s
            .create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}))
            .unwrap();
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert!(s.get("v1", "Pod", None, "a").is_some());
        s.apply_yaml("apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {x: y}}\n---\napiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata: {name: n1}\n").unwrap();
        assert_eq!(
            s.get("v1", "Pod", Some("default"), "a").unwrap()["metadata"]["labels"]["x"],
            "y"
        );
        assert!(s.get("cilium.io/v2", "CiliumNode", None, "n1").is_some());
        s.delete("v1", "Pod", None, "a").unwrap();
        assert!(s.get("v1", "Pod", None, "a").is_none());
        assert!(matches!(
            s.delete("v1", "Pod", None, "a"),
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            s.create(json!({"apiVersion": "v1", "kind": "Nope"})),
            Err(Error::UnknownKind(_))
        ));
    }

    #[test]
    fn injected_failures_count_down() {
        let s = ApiServer::new();
        s.fail_requests(2, 503);
        assert_eq!(s.take_failure(), Some(503));
        assert_eq!(s.take_failure(), Some(503));
        assert_eq!(s.take_failure(), None);
    }
}

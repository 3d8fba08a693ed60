//! A Kubernetes API server for tests: the real HTTP protocol over an in-memory store.
//!
//! No kube-apiserver runs on our machines, so code that talks to Kubernetes is tested
//! against this one, with real clients (kube-rs, kubectl). [`ApiServer`] is the store plus
//! fault controls; [`ApiServer::serve`] speaks plain HTTP/1.1 on a listener the caller bound.
//!
//! # What it implements
//! - Kinds: core v1 namespaces, pods, services, nodes; discovery.k8s.io/v1 endpointslices;
//!   networking.k8s.io/v1 networkpolicies; coordination.k8s.io/v1 leases; cilium.io/v2
//!   ciliumnetworkpolicies, ciliumclusterwidenetworkpolicies, ciliumnodes, ciliumidentities,
//!   ciliumendpoints; what a deployment applies: v1 serviceaccounts and configmaps, apps/v1
//!   daemonsets and deployments, rbac.authorization.k8s.io/v1 roles, clusterroles and their
//!   bindings, apiextensions.k8s.io/v1 customresourcedefinitions (stored and served, run by no
//!   controller) ([`registry::KINDS`], one row each). `/status` subresources for pods,
//!   services, nodes, namespaces, CNPs, CCNPs, ciliumnodes, daemonsets, deployments and CRDs.
//! - GET, LIST (`limit`/`continue` with pages frozen at the first page's resourceVersion,
//!   `labelSelector`, `fieldSelector` on any dotted path), WATCH (`resourceVersion`,
//!   `timeoutSeconds`, `allowWatchBookmarks`, `sendInitialEvents` for kube-runtime's
//!   `streaming_lists`, selectors with ADDED/DELETED on entering and leaving the view,
//!   in-stream ERROR 410 for versions older than the bounded history).
//! - POST (`generateName`, 409 AlreadyExists, 404 for a missing namespace, `dryRun`); a
//!   create keeps a given `status` (the real server drops it), so a test can create a Pod
//!   with its IPs in one call.
//! - PUT (409 Conflict on a stale resourceVersion; the main resource keeps the status, the
//!   `/status` subresource changes only the status).
//! - PATCH: merge, JSON, strategic merge (lists merged by `name`/`port`/`containerPort`,
//!   `$patch: delete`, `$setElementOrder`), server-side apply as create-or-strategic-merge.
//! - DELETE (returns the object; `preconditions` on uid and resourceVersion; a namespace
//!   takes its objects at once) and deletecollection with selectors.
//! - `PartialObjectMetadata` answers to GET, LIST and WATCH when `Accept` asks for them
//!   (kube-rs's `Api<PartialObjectMeta<K>>`).
//! - Defaulting: Namespace `kubernetes.io/metadata.name` label; Service ClusterIPs from
//!   10.96.0.0/12 and fd00:10:96::/108, `ipFamilies`, `ipFamilyPolicy`, `type`, port
//!   `protocol` and `targetPort`; Pod container port `protocol`, `status.phase: Pending`.
//! - Discovery: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/G/V` (legacy form; kubectl
//!   asks for aggregated discovery first and falls back). Errors are `Status` objects.
//! - Faults: [`ApiServer::stop`] (like a killed process), [`ApiServer::drop_watches`],
//!   [`ApiServer::expire_watches`], [`ApiServer::set_latency`], [`ApiServer::fail_requests`];
//!   [`ApiServer::with_history`] bounds the history kept for watches (default
//!   [`DEFAULT_HISTORY`] events), [`ApiServer::set_bookmark_interval`] paces bookmarks.
//! - RBAC, when [`ApiServer::enable_rbac`] turns it on: bearer tokens of ServiceAccounts
//!   ([`ApiServer::service_account_token`]) authorized by the Roles, ClusterRoles and bindings
//!   the store holds, `403 Forbidden` as the real server words it, every decision recorded
//!   ([`ApiServer::audit`]); see [`rbac`].
//! - Every request is logged at debug level with `tracing` (method, URI, content type, status).
//!
//! # What it does not
//! No TLS; no authentication or authorization beyond [`rbac`]; no admission beyond the
//! defaulting above; no
//! finalizers or graceful deletion (deletes are immediate); no real server-side apply field
//! ownership (`managedFields` is not kept, conflicts are never reported, `force` is
//! accepted and ignored); no OpenAPI schemas (`/openapi/v3` is a stub, see below); no Table
//! output (kubectl falls back to its own printing); no protobuf; no HTTP/2; no
//! `resourceVersionMatch` or reads at an older version (LIST and `sendInitialEvents` always
//! serve the current state); no kinds beyond the table (no Endpoints, Events; a CRD registers nothing).
//!
//! # kubectl (1.32), checked by `tests/kubectl.rs`
//! With `--server=http://127.0.0.1:PORT` (and a `--cache-dir` of its own per server, since
//! kubectl caches discovery): `get` (`-o json`, `-o name`, `-w`, `ns`, `all`, short names
//! such as `cnp`), `api-resources`, `create -f` (AlreadyExists reported), `label
//! --overwrite`, `patch --type merge|json|strategic`, `apply -f` (client-side: a strategic
//! merge patch for core kinds, a JSON merge patch for the others), `apply --server-side`,
//! `delete -f`. Validation needs no flag: `/openapi/v3` is a stub that only declares the
//! `fieldValidation` parameter on every kind's PATCH, which makes kubectl leave validation
//! to the server (which accepts everything); `--validate=false` works too. `/openapi/v2` is
//! 404 and there are no schemas, so `kubectl explain` fails. `delete -f` of a file holding
//! a Namespace and its objects needs `--ignore-not-found`: the namespace takes its objects
//! at once. Output is kubectl's own (NAME, AGE): the server sends no Tables.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = cellium_test_apiserver::ApiServer::new();
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! server.serve(listener)?;
//! server.apply_yaml("apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default}\n")?;
//! // point a client at http://{addr}; later:
//! server.expire_watches();
//! # Ok(()) }
//! ```

mod defaults;
pub mod error;
mod http;
mod patch;
pub mod rbac;
pub mod registry;
mod selector;
mod server;
mod store;
mod util;

pub use error::{Error, Result};
pub use server::{ApiServer, DEFAULT_HISTORY};

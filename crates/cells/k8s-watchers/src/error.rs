//! Errors of the cell's configuration and of reaching the API server.

use std::path::PathBuf;

/// Why the cell cannot be built, or the API server cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `k8s-api-server` is not a URL.
    #[error("k8s-api-server: {url:?} is not a URL: {reason}")]
    ServerUrl {
        /// The value.
        url: String,
        /// Why.
        reason: String,
    },
    /// `k8s-kubeconfig-path` cannot be read or parsed.
    #[error("k8s-kubeconfig-path: cannot read {}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The in-cluster service account cannot be read.
    #[error("KUBERNETES_SERVICE_HOST is set, but the in-cluster credentials cannot be read")]
    InCluster(#[source] kube::config::InClusterError),
    /// The node has no name: neither `node-name`, nor `K8S_NODE_NAME`, nor a host name.
    #[error("node-name: not set, K8S_NODE_NAME is not set, and the host name cannot be read")]
    NodeName,
    /// No API server is configured: the agent runs standalone.
    #[error(
        "no API server configured (k8s-api-server, k8s-kubeconfig-path or KUBERNETES_SERVICE_HOST)"
    )]
    NotConfigured,
    /// The client cannot be built from the configuration.
    #[error("cannot build a client of the API server {server}")]
    Client {
        /// The server.
        server: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// This node's CiliumEndpoints cannot be listed.
    #[error("cannot list this node's CiliumEndpoints")]
    ListEndpoints(#[source] kube::Error),
    /// One CiliumEndpoint cannot be written or deleted.
    #[error("cannot {verb} CiliumEndpoint {namespace}/{name}")]
    WriteEndpoint {
        /// `create`, `update`, `delete` or `read`.
        verb: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why (boxed: the other variants are small).
        #[source]
        source: Box<kube::Error>,
    },
    /// A CiliumEndpoint kept changing between its read and its write.
    #[error("CiliumEndpoint {namespace}/{name} changed under every one of {attempts} writes")]
    EndpointConflicts {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// How many writes were tried.
        attempts: usize,
    },
    /// Some of a pass's writes failed; the others were made.
    #[error("{failed} of {writes} CiliumEndpoint writes failed, the first")]
    EndpointWrites {
        /// How many failed.
        failed: usize,
        /// How many were tried.
        writes: usize,
        /// The first failure.
        #[source]
        first: Box<Error>,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The operator's errors.

pub(crate) use cellium_hive::error_chain as chain;

/// What went wrong in an operator cell.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operator works only against an API server.
    #[error(
        "no API server configured: set k8s-api-server or k8s-kubeconfig-path, or run in a cluster"
    )]
    NoApiServer,
    /// A configuration value that cannot work, named by its key.
    #[error("{key}: {reason}")]
    Config {
        /// The key.
        key: &'static str,
        /// Why it cannot work.
        reason: String,
    },
    /// The API server's client could not be built.
    #[error("cannot reach the API server")]
    Client(#[source] cellium_k8s_watchers::Error),
    /// A request to the API server failed.
    #[error("{what}")]
    Api {
        /// The request, with its object: `renewing Lease kube-system/cellium-operator`.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An object the API server returned is not what its kind says.
    #[error("{what}: unexpected object")]
    Decode {
        /// The object.
        what: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A failed request, named by what it did.
    pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }

    /// Whether the API server refused a write because the object changed meanwhile (409).
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// The operator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

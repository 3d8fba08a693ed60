//! Errors of applying and deleting objects, and of the cell's configuration.

use cellium_k8s_objects::document::DocumentError;

/// Why an apply or delete changed nothing, or why the cell cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One or more documents are invalid; every one is listed.
    #[error("{} invalid document(s), nothing applied:\n{}", .0.len(), list(.0))]
    Invalid(Vec<DocumentError>),
    /// In Kubernetes mode: the text holds objects of kinds the API server owns; nothing
    /// changed.
    #[error("{origin}: the agent runs in Kubernetes mode, where the API server {server} owns {}; change them there (kubectl apply), nothing applied here", objects.join(", "))]
    OwnedByApiServer {
        /// Where the text came from.
        origin: String,
        /// The API server.
        server: String,
        /// The objects refused (`Pod default/web`).
        objects: Vec<String>,
    },
    /// In Kubernetes mode: the pod a CNI ADD names is not known, so its endpoint cannot get
    /// the labels its policy selects by.
    #[error("pod {pod}: {reason}")]
    PodUnknown {
        /// The pod.
        pod: crate::ObjectKey,
        /// Why.
        reason: String,
    },
    /// The text holds no object.
    #[error("{0}: no object found (empty text or only comments)")]
    Empty(String),
    /// The text is larger than `apply-max-bytes`; it was not read.
    #[error("{origin}: {size} bytes is more than apply-max-bytes ({limit})")]
    TooLarge {
        /// Where the text came from.
        origin: String,
        /// Its size in bytes.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The change could not be recorded in the state directory, so it was not made: the
    /// tables and the records are as they were. The source names the file and the errno.
    #[error("{origin}: cannot record the change in the state directory; nothing changed")]
    Record {
        /// Where the text came from.
        origin: String,
        /// The failed write.
        #[source]
        source: cellium_statedir::Error,
    },
    /// The request was abandoned (its client went away) before anything changed.
    #[error("cancelled before anything changed: the client went away")]
    Cancelled,
    /// The policy directory cannot be read.
    #[error("cannot read the policy directory {path}")]
    PolicyDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The `service-cidr` configuration key is not a usable range.
    #[error("service-cidr: {0}")]
    ServiceCidr(String),
    /// Another configuration key is out of range.
    #[error("{key}: {reason}")]
    Config {
        /// The key.
        key: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

impl Error {
    /// The OS error behind a failed record write (`ENOSPC`, `EROFS`, `EIO`, ...), if that is
    /// what this is.
    pub fn os_error(&self) -> Option<&std::io::Error> {
        match self {
            Error::Record {
                source: cellium_statedir::Error::Io { source, .. },
                ..
            } => Some(source),
            _ => None,
        }
    }
}

fn list(errors: &[DocumentError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Errors of applying and deleting objects, and of the cell's configuration.

use crate::document::DocumentError;

/// Why an apply or delete changed nothing, or why the cell cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One or more documents are invalid; every one is listed.
    #[error("{} invalid document(s), nothing applied:\n{}", .0.len(), list(.0))]
    Invalid(Vec<DocumentError>),
    /// The text holds no object.
    #[error("{0}: no object found (empty text or only comments)")]
    Empty(String),
    /// The `service-cidr` configuration key is not a usable range.
    #[error("service-cidr: {0}")]
    ServiceCidr(String),
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

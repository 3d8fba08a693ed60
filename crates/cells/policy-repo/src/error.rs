//! Errors of the policy repository.

use std::path::PathBuf;

/// What can go wrong in the policy repository.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy object that passed validation cannot be expressed in the rule model.
    #[error("{origin}: {reason}")]
    Translate {
        /// The object (`NetworkPolicy shop/db`).
        origin: String,
        /// Why.
        reason: String,
    },
    /// A file of the policy directory cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the policy directory was refused by apply (nothing of it changed).
    #[error("{path} not applied: {reason}")]
    Apply {
        /// The file.
        path: PathBuf,
        /// The apply error, every invalid document listed.
        reason: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Errors of the identity allocator and its table on disk.

use cellium_labels::Labels;

use crate::identity::Scope;

/// What can go wrong when allocating, restoring or persisting identities.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `identity-allocation-mode` names a store this agent does not have.
    #[error("identity-allocation-mode: {0}")]
    Mode(String),
    /// The cluster's number of these labels is not known yet (it is being asked for); retry.
    #[error("the cluster-wide number of {labels} is not known yet: {reason}")]
    Unnumbered {
        /// The labels.
        labels: Labels,
        /// Why (asking, or the store's last error).
        reason: String,
    },
    /// An identity needs at least one label.
    #[error("cannot allocate an identity for an empty label set")]
    NoLabels,
    /// The labels are all `reserved:` labels but name no reserved identity.
    #[error("no reserved identity has the labels {labels}")]
    UnknownReserved {
        /// The labels.
        labels: Labels,
    },
    /// Every number of the scope is taken.
    #[error(
        "all {capacity} {scope} identities are in use: cannot allocate one for {labels} (release identities no endpoint or policy uses)"
    )]
    Exhausted {
        /// The scope whose range is full.
        scope: Scope,
        /// How many numbers the range holds.
        capacity: u32,
        /// The labels that found no number.
        labels: Labels,
    },
    /// The state directory could not be read or written.
    #[error("cannot {op} the identity table {file}")]
    State {
        /// "read" or "write".
        op: &'static str,
        /// The file, relative to the state directory.
        file: &'static str,
        /// The underlying error.
        #[source]
        source: cellium_statedir::Error,
    },
    /// The table is not written: the one on disk could not be read, and writing would
    /// replace it.
    #[error("not writing the identity table {file}: {reason}")]
    Held {
        /// The file, relative to the state directory.
        file: &'static str,
        /// Why the file on disk must stay as it is.
        reason: String,
    },
    /// The identity table on disk is not what this version writes.
    #[error("the identity table {file} cannot be decoded")]
    Decode {
        /// The file, relative to the state directory.
        file: &'static str,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

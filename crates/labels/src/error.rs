//! Errors of label and selector parsing.

/// What can be wrong with a label, a label set or a selector given as text or data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A label's text does not parse.
    #[error("invalid label {text:?}: {reason}")]
    InvalidLabel {
        /// The text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A label set names the same key twice with different values.
    #[error("label key {key:?} appears twice in {text:?}")]
    DuplicateKey {
        /// The key, with its source.
        key: String,
        /// The whole set as given.
        text: String,
    },
    /// A selector's text does not parse.
    #[error("invalid selector {text:?}: {reason}")]
    InvalidSelector {
        /// The text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// One requirement of a selector is not valid.
    #[error("invalid selector requirement on key {key:?}: {reason}")]
    InvalidRequirement {
        /// The requirement's key as given.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

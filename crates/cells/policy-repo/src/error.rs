//! Errors of the policy repository.

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
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

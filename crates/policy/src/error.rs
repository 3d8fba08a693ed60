//! Errors of the policy model.

/// What can go wrong in the policy model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A rule that cannot be compiled into entries.
    #[error("invalid policy rule {rule}: {reason}")]
    InvalidRule {
        /// The rule, as written by `Debug`.
        rule: String,
        /// Why it cannot be compiled.
        reason: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

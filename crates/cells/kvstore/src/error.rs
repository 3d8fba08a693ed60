//! Errors of the cell.

/// What fails the cell's start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
}

/// The cell's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

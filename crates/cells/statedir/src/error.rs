//! Errors of the state directory.

use std::io;
use std::path::PathBuf;

/// What can go wrong with the state directory.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another agent holds the directory's lock.
    #[error(
        "state directory {dir} is in use by another agent ({holder}); stop it or choose another --state-dir"
    )]
    Locked {
        /// The state directory.
        dir: PathBuf,
        /// What the lock file says about its holder.
        holder: String,
    },
    /// A file system operation failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done ("create", "write", ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Something other than a directory (a symbolic link, say) stands where the state
    /// directory has a directory.
    #[error(
        "{0} is not a directory (a symbolic link?); the agent writes only into directories of its own"
    )]
    NotADirectory(PathBuf),
    /// A relative path tried to leave the state directory.
    #[error("path {0} is not a plain relative path inside the state directory")]
    OutsidePath(PathBuf),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}

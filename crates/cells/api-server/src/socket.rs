//! Creating the API socket: never world-accessible, never stealing a live agent's socket.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A live agent already answers on the path.
    #[error("another agent is already serving on {0}; stop it or choose another --api-socket")]
    InUse(PathBuf),
    /// A file system or socket call failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SocketError {
    let path = path.to_path_buf();
    move |source| SocketError::Io { op, path, source }
}

/// Binds a listener at `path` with mode 0600.
///
/// The socket is bound inside a fresh private directory, restricted, and only then renamed into
/// place, so there is no moment at which another user could connect to it. A socket left by a
/// dead agent (nobody answers) is replaced; one a live agent answers on is not.
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
        .map_err(io_err("create", parent))?;
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse(path.to_path_buf()));
        }
        fs::remove_file(path).map_err(io_err("remove stale socket", path))?;
    }
    let private = parent.join(format!(".cellium-api.{}", std::process::id()));
    let _ = fs::remove_dir_all(&private);
    DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(io_err("create", &private))?;
    let tmp = private.join("sock");
    let result = (|| {
        let listener = UnixListener::bind(&tmp).map_err(io_err("bind", &tmp))?;
        fs::set_permissions(&tmp, Permissions::from_mode(0o600)).map_err(io_err("chmod", &tmp))?;
        fs::rename(&tmp, path).map_err(io_err("rename into place", path))?;
        Ok(listener)
    })();
    let _ = fs::remove_dir_all(&private);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn the_socket_is_private_and_a_stale_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/cellium.sock");
        let first = bind(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        // A live listener is not stolen.
        let err = bind(&path).unwrap_err();
        assert!(matches!(err, SocketError::InUse(_)), "{err}");
        assert!(err.to_string().contains("cellium.sock"));
        // Once it is gone the file is stale and gets replaced.
        drop(first);
        let _second = bind(&path).unwrap();
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }
}

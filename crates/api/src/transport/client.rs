//! Connecting to the agent over its unix socket.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::handshake;

/// Where the agent serves its API unless configured otherwise (`api-socket`).
pub const DEFAULT_SOCKET: &str = "/run/cellium/cellium.sock";

/// Why a connection to the agent could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing listens on the socket: the agent is not running, or listens elsewhere.
    #[error(
        "the Cellium agent is not running at {socket}: {reason} (start it with `cellium-agent run`, or point --socket / CELLIUM_API_SOCKET at its socket)"
    )]
    NotRunning {
        /// The socket path that was tried.
        socket: PathBuf,
        /// What the kernel said.
        reason: String,
    },
    /// Something other than a socket is at the path: a configuration names the wrong path.
    #[error("{socket} is {found}, not a unix socket: point it at the agent's API socket")]
    NotASocket {
        /// The path that was tried.
        socket: PathBuf,
        /// What is there instead ("a regular file", "a directory", ...).
        found: &'static str,
    },
    /// The socket exists but this user may not open it (it is created with mode 0600).
    #[error("permission denied on {socket}: the agent's socket is readable by root only")]
    PermissionDenied {
        /// The socket path that was tried.
        socket: PathBuf,
    },
    /// Any other failure while connecting.
    #[error("cannot connect to the Cellium agent at {socket}")]
    Io {
        /// The socket path that was tried.
        socket: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The gRPC channel could not be set up over an open socket.
    #[error("cannot open a gRPC channel to the Cellium agent at {socket}")]
    Transport {
        /// The socket path that was tried.
        socket: PathBuf,
        /// The underlying error.
        #[source]
        source: tonic::transport::Error,
    },
}

/// Opens a gRPC channel to the agent listening on `socket`.
///
/// The socket is probed first so that "agent not running" is told apart from other failures;
/// the channel reconnects by itself if the agent restarts later.
pub async fn connect(socket: impl AsRef<Path>) -> Result<Channel, ConnectError> {
    open(socket.as_ref(), None).await
}

/// Opens a gRPC channel that passes the network namespace `netns` on every connection it makes
/// (see the [module docs](super)): what `Endpoints.Create` and `Endpoints.Check` need.
pub async fn connect_with_netns(
    socket: impl AsRef<Path>,
    netns: OwnedFd,
) -> Result<Channel, ConnectError> {
    open(socket.as_ref(), Some(Arc::new(netns))).await
}

async fn open(socket: &Path, netns: Option<Arc<OwnedFd>>) -> Result<Channel, ConnectError> {
    let socket = socket.to_path_buf();
    UnixStream::connect(&socket)
        .await
        .map_err(|e| probe_error(&socket, e))?;
    let path = socket.clone();
    // The URI is required by the API but unused: every connection goes to the unix socket.
    Endpoint::from_static("http://cellium.agent")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            let netns = netns.clone();
            async move {
                let stream = UnixStream::connect(path).await?;
                // Sent on each connection: the channel reconnects on its own after an agent
                // restart, and the new connection needs the namespace as much as the first.
                if let Some(netns) = &netns {
                    handshake::send(&stream, netns.as_fd()).await?;
                }
                Ok::<_, io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|source| ConnectError::Transport { socket, source })
}

fn probe_error(socket: &Path, e: io::Error) -> ConnectError {
    let socket = socket.to_path_buf();
    match e.kind() {
        io::ErrorKind::NotFound => ConnectError::NotRunning {
            socket,
            reason: "no such socket".into(),
        },
        // connect(2) refuses a path that is not a socket just as a socket nobody listens on.
        io::ErrorKind::ConnectionRefused => match not_a_socket(&socket) {
            Some(found) => ConnectError::NotASocket { socket, found },
            None => ConnectError::NotRunning {
                socket,
                reason: "connection refused (a stale socket)".into(),
            },
        },
        io::ErrorKind::PermissionDenied => ConnectError::PermissionDenied { socket },
        _ => ConnectError::Io { socket, source: e },
    }
}

/// What is at `path` when it is there and not a socket.
fn not_a_socket(path: &Path) -> Option<&'static str> {
    let kind = std::fs::metadata(path).ok()?.file_type();
    if kind.is_socket() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_file() {
        Some("a regular file")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else {
        Some("a device")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_says_the_agent_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let err = connect(dir.path().join("none.sock")).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ConnectError::NotRunning { .. }), "{text}");
        assert!(text.contains("none.sock"), "{text}");
        assert!(text.contains("not running"), "{text}");
    }

    #[tokio::test]
    async fn a_stale_socket_is_reported_as_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        // A listener that is gone leaves its file behind, as a killed agent does.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let err = connect(&path).await.unwrap_err();
        assert!(matches!(err, ConnectError::NotRunning { .. }), "{err}");
        assert!(err.to_string().contains("stale socket"), "{err}");
    }

    #[tokio::test]
    async fn a_file_or_directory_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        for (path, found) in [(file, "a regular file"), (dir.path().into(), "a directory")] {
            let err = connect(&path).await.unwrap_err();
            assert!(matches!(err, ConnectError::NotASocket { .. }), "{err}");
            assert!(err.to_string().contains(found), "{err}");
        }
    }
}

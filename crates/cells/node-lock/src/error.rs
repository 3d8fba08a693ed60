//! Errors of the node lock.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// The process holding a claim, as far as it can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder(pub Option<u32>);

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "pid {pid}"),
            None => f.write_str("pid unknown"),
        }
    }
}

/// Why the node could not be claimed. Nothing is held when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another agent runs in this network namespace.
    #[error(
        "another agent ({holder}) already runs in this network namespace: it holds the abstract socket @{name}; run one agent per node"
    )]
    NetnsTaken {
        /// The abstract socket's name.
        name: String,
        /// The other agent.
        holder: Holder,
    },
    /// Another agent serves, or is about to serve, the API socket.
    #[error(
        "API socket {path} is in use by another agent ({holder}); stop it or choose another --api-socket"
    )]
    ApiSocketTaken {
        /// The socket path.
        path: PathBuf,
        /// The other agent.
        holder: Holder,
    },
    /// Another agent uses the BPF root.
    #[error(
        "BPF root {path} is in use by another agent ({holder}); stop it or choose another --bpf-root"
    )]
    BpfRootTaken {
        /// The BPF root.
        path: PathBuf,
        /// The other agent.
        holder: Holder,
    },
    /// Mounting bpffs failed.
    #[error("mount bpffs at {path}")]
    Mount {
        /// Where.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: nix::Error,
    },
    /// Another process kept the directory bpffs is to be mounted on locked.
    #[error("mount bpffs at {path}: another process keeps the directory locked")]
    MountBusy {
        /// Where.
        path: PathBuf,
    },
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

/// The result type of the node lock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}

//! Errors of the plumbing: each says which call failed on which interface in which namespace.

use std::io;
use std::path::PathBuf;

/// A plumbing step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The network namespace could not be entered.
    #[error("cannot enter network namespace {path}")]
    Netns {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The namespace handed over cannot hold a pod.
    #[error("network namespace {path} is refused: {why}")]
    NetnsRefused {
        /// The path the runtime named it by.
        path: PathBuf,
        /// Why.
        why: crate::plumbing::netns::Refusal,
    },
    /// The name is taken in the namespace where the interface must be created.
    #[error("interface {ifname} already exists in {netns}")]
    LinkExists {
        /// The name.
        ifname: String,
        /// The namespace (path, or "the node").
        netns: String,
    },
    /// An interface expected to exist does not.
    #[error("interface {ifname} not found in {netns}")]
    LinkMissing {
        /// The name.
        ifname: String,
        /// The namespace.
        netns: String,
    },
    /// A netlink request failed.
    #[error("{op}")]
    Netlink {
        /// What was asked, with the interface and namespace.
        op: String,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
    /// A sysctl could not be written.
    #[error("cannot set {path}")]
    Sysctl {
        /// The /proc/sys path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A thread or socket for a netlink request could not be set up.
    #[error("cannot {op}: no thread or netlink socket for it")]
    Thread {
        /// What was to be done.
        op: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The pod's interface is not as it was set up.
    #[error("{0}")]
    Drift(String),
}

/// The result type of the plumbing.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The errno of a netlink error, if it is one.
pub(crate) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(msg) => Some(-msg.raw_code()),
        _ => None,
    }
}

/// Wraps a netlink error with what was being done.
pub(crate) fn netlink(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Error {
    let op = op.into();
    move |source| Error::Netlink { op, source }
}

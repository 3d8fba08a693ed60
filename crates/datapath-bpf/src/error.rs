//! The crate's error type: every variant names the map, path, interface or
//! input it is about, and describes only this layer (the source follows).

use std::io;
use std::path::PathBuf;

/// Errors of the datapath crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The BPF root directory could not be created.
    #[error("cannot create bpf directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// statfs on the BPF root failed.
    #[error("cannot inspect the filesystem at {path}")]
    Statfs {
        /// The BPF root.
        path: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// Mounting bpffs failed.
    #[error("cannot mount bpffs at {path}")]
    Mount {
        /// The BPF root.
        path: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// libbpf could not open the embedded object.
    #[error("cannot open the datapath object")]
    OpenObject(#[source] libbpf_rs::Error),
    /// Setting a map's pin path before load failed.
    #[error("cannot prepare map {map} for pinning at {path}")]
    PreparePin {
        /// The map name.
        map: String,
        /// The pin path.
        path: PathBuf,
        /// Why.
        #[source]
        source: libbpf_rs::Error,
    },
    /// The kernel refused the object (verifier, map creation, pinning).
    #[error("cannot load the datapath object into the kernel")]
    LoadObject(#[source] libbpf_rs::Error),
    /// A pinned map could not be opened.
    #[error("cannot open pinned map {path}")]
    OpenPinned {
        /// The pin.
        path: PathBuf,
        /// Why.
        #[source]
        source: libbpf_rs::Error,
    },
    /// A stale pin could not be removed.
    #[error("cannot remove stale pin {path}")]
    Unpin {
        /// The pin.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A loaded map or program could not be duplicated for this process.
    #[error("cannot take a handle on {object}")]
    Handle {
        /// The map or program name.
        object: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A map operation failed in the kernel.
    #[error("{op} on map {map} failed")]
    MapOp {
        /// The map name.
        map: &'static str,
        /// lookup, update, delete, ...
        op: &'static str,
        /// Why.
        #[source]
        source: libbpf_rs::Error,
    },
    /// A map returned bytes of an unexpected size (a layout mismatch).
    #[error("map {map} returned {len} bytes where {expected} were expected")]
    Layout {
        /// The map name.
        map: &'static str,
        /// Bytes received.
        len: usize,
        /// Bytes the Rust mirror has.
        expected: usize,
    },
    /// An input the datapath cannot represent.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was given (e.g. "policy rule", "service").
        what: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// An endpoint's policy rules cannot be compiled into map entries.
    #[error("cannot compile the policy")]
    Policy(#[source] cellium_policy::Error),
    /// Attaching a program to an interface failed.
    #[error("cannot attach {program} to interface {ifindex} ({mode})")]
    Attach {
        /// The program.
        program: &'static str,
        /// The interface.
        ifindex: u32,
        /// tcx or clsact.
        mode: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Attaching a socket-level load-balancing program to a cgroup failed.
    #[error("cannot attach {program} to cgroup {}", cgroup.display())]
    AttachCgroup {
        /// The program.
        program: &'static str,
        /// The cgroup's directory.
        cgroup: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A pinned tcx link could not be opened, inspected, updated or pinned.
    #[error("cannot {op} link {path}")]
    Link {
        /// open, inspect, update, pin, detach.
        op: &'static str,
        /// The link's pin.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A clsact (TC filter) operation failed.
    #[error("cannot {op} {program} on interface {ifindex} (clsact)")]
    Clsact {
        /// What was attempted.
        op: &'static str,
        /// The program.
        program: &'static str,
        /// The interface.
        ifindex: u32,
        /// Why.
        #[source]
        source: libbpf_rs::Error,
    },
    /// Listing the pinned links failed.
    #[error("cannot list links under {path}")]
    ListLinks {
        /// The links directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Setting up or polling the events ring buffer failed.
    #[error("events ring buffer: cannot {op}")]
    Events {
        /// build, poll, register.
        op: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading CLOCK_MONOTONIC (the clock of bpf_ktime_get_ns) failed.
    #[error("cannot read the monotonic clock")]
    Clock(#[source] nix::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn map_op(
        map: &'static str,
        op: &'static str,
    ) -> impl FnOnce(libbpf_rs::Error) -> Self {
        move |source| Self::MapOp { map, op, source }
    }

    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

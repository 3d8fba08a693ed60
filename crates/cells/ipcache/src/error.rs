//! Errors of the ipcache.

use ipnet::IpNet;

use crate::source::Source;

/// What can go wrong when claiming prefixes or mirroring them into the datapath.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Identity 0 means "unknown" in the datapath; no prefix may map to it.
    #[error("prefix {prefix} cannot map to identity 0 (claimed by {claimant})")]
    ZeroIdentity {
        /// The prefix.
        prefix: IpNet,
        /// Who claimed it.
        claimant: Source,
    },
    /// A write to the datapath's map failed; the entry is kept in the desired state and the
    /// `ipcache-sync` job retries it.
    #[error(
        "cannot write {prefix} -> identity {identity} to the datapath's ipcache (kept and retried)"
    )]
    Write {
        /// The prefix.
        prefix: IpNet,
        /// The identity the datapath should see.
        identity: u32,
        /// The underlying error.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// A removal from the datapath's map failed; retried like a write.
    #[error("cannot remove {prefix} from the datapath's ipcache (retried)")]
    Remove {
        /// The prefix.
        prefix: IpNet,
        /// The underlying error.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// The datapath's map could not be listed.
    #[error("cannot list the datapath's ipcache")]
    List(#[source] cellium_datapath_bpf::Error),
    /// The mirror is asked for before the ipcache's start hook ran, or without a datapath.
    #[error("the ipcache is not mirrored into a datapath (not started yet, or in memory only)")]
    NotMirrored,
    /// The datapath is not available from the loader.
    #[error("cannot mirror the ipcache")]
    Loader(#[source] cellium_loader::Error),
    /// The node's addresses could not be read.
    #[error("cannot read the node's addresses over netlink")]
    HostAddresses(#[source] std::io::Error),
    /// A netlink request for the node's addresses failed.
    #[error("cannot list the node's addresses over netlink")]
    Netlink(#[source] rtnetlink::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

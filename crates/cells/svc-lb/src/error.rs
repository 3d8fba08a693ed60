//! Errors of programming services into the datapath.

/// Why a frontend, or a whole pass, could not be programmed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The datapath is not available.
    #[error("no datapath to program services into")]
    Datapath(#[from] cellium_loader::Error),
    /// The load-balancing maps (or conntrack, for the rev-NAT collector) cannot be read.
    #[error("cannot read the {what}")]
    Read {
        /// Which map.
        what: &'static str,
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// The datapath's settings (`cel_config`) cannot be written.
    #[error("cannot set service-no-backend-response in the datapath's settings")]
    Config {
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// `cgroup-root` is not, and cannot be made, a cgroup v2 directory.
    #[error("cgroup-root {}: {why}", path.display())]
    CgroupRoot {
        /// The configured path.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
    /// The socket-level load balancer could not be attached to (or removed from) the cgroup.
    #[error("bpf-lb-sock: cannot attach the socket-level load balancer to cgroup-root {}", cgroup.display())]
    SockLb {
        /// The configured cgroup.
        cgroup: std::path::PathBuf,
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// A map write for one frontend failed.
    #[error("cannot program frontend {frontend}")]
    Program {
        /// The frontend, as `Plan::describe` names it.
        frontend: String,
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// Removing a stale frontend, backend or rev-NAT entry failed.
    #[error("cannot remove the stale {what}")]
    Remove {
        /// What (`frontend 10.96.0.10:80/tcp`, `backend 12`, ...).
        what: String,
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// The frontend cannot be programmed as planned (too many backends, say).
    #[error("frontend {frontend}: {reason}")]
    Unprogrammable {
        /// The frontend.
        frontend: String,
        /// Why.
        reason: String,
    },
    /// Every rev-NAT id (16 bits) is in use.
    #[error("frontend {0}: no rev-NAT id left (all 65535 are in use)")]
    RevNatExhausted(String),
    /// No backend id is free.
    #[error("frontend {0}: no backend id left")]
    BackendIdsExhausted(String),
    /// The node's addresses (NodePort frontends listen on them) cannot be read.
    #[error("cannot read the node's addresses")]
    NodeAddresses(#[source] cellium_ipcache::Error),
    /// The blocking task running a pass failed.
    #[error("the service programming task did not finish")]
    Task(#[from] tokio::task::JoinError),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

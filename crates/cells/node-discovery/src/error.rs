//! Errors of the cell.

/// Why the cell cannot be built or a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `routing-mode` names a mode this version does not have.
    #[error("routing-mode: {0}")]
    Mode(String),
    /// A netlink call failed.
    #[error("cannot {what}")]
    Netlink {
        /// The call.
        what: String,
        /// Why.
        #[source]
        source: rtnetlink::Error,
    },
    /// A route cannot be expressed.
    #[error("route {route}: {reason}")]
    Route {
        /// The route.
        route: String,
        /// Why.
        reason: String,
    },
    /// The datapath is not loaded.
    #[error("datapath")]
    Loader(#[from] cellium_loader::Error),
    /// The tunnel device's program or setting cannot be put in place.
    #[error("tunnel device {what}")]
    Tunnel {
        /// What failed.
        what: &'static str,
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// `cel_from_netdev` cannot be attached to or detached from a device of the node.
    #[error("the node's device program")]
    Netdev {
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// Other nodes' pod CIDRs cannot be written to `cel_ipmasq`.
    #[error("the pod CIDRs kept from masquerading")]
    NonMasquerade {
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// An ipcache write failed.
    #[error("ipcache")]
    Ipcache(#[from] cellium_ipcache::Error),
    /// The netlink connection cannot be opened.
    #[error("cannot open a netlink connection")]
    Connect(#[source] std::io::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

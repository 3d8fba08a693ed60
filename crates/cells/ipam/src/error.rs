//! Errors of the allocator.

use std::net::IpAddr;
use std::time::SystemTime;

use ipnet::IpNet;

/// What can go wrong when handing out addresses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every address of the pool is taken or in quarantine.
    #[error(
        "address pool {cidr} is exhausted: all {capacity} addresses are in use{}",
        quarantine_suffix(*.quarantined)
    )]
    Exhausted {
        /// The pool.
        cidr: IpNet,
        /// How many addresses it hands out.
        capacity: u64,
        /// How many of the addresses not in use are in quarantine.
        quarantined: u64,
    },
    /// A requested address was released a moment ago and may not be handed out yet.
    #[error("{}", quarantined_message(.ip, .released, .until))]
    Quarantined {
        /// The address.
        ip: IpAddr,
        /// When it was released; `None` when that is unknown (the record of released
        /// addresses could not be read at start, so every free address is in quarantine).
        released: Option<SystemTime>,
        /// When it may be handed out again.
        until: SystemTime,
    },
    /// A request names the same address twice.
    #[error("address {ip} is requested twice")]
    DuplicateRequest {
        /// The address.
        ip: IpAddr,
    },
    /// The allocator's record (cursors and quarantine) could not be written; nothing was
    /// changed.
    #[error("cannot record the address allocation; nothing was changed")]
    Record {
        /// What the state directory said.
        #[source]
        source: cellium_statedir::Error,
    },
    /// A configured pod CIDR is refused.
    #[error("config key pod-cidr")]
    PodCidr {
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// `ipam: kubernetes` without Kubernetes mode.
    #[error(
        "ipam: kubernetes and cluster-pool need Kubernetes mode (k8s-api-server, k8s-kubeconfig-path or the in-cluster environment)"
    )]
    NotKubernetes,
    /// A CIDR that cannot serve pods.
    #[error("pod CIDR {cidr} cannot serve pods: {reason}")]
    Unusable {
        /// The CIDR.
        cidr: IpNet,
        /// Why not.
        reason: String,
    },
    /// No pool of the requested family is configured.
    #[error("no IPv{family} pod CIDR is configured (set pod-cidr)")]
    NoPool {
        /// 4 or 6.
        family: u8,
    },
    /// A requested address is held by someone else.
    #[error("address {ip} is already held by {owner}")]
    InUse {
        /// The address.
        ip: IpAddr,
        /// Its holder.
        owner: String,
    },
    /// A requested address lies in no pool.
    #[error("address {ip} is not in any pod CIDR of this node ({cidr})")]
    NotInPool {
        /// The address.
        ip: IpAddr,
        /// The node's CIDRs.
        cidr: IpNet,
    },
    /// A requested address is the network, broadcast or router address.
    #[error("address {ip} is reserved in {cidr} (network, broadcast or router address)")]
    Reserved {
        /// The address.
        ip: IpAddr,
        /// Its pool.
        cidr: IpNet,
    },
    /// A CIDR too small to hold a router and one pod.
    #[error("pod CIDR {cidr} is too small: it needs room for a router and at least one pod")]
    PoolTooSmall {
        /// The CIDR.
        cidr: IpNet,
    },
    /// Two pools overlap.
    #[error("pod CIDR {cidr} overlaps {other}")]
    Overlap {
        /// The CIDR being added.
        cidr: IpNet,
        /// The pool it overlaps.
        other: IpNet,
    },
}

fn quarantine_suffix(quarantined: u64) -> String {
    if quarantined == 0 {
        String::new()
    } else {
        format!(
            " or in quarantine ({quarantined} released too recently, see ipam-release-quarantine)"
        )
    }
}

fn quarantined_message(ip: &IpAddr, released: &Option<SystemTime>, until: &SystemTime) -> String {
    let until = humantime::format_rfc3339_seconds(*until);
    match released {
        Some(at) => format!(
            "address {ip} was released at {} and is in quarantine until {until} (ipam-release-quarantine), so that it gets no traffic meant for its last holder",
            humantime::format_rfc3339_seconds(*at)
        ),
        None => format!(
            "address {ip} is in quarantine until {until}: the record of recently released addresses could not be read at start"
        ),
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Errors of the allocator.

use std::net::IpAddr;

use ipnet::IpNet;

/// What can go wrong when handing out addresses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every address of the pool is taken.
    #[error("address pool {cidr} is exhausted: all {capacity} addresses are in use")]
    Exhausted {
        /// The pool.
        cidr: IpNet,
        /// How many addresses it hands out.
        capacity: u64,
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

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! `cel_frag4`: the datagrams being fragmented, each with the ports its first fragment
//! carried (later fragments take them from here). The datapath writes it; user space only
//! reads it, for tools and tests.

use std::net::IpAddr;

use crate::abi::{Frag4Key, FragPorts, ipv4_of};
use crate::error::Result;
use crate::maps::TypedMap;
use crate::types::Protocol;

/// The IPv4 map name.
pub const NAME4: &str = "cel_frag4";

/// A datagram whose first fragment was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fragmented {
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// The IP identification.
    pub id: u32,
    /// Protocol.
    pub protocol: Protocol,
    /// The first fragment's source port (host order; ICMP echo request: identifier).
    pub sport: u16,
    /// Its destination port (host order; ICMP echo reply: identifier).
    pub dport: u16,
}

/// The fragment table.
#[derive(Debug)]
pub struct Fragments {
    v4: TypedMap<Frag4Key, FragPorts>,
}

impl Fragments {
    pub(crate) fn new(v4: TypedMap<Frag4Key, FragPorts>) -> Self {
        Self { v4 }
    }

    /// Every datagram recorded.
    pub fn entries(&self) -> Result<Vec<Fragmented>> {
        Ok(self
            .v4
            .entries()?
            .into_iter()
            .map(|(k, v)| Fragmented {
                saddr: ipv4_of(k.saddr).into(),
                daddr: ipv4_of(k.daddr).into(),
                id: u32::from(u16::from_be(k.id)),
                protocol: Protocol::from(k.protocol),
                sport: u16::from_be(v.sport),
                dport: u16::from_be(v.dport),
            })
            .collect())
    }
}

//! `cel_frag4` and `cel_frag6`: the datagrams being fragmented, each with the upper-layer
//! protocol and ports its first fragment carried (later fragments take them from here). The
//! datapath writes them; user space only reads them, for tools and tests.

use std::net::{IpAddr, Ipv6Addr};

use crate::abi::{Frag4Key, Frag6Key, FragPorts, ipv4_of};
use crate::error::Result;
use crate::maps::TypedMap;
use crate::types::Protocol;

/// The IPv4 map name.
pub const NAME4: &str = "cel_frag4";
/// The IPv6 map name.
pub const NAME6: &str = "cel_frag6";

/// A datagram whose first fragment was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fragmented {
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// The identification (16 bits for IPv4, 32 for IPv6).
    pub id: u32,
    /// The upper-layer protocol.
    pub protocol: Protocol,
    /// The first fragment's source port (host order; ICMP echo request: identifier).
    pub sport: u16,
    /// Its destination port (host order; ICMP echo reply: identifier).
    pub dport: u16,
}

/// The fragment tables.
#[derive(Debug)]
pub struct Fragments {
    v4: TypedMap<Frag4Key, FragPorts>,
    v6: TypedMap<Frag6Key, FragPorts>,
}

impl Fragments {
    pub(crate) fn new(
        v4: TypedMap<Frag4Key, FragPorts>,
        v6: TypedMap<Frag6Key, FragPorts>,
    ) -> Self {
        Self { v4, v6 }
    }

    /// Every datagram recorded, IPv4 first.
    pub fn entries(&self) -> Result<Vec<Fragmented>> {
        let entry = |saddr, daddr, id, v: &FragPorts| Fragmented {
            saddr,
            daddr,
            id,
            protocol: Protocol::from(v.protocol),
            sport: u16::from_be(v.sport),
            dport: u16::from_be(v.dport),
        };
        let v4 = self.v4.entries()?.into_iter().map(|(k, v)| {
            entry(
                ipv4_of(k.saddr).into(),
                ipv4_of(k.daddr).into(),
                u32::from(u16::from_be(k.id)),
                &v,
            )
        });
        let v6 = self.v6.entries()?.into_iter().map(|(k, v)| {
            entry(
                Ipv6Addr::from(k.saddr).into(),
                Ipv6Addr::from(k.daddr).into(),
                u32::from_be(k.id),
                &v,
            )
        });
        Ok(v4.chain(v6).collect())
    }
}

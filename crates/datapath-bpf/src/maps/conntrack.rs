//! `cel_ct4`: the node's IPv4 connection table, and its garbage collector.
//!
//! The datapath ignores expired entries, so GC only reclaims space; LRU
//! eviction already bounds the table. Service entries (client -> VIP)
//! carry [`CtTuple::service`] and remember the chosen backend.

use std::net::{IpAddr, Ipv4Addr};

use crate::abi::{CtEntry, CtKey, be32, ipv4_of};
use crate::clock::ktime_now_ns;
use crate::error::Result;
use crate::maps::TypedMap;
use crate::types::Protocol;

/// The map name.
pub const NAME: &str = "cel_ct4";

const F_SERVICE: u8 = 1;

/// A connection's tuple in the direction of its first packet. For ICMP
/// echo, `sport` is the identifier and `dport` 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    /// Source address.
    pub saddr: Ipv4Addr,
    /// Destination address.
    pub daddr: Ipv4Addr,
    /// Source port (host order).
    pub sport: u16,
    /// Destination port (host order).
    pub dport: u16,
    /// Protocol.
    pub protocol: Protocol,
    /// A client -> frontend entry that pins the backend choice.
    pub service: bool,
}

impl CtTuple {
    fn key(&self) -> CtKey {
        CtKey {
            saddr: be32(self.saddr),
            daddr: be32(self.daddr),
            sport: self.sport.to_be(),
            dport: self.dport.to_be(),
            protocol: self.protocol.number(),
            flags: if self.service { F_SERVICE } else { 0 },
            pad: 0,
        }
    }

    fn from_key(k: &CtKey) -> Self {
        Self {
            saddr: ipv4_of(k.saddr),
            daddr: ipv4_of(k.daddr),
            sport: u16::from_be(k.sport),
            dport: u16::from_be(k.dport),
            protocol: Protocol::from(k.protocol),
            service: k.flags & F_SERVICE != 0,
        }
    }
}

/// TCP connection state (`CEL_CT_STATE_*`); other protocols are `Established`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtState {
    /// SYN seen, no reply ACK yet.
    Syn,
    /// Handshake done (or not TCP).
    Established,
    /// RST, or FIN from both sides.
    Closing,
    /// A number this version does not know.
    Unknown(u8),
}

impl CtEntry {
    /// The connection state.
    pub fn ct_state(&self) -> CtState {
        match self.state {
            0 => CtState::Syn,
            1 => CtState::Established,
            2 => CtState::Closing,
            n => CtState::Unknown(n),
        }
    }
}

/// Result of a GC pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Entries looked at.
    pub scanned: usize,
    /// Expired entries deleted.
    pub deleted: usize,
}

/// The connection table.
#[derive(Debug)]
pub struct Conntrack {
    map: TypedMap<CtKey, CtEntry>,
}

impl Conntrack {
    pub(crate) fn new(map: TypedMap<CtKey, CtEntry>) -> Self {
        Self { map }
    }

    /// The entry of a tuple (as first seen; replies are not looked up).
    pub fn get(&self, tuple: &CtTuple) -> Result<Option<CtEntry>> {
        self.map.get(&tuple.key())
    }

    /// Writes an entry (restoring or testing; the datapath creates its own).
    pub fn put(&self, tuple: &CtTuple, entry: &CtEntry) -> Result<()> {
        self.map.put(&tuple.key(), entry)
    }

    /// Deletes one connection; returns whether it existed.
    pub fn delete(&self, tuple: &CtTuple) -> Result<bool> {
        self.map.delete(&tuple.key())
    }

    /// Every entry, expired ones included.
    pub fn entries(&self) -> Result<Vec<(CtTuple, CtEntry)>> {
        Ok(self
            .map
            .entries()?
            .iter()
            .map(|(k, v)| (CtTuple::from_key(k), *v))
            .collect())
    }

    /// Deletes every entry whose deadline passed. An entry refreshed by
    /// the datapath between the read and the delete is lost, which only
    /// costs that connection a fresh policy check on its next packet.
    pub fn gc(&self) -> Result<GcStats> {
        let now = ktime_now_ns()?;
        let mut stats = GcStats::default();
        for (key, entry) in self.map.entries()? {
            stats.scanned += 1;
            if entry.expires_ns <= now && self.map.delete(&key)? {
                stats.deleted += 1;
            }
        }
        Ok(stats)
    }

    /// Deletes every entry whose source or destination is one of `addrs`: connections,
    /// service entries (client -> frontend) and translated connections (client -> backend)
    /// alike. Returns how many were deleted.
    ///
    /// This is how an address's state is kept from outliving its endpoint: call it once the
    /// endpoint map no longer (or newly) names the address. Trap: the datapath keeps creating
    /// entries while packets flow, so an entry created by a packet that raced the flush
    /// survives it; what cannot be raced is only a flush after the endpoint map changed.
    /// The table has no family beyond IPv4 yet: IPv6 addresses match nothing.
    pub fn flush_addresses(&self, addrs: &[IpAddr]) -> Result<usize> {
        let names = |ip: Ipv4Addr| addrs.contains(&IpAddr::V4(ip));
        if !addrs.iter().any(IpAddr::is_ipv4) {
            return Ok(0);
        }
        let mut n = 0;
        for key in self.map.keys()? {
            let t = CtTuple::from_key(&key);
            if (names(t.saddr) || names(t.daddr)) && self.map.delete(&key)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes every entry; returns how many.
    pub fn flush(&self) -> Result<usize> {
        let mut n = 0;
        for (key, _) in self.map.entries()? {
            if self.map.delete(&key)? {
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_round_trip_through_keys() {
        let t = CtTuple {
            saddr: Ipv4Addr::new(10, 0, 0, 1),
            daddr: Ipv4Addr::new(10, 96, 0, 10),
            sport: 40000,
            dport: 80,
            protocol: Protocol::Tcp,
            service: true,
        };
        let k = t.key();
        assert_eq!(k.flags, 1);
        assert_eq!(k.dport, 80u16.to_be());
        assert_eq!(CtTuple::from_key(&k), t);
    }

    #[test]
    fn states_decode() {
        let mut e = CtEntry::default();
        assert_eq!(e.ct_state(), CtState::Syn);
        e.state = 1;
        assert_eq!(e.ct_state(), CtState::Established);
        e.state = 2;
        assert_eq!(e.ct_state(), CtState::Closing);
        e.state = 9;
        assert_eq!(e.ct_state(), CtState::Unknown(9));
    }
}

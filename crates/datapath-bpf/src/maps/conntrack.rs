//! `cel_ct4` and `cel_ct6`: the node's connection tables, one per family, and their
//! garbage collector.
//!
//! The datapath ignores expired entries, so GC only reclaims space; LRU
//! eviction already bounds the tables. Service entries (client -> VIP)
//! carry [`CtTuple::service`] and remember the chosen backend.

use std::net::{IpAddr, Ipv6Addr};

use crate::abi::{Ct6Key, CtEntry, CtKey, be32, ipv4_of};
use crate::clock::ktime_now_ns;
use crate::error::{Error, Result};
use crate::maps::TypedMap;
use crate::maps::snat::{SnatTable, V4, V6};
use crate::types::Protocol;

/// The IPv4 map name.
pub const NAME: &str = "cel_ct4";
/// The IPv6 map name.
pub const NAME6: &str = "cel_ct6";

const F_SERVICE: u8 = 1;

/// A connection's tuple in the direction of its first packet. For ICMP
/// echo, `sport` is the identifier and `dport` 0. Both addresses are of one
/// family, which says the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// Source port (host order).
    pub sport: u16,
    /// Destination port (host order).
    pub dport: u16,
    /// Protocol.
    pub protocol: Protocol,
    /// A client -> frontend entry that pins the backend choice.
    pub service: bool,
}

/// A tuple's key in the table of its family.
enum Key {
    V4(CtKey),
    V6(Ct6Key),
}

impl CtTuple {
    fn flags(&self) -> u8 {
        if self.service { F_SERVICE } else { 0 }
    }

    fn key(&self) -> Result<Key> {
        match (self.saddr, self.daddr) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Ok(Key::V4(CtKey {
                saddr: be32(s),
                daddr: be32(d),
                sport: self.sport.to_be(),
                dport: self.dport.to_be(),
                protocol: self.protocol.number(),
                flags: self.flags(),
                pad: 0,
            })),
            (IpAddr::V6(s), IpAddr::V6(d)) => Ok(Key::V6(Ct6Key {
                saddr: s.octets(),
                daddr: d.octets(),
                sport: self.sport.to_be(),
                dport: self.dport.to_be(),
                protocol: self.protocol.number(),
                flags: self.flags(),
                pad: 0,
            })),
            _ => Err(Error::invalid(
                format!("connection {} -> {}", self.saddr, self.daddr),
                "the addresses are of two families",
            )),
        }
    }

    fn from_key(k: &CtKey) -> Self {
        Self {
            saddr: ipv4_of(k.saddr).into(),
            daddr: ipv4_of(k.daddr).into(),
            sport: u16::from_be(k.sport),
            dport: u16::from_be(k.dport),
            protocol: Protocol::from(k.protocol),
            service: k.flags & F_SERVICE != 0,
        }
    }

    fn from_key6(k: &Ct6Key) -> Self {
        Self {
            saddr: Ipv6Addr::from(k.saddr).into(),
            daddr: Ipv6Addr::from(k.daddr).into(),
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
    /// Source translations (`cel_snat4`/`cel_snat6`) of connections gone, deleted.
    pub translations_deleted: usize,
}

/// The connection tables.
#[derive(Debug)]
pub struct Conntrack {
    v4: TypedMap<CtKey, CtEntry>,
    v6: TypedMap<Ct6Key, CtEntry>,
    snat4: SnatTable<V4>,
    snat6: SnatTable<V6>,
}

impl Conntrack {
    pub(crate) fn new(
        v4: TypedMap<CtKey, CtEntry>,
        v6: TypedMap<Ct6Key, CtEntry>,
        snat4: SnatTable<V4>,
        snat6: SnatTable<V6>,
    ) -> Self {
        Self {
            v4,
            v6,
            snat4,
            snat6,
        }
    }

    /// The entry of a tuple (as first seen; replies are not looked up).
    pub fn get(&self, tuple: &CtTuple) -> Result<Option<CtEntry>> {
        match tuple.key()? {
            Key::V4(k) => self.v4.get(&k),
            Key::V6(k) => self.v6.get(&k),
        }
    }

    /// Writes an entry (restoring or testing; the datapath creates its own).
    pub fn put(&self, tuple: &CtTuple, entry: &CtEntry) -> Result<()> {
        match tuple.key()? {
            Key::V4(k) => self.v4.put(&k, entry),
            Key::V6(k) => self.v6.put(&k, entry),
        }
    }

    /// Deletes one connection; returns whether it existed.
    pub fn delete(&self, tuple: &CtTuple) -> Result<bool> {
        match tuple.key()? {
            Key::V4(k) => self.v4.delete(&k),
            Key::V6(k) => self.v6.delete(&k),
        }
    }

    /// Every entry of both families, expired ones included.
    pub fn entries(&self) -> Result<Vec<(CtTuple, CtEntry)>> {
        let v4 = self.v4.entries()?;
        let v6 = self.v6.entries()?;
        Ok(v4
            .iter()
            .map(|(k, v)| (CtTuple::from_key(k), *v))
            .chain(v6.iter().map(|(k, v)| (CtTuple::from_key6(k), *v)))
            .collect())
    }

    /// Deletes every entry whose deadline passed, then the source translations no
    /// connection left needs ([`crate::maps::snat`]). An entry refreshed by the datapath
    /// between the read and the delete is lost, which only costs that connection a fresh
    /// policy check on its next packet.
    pub fn gc(&self) -> Result<GcStats> {
        let now = ktime_now_ns()?;
        let mut stats = GcStats::default();
        for (key, entry) in self.v4.entries()? {
            stats.scanned += 1;
            if entry.expires_ns <= now && self.v4.delete(&key)? {
                stats.deleted += 1;
            }
        }
        for (key, entry) in self.v6.entries()? {
            stats.scanned += 1;
            if entry.expires_ns <= now && self.v6.delete(&key)? {
                stats.deleted += 1;
            }
        }
        stats.translations_deleted =
            self.snat4.collect(&self.v4)? + self.snat6.collect(&self.v6)?;
        Ok(stats)
    }

    /// Deletes every entry whose source or destination is one of `addrs`: connections,
    /// service entries (client -> frontend) and translated connections (client -> backend)
    /// alike, in the table of each address's family. Returns how many were deleted.
    ///
    /// This is how an address's state is kept from outliving its endpoint: call it once the
    /// endpoint map no longer (or newly) names the address. Trap: the datapath keeps creating
    /// entries while packets flow, so an entry created by a packet that raced the flush
    /// survives it; what cannot be raced is only a flush after the endpoint map changed.
    pub fn flush_addresses(&self, addrs: &[IpAddr]) -> Result<usize> {
        let names = |ip: IpAddr| addrs.contains(&ip);
        let mut n = 0;
        if addrs.iter().any(IpAddr::is_ipv4) {
            for key in self.v4.keys()? {
                let t = CtTuple::from_key(&key);
                if (names(t.saddr) || names(t.daddr)) && self.v4.delete(&key)? {
                    n += 1;
                }
            }
        }
        if addrs.iter().any(IpAddr::is_ipv6) {
            for key in self.v6.keys()? {
                let t = CtTuple::from_key6(&key);
                if (names(t.saddr) || names(t.daddr)) && self.v6.delete(&key)? {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Deletes every entry of both families; returns how many.
    pub fn flush(&self) -> Result<usize> {
        let mut n = 0;
        for key in self.v4.keys()? {
            n += usize::from(self.v4.delete(&key)?);
        }
        for key in self.v6.keys()? {
            n += usize::from(self.v6.delete(&key)?);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn tuples_round_trip_through_keys() {
        let t = CtTuple {
            saddr: Ipv4Addr::new(10, 0, 0, 1).into(),
            daddr: Ipv4Addr::new(10, 96, 0, 10).into(),
            sport: 40000,
            dport: 80,
            protocol: Protocol::Tcp,
            service: true,
        };
        let Ok(Key::V4(k)) = t.key() else {
            panic!("not an IPv4 key")
        };
        assert_eq!(k.flags, 1);
        assert_eq!(k.dport, 80u16.to_be());
        assert_eq!(CtTuple::from_key(&k), t);
        let t6 = CtTuple {
            saddr: "fd00::1".parse().unwrap(),
            daddr: "fd00::2".parse().unwrap(),
            ..t
        };
        let Ok(Key::V6(k)) = t6.key() else {
            panic!("not an IPv6 key")
        };
        assert_eq!(CtTuple::from_key6(&k), t6);
        let mixed = CtTuple {
            daddr: "fd00::2".parse().unwrap(),
            ..t
        };
        assert!(mixed.key().is_err());
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

//! One pod CIDR and the addresses handed out of it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::error::{Error, Result};

/// Who holds an address, in words a person can act on (`endpoint 12 (default/web-0)`).
pub type Owner = String;

/// The owner recorded for each pool's router (gateway) address.
pub const ROUTER_OWNER: &str = "router";

/// An address pool over one CIDR.
///
/// Addresses are numbered by their offset in the CIDR. The network and broadcast addresses
/// of IPv4 prefixes shorter than /31 and offset 0 of IPv6 prefixes (the subnet-router anycast
/// address) are never handed out; the first usable address is the router's. Allocation goes
/// round-robin from the last address handed out, so a released address is not reused at once
/// (a new pod would inherit conntrack entries and peers' caches of the old one); the
/// [`Ipam`](crate::Ipam) adds a quarantine of released addresses and keeps the cursor across
/// restarts.
#[derive(Debug, Clone)]
pub struct Pool {
    cidr: IpNet,
    source: String,
    first: u128,
    last: u128,
    allocated: BTreeMap<u128, Owner>,
    cursor: u128,
}

impl Pool {
    /// A pool over `cidr` (host bits are cleared), fed by `source`, with its router reserved.
    /// A CIDR that cannot serve pods (see [`cidr`](crate::cidr)) or holds no room for a
    /// router and a pod is refused.
    pub fn new(cidr: IpNet, source: impl Into<String>) -> Result<Pool> {
        let cidr = cidr.trunc();
        if let Some(reason) = crate::cidr::unusable(cidr) {
            return Err(Error::Unusable { cidr, reason });
        }
        let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
        let size_minus_one = if host_bits == 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let (first, last) = match cidr {
            IpNet::V4(_) if host_bits >= 2 => (1, size_minus_one - 1),
            IpNet::V4(_) => (0, size_minus_one),
            IpNet::V6(_) if host_bits >= 1 => (1, size_minus_one),
            IpNet::V6(_) => (0, 0),
        };
        // The router takes one address and a pod needs at least one more.
        if last <= first {
            return Err(Error::PoolTooSmall { cidr });
        }
        let mut pool = Pool {
            cidr,
            source: source.into(),
            first,
            last,
            allocated: BTreeMap::new(),
            cursor: first,
        };
        pool.allocated.insert(first, ROUTER_OWNER.to_string());
        Ok(pool)
    }

    /// The pool's CIDR.
    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    /// Where the CIDR came from (`config`, `kubernetes`, ...).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The gateway address pods route through.
    pub fn router(&self) -> IpAddr {
        self.address(self.first)
    }

    /// Addresses that pods can get (the router excluded), saturated at `u64::MAX`.
    pub fn capacity(&self) -> u64 {
        u64::try_from(self.last - self.first).unwrap_or(u64::MAX)
    }

    /// Addresses held by pods (the router excluded).
    pub fn used(&self) -> u64 {
        self.allocated.len() as u64 - 1
    }

    /// Whether `ip` lies in this pool's CIDR.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip)
    }

    /// Who holds `ip`, if anyone.
    pub fn owner(&self, ip: IpAddr) -> Option<&str> {
        self.offset(ip)
            .and_then(|o| self.allocated.get(&o))
            .map(String::as_str)
    }

    /// Every held address with its owner, in address order (the router included).
    pub fn allocations(&self) -> impl Iterator<Item = (IpAddr, &str)> {
        self.allocated
            .iter()
            .map(|(o, owner)| (self.address(*o), owner.as_str()))
    }

    /// Hands out the next free address to `owner`.
    pub fn allocate_next(&mut self, owner: &str) -> Result<IpAddr> {
        self.allocate_next_where(owner, |_| false, 0)
    }

    /// Hands out the next free address to `owner`, skipping those `held_back` says no to;
    /// `held_back_count` is how many free addresses of the pool it refuses (to fail at once,
    /// and to say so, when nothing is left).
    pub(crate) fn allocate_next_where(
        &mut self,
        owner: &str,
        held_back: impl Fn(IpAddr) -> bool,
        held_back_count: u64,
    ) -> Result<IpAddr> {
        let exhausted = Error::Exhausted {
            cidr: self.cidr,
            capacity: self.capacity(),
            quarantined: held_back_count,
        };
        if self.used().saturating_add(held_back_count) >= self.capacity() {
            return Err(exhausted);
        }
        let start = self.cursor;
        let mut offset = start;
        loop {
            offset = if offset >= self.last {
                self.first
            } else {
                offset + 1
            };
            if !self.allocated.contains_key(&offset) && !held_back(self.address(offset)) {
                break;
            }
            // Reached only if the count was wrong; kept so that a bug cannot loop forever.
            if offset == start {
                return Err(exhausted);
            }
        }
        self.allocated.insert(offset, owner.to_string());
        self.cursor = offset;
        Ok(self.address(offset))
    }

    /// The last address handed out by [`allocate_next`](Pool::allocate_next) (the router's
    /// before the first).
    pub fn cursor(&self) -> IpAddr {
        self.address(self.cursor)
    }

    /// Continues round-robin allocation after `ip`, as a restarted allocator does from its
    /// record; an address outside the usable range is ignored.
    pub fn set_cursor(&mut self, ip: IpAddr) {
        if let Some(offset) = self
            .offset(ip)
            .filter(|o| (self.first..=self.last).contains(o))
        {
            self.cursor = offset;
        }
    }

    /// Hands `ip` to `owner`. Asking again for an address one already holds succeeds, so a
    /// restore or a retried request is idempotent.
    pub fn allocate(&mut self, ip: IpAddr, owner: &str) -> Result<()> {
        let offset = self.usable_offset(ip)?;
        match self.allocated.get(&offset) {
            Some(holder) if holder == owner => Ok(()),
            Some(holder) => Err(Error::InUse {
                ip,
                owner: holder.clone(),
            }),
            None => {
                self.allocated.insert(offset, owner.to_string());
                Ok(())
            }
        }
    }

    /// Takes `ip` back; returns its former owner. The router is never released.
    pub fn release(&mut self, ip: IpAddr) -> Option<Owner> {
        let offset = self.offset(ip)?;
        if offset == self.first {
            return None;
        }
        self.allocated.remove(&offset)
    }

    fn usable_offset(&self, ip: IpAddr) -> Result<u128> {
        let offset = self.offset(ip).ok_or(Error::NotInPool {
            ip,
            cidr: self.cidr,
        })?;
        if offset < self.first || offset > self.last {
            return Err(Error::Reserved {
                ip,
                cidr: self.cidr,
            });
        }
        Ok(offset)
    }

    fn offset(&self, ip: IpAddr) -> Option<u128> {
        if !self.cidr.contains(&ip) {
            return None;
        }
        Some(to_u128(ip) - to_u128(self.cidr.network()))
    }

    fn address(&self, offset: u128) -> IpAddr {
        let base = to_u128(self.cidr.network()) + offset;
        match self.cidr {
            IpNet::V4(_) => IpAddr::from((base as u32).to_be_bytes()),
            IpNet::V6(_) => IpAddr::from(base.to_be_bytes()),
        }
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(cidr: &str) -> Pool {
        Pool::new(cidr.parse().unwrap(), "config").unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_skips_network_broadcast_and_router() {
        let mut p = pool("10.0.0.0/29");
        assert_eq!(p.router(), ip("10.0.0.1"));
        assert_eq!(p.capacity(), 5);
        let got: Vec<IpAddr> = (0..5).map(|_| p.allocate_next("pod").unwrap()).collect();
        assert_eq!(got.first(), Some(&ip("10.0.0.2")));
        assert_eq!(got.last(), Some(&ip("10.0.0.6")));
        let err = p.allocate_next("pod").unwrap_err();
        assert!(
            matches!(
                err,
                Error::Exhausted {
                    capacity: 5,
                    quarantined: 0,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("10.0.0.0/29"), "{err}");
    }

    #[test]
    fn ipv6_skips_the_anycast_address() {
        let mut p = pool("fd00::/64");
        assert_eq!(p.router(), ip("fd00::1"));
        assert_eq!(p.allocate_next("a").unwrap(), ip("fd00::2"));
        // 2^64 addresses less the anycast one and the router's.
        assert_eq!(p.capacity(), u64::MAX - 1);
        assert_eq!(pool("fd00::/48").capacity(), u64::MAX);
    }

    #[test]
    fn released_addresses_are_not_reused_at_once() {
        let mut p = pool("10.0.0.0/29");
        let a = p.allocate_next("a").unwrap();
        assert_eq!(p.release(a).as_deref(), Some("a"));
        let b = p.allocate_next("b").unwrap();
        assert_ne!(a, b);
        assert_eq!(p.owner(b), Some("b"));
        assert_eq!(p.owner(a), None);
    }

    #[test]
    fn requested_addresses_are_checked() {
        let mut p = pool("10.0.0.0/24");
        p.allocate(ip("10.0.0.9"), "a").unwrap();
        p.allocate(ip("10.0.0.9"), "a").unwrap();
        let err = p.allocate(ip("10.0.0.9"), "b").unwrap_err();
        assert!(err.to_string().contains("held by a"), "{err}");
        for reserved in ["10.0.0.0", "10.0.0.1", "10.0.0.255"] {
            let err = p.allocate(ip(reserved), "b").unwrap_err();
            assert!(
                matches!(err, Error::Reserved { .. } | Error::InUse { .. }),
                "{err}"
            );
        }
        let err = p.allocate(ip("10.0.1.1"), "b").unwrap_err();
        assert!(matches!(err, Error::NotInPool { .. }), "{err}");
        // The round-robin cursor steps over what was requested.
        assert_eq!(p.allocate_next("c").unwrap(), ip("10.0.0.2"));
    }

    #[test]
    fn a_slash_31_has_a_router_and_one_pod() {
        let mut p = pool("10.0.0.0/31");
        assert_eq!(p.router(), ip("10.0.0.0"));
        assert_eq!(p.allocate_next("a").unwrap(), ip("10.0.0.1"));
        assert!(p.allocate_next("b").is_err());
    }

    #[test]
    fn cidrs_that_cannot_serve_pods_are_refused() {
        for cidr in ["0.0.0.0/0", "127.0.0.0/24", "fe80::/64", "224.0.0.0/24"] {
            let err = Pool::new(cidr.parse().unwrap(), "config").unwrap_err();
            assert!(matches!(err, Error::Unusable { .. }), "{cidr}: {err}");
            assert!(err.to_string().contains(cidr), "{cidr}: {err}");
        }
    }

    #[test]
    fn the_router_cannot_be_released() {
        let mut p = pool("10.0.0.0/30");
        assert_eq!(p.release(ip("10.0.0.1")), None);
        assert_eq!(p.owner(ip("10.0.0.1")), Some(ROUTER_OWNER));
        assert_eq!(p.capacity(), 1);
    }

    #[test]
    fn held_back_addresses_are_skipped_and_counted_in_the_exhaustion() {
        let mut p = pool("10.0.0.0/29");
        let six = ip("10.0.0.6");
        let two = ip("10.0.0.2");
        let held_back = |a: IpAddr| a == two || a == six;
        assert_eq!(
            p.allocate_next_where("a", held_back, 2).unwrap(),
            ip("10.0.0.3")
        );
        assert_eq!(
            p.allocate_next_where("b", held_back, 2).unwrap(),
            ip("10.0.0.4")
        );
        assert_eq!(
            p.allocate_next_where("c", held_back, 2).unwrap(),
            ip("10.0.0.5")
        );
        let err = p.allocate_next_where("d", held_back, 2).unwrap_err();
        assert!(
            matches!(err, Error::Exhausted { quarantined: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("2 released too recently"), "{err}");
        // A wrong count cannot make it loop or hand out a held-back address.
        assert!(p.allocate_next_where("d", held_back, 0).is_err());
        assert_eq!(p.allocate_next("d").unwrap(), six);
    }

    #[test]
    fn the_cursor_can_be_set_back_after_a_restart() {
        let mut p = pool("10.0.0.0/24");
        assert_eq!(p.cursor(), p.router());
        p.set_cursor(ip("10.0.0.40"));
        assert_eq!(p.allocate_next("a").unwrap(), ip("10.0.0.41"));
        for outside in ["10.0.1.1", "10.0.0.255", "10.0.0.0"] {
            p.set_cursor(ip(outside));
            assert_eq!(p.cursor(), ip("10.0.0.41"), "{outside}");
        }
    }

    #[test]
    fn too_small_pools_are_refused() {
        for cidr in ["10.0.0.1/32", "fd00::/127", "fd00::1/128"] {
            let err = Pool::new(cidr.parse().unwrap(), "config").unwrap_err();
            assert!(matches!(err, Error::PoolTooSmall { .. }), "{cidr}: {err}");
        }
    }
}

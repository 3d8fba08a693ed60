//! `cel_lb4_source_range` / `cel_lb6_source_range`: per load balancer frontend (rev-NAT id)
//! with `loadBalancerSourceRanges`, the client prefixes it admits (LPM tries; the rev-NAT id
//! is always matched whole). The agent's own: svc-lb writes them before it sets a frontend's
//! [`SERVICE_SOURCE_RANGE`](crate::SERVICE_SOURCE_RANGE) flag.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::abi::{Lb4SrcRangeKey, Lb6SrcRangeKey};
use crate::error::Result;
use crate::maps::TypedMap;

/// The IPv4 map's name.
pub const NAME4: &str = "cel_lb4_source_range";
/// The IPv6 map's name.
pub const NAME6: &str = "cel_lb6_source_range";
/// The bits of the rev-NAT id and pad before the client prefix (`CEL_LB_SRC_RANGE_STATIC_PREFIX`).
pub const STATIC_PREFIX: u32 = 32;

/// Both families' source range maps.
#[derive(Debug)]
pub struct SourceRanges {
    v4: TypedMap<Lb4SrcRangeKey, u8>,
    v6: TypedMap<Lb6SrcRangeKey, u8>,
}

enum Key {
    V4(Lb4SrcRangeKey),
    V6(Lb6SrcRangeKey),
}

fn key(rev_nat_id: u16, net: IpNet) -> Key {
    let net = net.trunc();
    let prefixlen = STATIC_PREFIX + u32::from(net.prefix_len());
    match net.addr() {
        IpAddr::V4(a) => Key::V4(Lb4SrcRangeKey {
            prefixlen,
            rev_nat_id,
            pad: 0,
            addr: a.octets(),
        }),
        IpAddr::V6(a) => Key::V6(Lb6SrcRangeKey {
            prefixlen,
            rev_nat_id,
            pad: 0,
            addr: a.octets(),
        }),
    }
}

fn net(prefixlen: u32, addr: IpAddr) -> Option<IpNet> {
    let len = u8::try_from(prefixlen.checked_sub(STATIC_PREFIX)?).ok()?;
    IpNet::new(addr, len).ok()
}

impl SourceRanges {
    pub(crate) fn new(v4: TypedMap<Lb4SrcRangeKey, u8>, v6: TypedMap<Lb6SrcRangeKey, u8>) -> Self {
        Self { v4, v6 }
    }

    /// Admits clients of `net` (truncated to its prefix) to the frontend `rev_nat_id`.
    pub fn put(&self, rev_nat_id: u16, net: IpNet) -> Result<()> {
        match key(rev_nat_id, net) {
            Key::V4(k) => self.v4.put(&k, &1),
            Key::V6(k) => self.v6.put(&k, &1),
        }
    }

    /// Removes that prefix of the frontend; returns whether it was there.
    pub fn delete(&self, rev_nat_id: u16, net: IpNet) -> Result<bool> {
        match key(rev_nat_id, net) {
            Key::V4(k) => self.v4.delete(&k),
            Key::V6(k) => self.v6.delete(&k),
        }
    }

    /// Every (rev-NAT id, client prefix) of both maps; an entry whose length is out of range
    /// (never written by this agent) is left out.
    pub fn entries(&self) -> Result<BTreeSet<(u16, IpNet)>> {
        let mut all = BTreeSet::new();
        for (k, _) in self.v4.entries()? {
            if let Some(n) = net(k.prefixlen, IpAddr::from(k.addr)) {
                all.insert((k.rev_nat_id, n));
            }
        }
        for (k, _) in self.v6.entries()? {
            if let Some(n) = net(k.prefixlen, IpAddr::from(k.addr)) {
                all.insert((k.rev_nat_id, n));
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_the_whole_rev_nat_id_and_the_prefix() {
        let Key::V4(k) = key(7, "10.1.2.3/24".parse().unwrap()) else {
            panic!("v4")
        };
        assert_eq!(k.prefixlen, 32 + 24);
        assert_eq!(k.addr, [10, 1, 2, 0]);
        assert_eq!(
            net(k.prefixlen, IpAddr::from(k.addr)),
            Some("10.1.2.0/24".parse().unwrap())
        );
        let Key::V6(k) = key(7, "::/0".parse().unwrap()) else {
            panic!("v6")
        };
        assert_eq!(k.prefixlen, 32);
        assert_eq!(
            net(k.prefixlen, IpAddr::from(k.addr)),
            Some("::/0".parse().unwrap())
        );
        assert_eq!(net(5, IpAddr::from([0u8; 4])), None);
    }
}

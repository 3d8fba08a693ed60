//! `cel_ipcache`: IP prefixes -> security identities (an LPM trie; a miss
//! means world).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use crate::abi::{IpcacheKey, IpcacheValue, family_and_bytes, ip_of};
use crate::error::{Error, Result};
use crate::maps::TypedMap;

/// The map name.
pub const NAME: &str = "cel_ipcache";

/// The family and pad bytes every key's prefix covers before the address.
const FAMILY_BITS: u32 = 32;

/// What the datapath knows of a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcacheInfo {
    /// The prefix's security identity.
    pub identity: u32,
    /// Tunnel mode: the node hosting the prefix, towards which traffic to it is encapsulated.
    pub tunnel_endpoint: Option<Ipv4Addr>,
}

impl From<u32> for IpcacheInfo {
    fn from(identity: u32) -> Self {
        IpcacheInfo {
            identity,
            tunnel_endpoint: None,
        }
    }
}

impl IpcacheInfo {
    fn value(self) -> IpcacheValue {
        IpcacheValue {
            identity: self.identity,
            tunnel_endpoint: self
                .tunnel_endpoint
                .map_or(0, |ip| u32::from_ne_bytes(ip.octets())),
        }
    }

    fn of(value: IpcacheValue) -> Self {
        let endpoint = value.tunnel_endpoint.to_ne_bytes();
        IpcacheInfo {
            identity: value.identity,
            tunnel_endpoint: (value.tunnel_endpoint != 0).then(|| Ipv4Addr::from(endpoint)),
        }
    }
}

/// Prefix -> identity (and tunnel endpoint).
#[derive(Debug)]
pub struct Ipcache {
    map: TypedMap<IpcacheKey, IpcacheValue>,
}

pub(crate) fn key_of(net: IpNet) -> IpcacheKey {
    let net = net.trunc();
    let (family, addr) = family_and_bytes(net.addr());
    IpcacheKey {
        prefixlen: FAMILY_BITS + u32::from(net.prefix_len()),
        family,
        pad: [0; 3],
        addr,
    }
}

pub(crate) fn net_of(key: &IpcacheKey) -> Result<IpNet> {
    let bad = || {
        Error::invalid(
            format!("ipcache key {key:?}"),
            "unknown family or prefix length",
        )
    };
    let ip = ip_of(key.family, key.addr).ok_or_else(bad)?;
    let len = key
        .prefixlen
        .checked_sub(FAMILY_BITS)
        .and_then(|l| u8::try_from(l).ok())
        .ok_or_else(bad)?;
    IpNet::new(ip, len).map_err(|_| bad())
}

impl Ipcache {
    pub(crate) fn new(map: TypedMap<IpcacheKey, IpcacheValue>) -> Self {
        Self { map }
    }

    /// Maps every address of `net` (host bits ignored) to `info` (an identity, or an
    /// [`IpcacheInfo`] with a tunnel endpoint).
    pub fn put(&self, net: IpNet, info: impl Into<IpcacheInfo>) -> Result<()> {
        self.map.put(&key_of(net), &info.into().value())
    }

    /// The identity stored for exactly `net`. The kernel's lookup returns
    /// the longest match without saying which prefix matched, so this walks
    /// the map: meant for checks and tools, not hot paths.
    pub fn get(&self, net: IpNet) -> Result<Option<u32>> {
        let key = key_of(net);
        Ok(self
            .map
            .entries()?
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.identity))
    }

    /// The identity the datapath resolves for `addr` (longest prefix), or
    /// `None` for a miss (the datapath then uses world).
    pub fn resolve(&self, addr: IpAddr) -> Result<Option<u32>> {
        Ok(self
            .map
            .get(&key_of(IpNet::from(addr)))?
            .map(|v| v.identity))
    }

    /// Removes the entry for exactly `net`; returns whether it existed.
    pub fn delete(&self, net: IpNet) -> Result<bool> {
        self.map.delete(&key_of(net))
    }

    /// Every prefix with what the datapath knows of it.
    pub fn entries(&self) -> Result<Vec<(IpNet, IpcacheInfo)>> {
        self.map
            .entries()?
            .into_iter()
            .map(|(k, v)| Ok((net_of(&k)?, IpcacheInfo::of(v))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_count_family_bits_and_drop_host_bits() {
        let k = key_of("10.1.2.3/16".parse().unwrap());
        assert_eq!(k.prefixlen, 48);
        assert_eq!(k.family, 4);
        assert_eq!(&k.addr[..4], &[10, 1, 0, 0]);
        assert_eq!(net_of(&k).unwrap(), "10.1.0.0/16".parse::<IpNet>().unwrap());
        let k6 = key_of("fd00::/64".parse().unwrap());
        assert_eq!(k6.prefixlen, 96);
        assert_eq!(k6.family, 6);
    }

    #[test]
    fn bad_keys_are_errors() {
        let k = IpcacheKey {
            prefixlen: 10,
            family: 4,
            pad: [0; 3],
            addr: [0; 16],
        };
        assert!(net_of(&k).is_err());
        let k = IpcacheKey {
            prefixlen: 40,
            family: 9,
            pad: [0; 3],
            addr: [0; 16],
        };
        assert!(net_of(&k).is_err());
    }
}

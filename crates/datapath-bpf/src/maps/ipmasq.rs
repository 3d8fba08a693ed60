//! `cel_ipmasq`: the destinations pods' packets keep their own address to when BPF
//! masquerading is on (an LPM trie of both families, keyed as `cel_ipcache`): the native
//! routing CIDRs, the ip-masq-agent's `nonMasqueradeCIDRs` and other nodes' pod CIDRs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use ipnet::IpNet;

use crate::abi::IpcacheKey;
use crate::error::Result;
use crate::maps::TypedMap;
use crate::maps::ipcache::{key_of, net_of};

/// The map name.
pub const NAME: &str = "cel_ipmasq";

/// A reason bit: an `ipv4-native-routing-cidr` or `ipv6-native-routing-cidr`.
pub const NATIVE_ROUTING: u8 = 1;
/// A reason bit: one of the ip-masq-agent's `nonMasqueradeCIDRs` (or link-local).
pub const AGENT: u8 = 2;
/// A reason bit: another node's pod CIDR (node discovery's).
pub const POD_CIDR: u8 = 4;

/// Prefix -> why it is not masqueraded: the bits of the owners that name it, each owner
/// syncing its own bit ([`NonMasquerade::sync`]), so that a prefix two of them name stays
/// until neither does.
#[derive(Debug)]
pub struct NonMasquerade {
    map: TypedMap<IpcacheKey, u8>,
    /// Serializes the read-modify-write of the owners' bits.
    write: Mutex<()>,
}

impl NonMasquerade {
    pub(crate) fn new(map: TypedMap<IpcacheKey, u8>) -> Self {
        Self {
            map,
            write: Mutex::new(()),
        }
    }

    /// Makes `reason` (one bit) name exactly `wanted`: its bit set on those prefixes first,
    /// then cleared from the others (an entry left with no bit is removed), so a prefix kept
    /// is never missing meanwhile. Returns how many entries were written and removed.
    pub fn sync(&self, reason: u8, wanted: &BTreeSet<IpNet>) -> Result<(usize, usize)> {
        let _write = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let have = self.entries()?;
        let wanted: BTreeSet<IpNet> = wanted.iter().map(IpNet::trunc).collect();
        let mut written = 0;
        for net in &wanted {
            let bits = have.get(net).copied().unwrap_or(0);
            if bits & reason == 0 {
                self.map.put(&key_of(*net), &(bits | reason))?;
                written += 1;
            }
        }
        let mut removed = 0;
        for (net, bits) in have
            .iter()
            .filter(|(n, b)| *b & reason != 0 && !wanted.contains(n))
        {
            let rest = bits & !reason;
            if rest != 0 {
                self.map.put(&key_of(*net), &rest)?;
                written += 1;
            } else if self.map.delete(&key_of(*net))? {
                removed += 1;
            }
        }
        Ok((written, removed))
    }

    /// The prefixes `reason` names.
    pub fn named_by(&self, reason: u8) -> Result<BTreeSet<IpNet>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|(_, bits)| bits & reason != 0)
            .map(|(net, _)| net)
            .collect())
    }

    /// Every prefix with its reason bits.
    pub fn entries(&self) -> Result<BTreeMap<IpNet, u8>> {
        self.map
            .entries()?
            .into_iter()
            .map(|(k, v)| Ok((net_of(&k)?, v)))
            .collect()
    }
}

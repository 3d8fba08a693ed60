//! `cel_snat4` and `cel_snat6`: the source translations of NodePort (a client from outside
//! sent to another node's backend) and of masquerading (a pod's connection to the world), and
//! their collection.
//!
//! Each translated connection has two entries: its client's tuple (flag
//! [`SNAT_F_FORWARD`]) -> the source it was given, and the reply's tuple -> the client. The
//! datapath writes the reply's first, after the connection's conntrack entry; both live in
//! an LRU, which bounds them. The collector, run after conntrack's, removes what no live
//! connection needs: a forward entry whose connection has no conntrack entry left (closed
//! and collected, or evicted), with its reply entry; and a reply entry that has neither its
//! forward entry nor its connection (the forward one was evicted). A connection that is only
//! idle keeps its conntrack entry, hence its translation; one whose conntrack entry the
//! datapath just re-created (an expired entry revived by a packet) finds its forward entry
//! again and keeps its port, unless a pass ran in between, when it gets a new one, as after
//! any expiry. DSR entries (`CEL_SNAT_F_DSR`) are left to the LRU.

use std::hash::Hash;

use crate::abi::{Ct6Key, CtEntry, CtKey, Plain, SNAT_F_FORWARD, Snat4Value, Snat6Value};
use crate::error::Result;
use crate::maps::TypedMap;

/// The IPv4 map name.
pub const NAME: &str = "cel_snat4";
/// The IPv6 map name.
pub const NAME6: &str = "cel_snat6";

/// A family's conntrack key and translation, as `cel_snat4`/`cel_snat6` hold them.
pub(crate) trait SnatFamily {
    /// The tuple (`ct_key`, `ct6_key`).
    type Key: Plain + Copy + Eq + Hash;
    /// The translation (`snat4_value`, `snat6_value`).
    type Value: Plain + Copy + Eq;

    /// The key's `flags`.
    fn flags(k: &Self::Key) -> u8;
    /// `k` with `flags`.
    fn with_flags(k: &Self::Key, flags: u8) -> Self::Key;
    /// For a client's tuple `k` given source `v`: the reply's tuple and the client it names.
    fn reply(k: &Self::Key, v: &Self::Value) -> (Self::Key, Self::Value);
    /// For a reply's tuple `k` naming client `v`: the client's tuple (flags 0).
    fn client(k: &Self::Key, v: &Self::Value) -> Self::Key;
}

/// IPv4.
pub(crate) struct V4;
/// IPv6.
pub(crate) struct V6;

impl SnatFamily for V4 {
    type Key = CtKey;
    type Value = Snat4Value;

    fn flags(k: &CtKey) -> u8 {
        k.flags
    }
    fn with_flags(k: &CtKey, flags: u8) -> CtKey {
        CtKey { flags, ..*k }
    }
    fn reply(k: &CtKey, v: &Snat4Value) -> (CtKey, Snat4Value) {
        let rk = CtKey {
            saddr: k.daddr,
            daddr: v.addr,
            sport: k.dport,
            dport: v.port,
            protocol: k.protocol,
            flags: 0,
            pad: 0,
        };
        let client = Snat4Value {
            addr: k.saddr,
            port: k.sport,
            pad: 0,
        };
        (rk, client)
    }
    fn client(k: &CtKey, v: &Snat4Value) -> CtKey {
        CtKey {
            saddr: v.addr,
            daddr: k.saddr,
            sport: v.port,
            dport: k.sport,
            protocol: k.protocol,
            flags: 0,
            pad: 0,
        }
    }
}

impl SnatFamily for V6 {
    type Key = Ct6Key;
    type Value = Snat6Value;

    fn flags(k: &Ct6Key) -> u8 {
        k.flags
    }
    fn with_flags(k: &Ct6Key, flags: u8) -> Ct6Key {
        Ct6Key { flags, ..*k }
    }
    fn reply(k: &Ct6Key, v: &Snat6Value) -> (Ct6Key, Snat6Value) {
        let rk = Ct6Key {
            saddr: k.daddr,
            daddr: v.addr,
            sport: k.dport,
            dport: v.port,
            protocol: k.protocol,
            flags: 0,
            pad: 0,
        };
        let client = Snat6Value {
            addr: k.saddr,
            port: k.sport,
            pad: 0,
        };
        (rk, client)
    }
    fn client(k: &Ct6Key, v: &Snat6Value) -> Ct6Key {
        Ct6Key {
            saddr: v.addr,
            daddr: k.saddr,
            sport: v.port,
            dport: k.sport,
            protocol: k.protocol,
            flags: 0,
            pad: 0,
        }
    }
}

/// One family's translations beside its connection table.
pub(crate) struct SnatTable<F: SnatFamily> {
    pub(crate) snat: TypedMap<F::Key, F::Value>,
}

impl<F: SnatFamily> std::fmt::Debug for SnatTable<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnatTable").finish_non_exhaustive()
    }
}

impl<F: SnatFamily> SnatTable<F> {
    /// Removes the entries no live connection of `ct` needs (see the module docs); returns how
    /// many.
    pub(crate) fn collect(&self, ct: &TypedMap<F::Key, CtEntry>) -> Result<usize> {
        let live = |client: &F::Key| -> Result<bool> { Ok(ct.get(client)?.is_some()) };
        let mut deleted = 0;
        for (k, v) in self.snat.entries()? {
            match F::flags(&k) {
                SNAT_F_FORWARD => {
                    if live(&F::with_flags(&k, 0))? {
                        continue;
                    }
                    deleted += usize::from(self.snat.delete(&k)?);
                    let (rk, client) = F::reply(&k, &v);
                    if self.snat.get(&rk)? == Some(client) {
                        deleted += usize::from(self.snat.delete(&rk)?);
                    }
                }
                0 => {
                    let client = F::client(&k, &v);
                    let forward = F::with_flags(&client, SNAT_F_FORWARD);
                    if self.snat.get(&forward)?.is_none() && !live(&client)? {
                        deleted += usize::from(self.snat.delete(&k)?);
                    }
                }
                _ => {}
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forward_entry_and_its_reply_name_each_other() {
        let k = CtKey {
            saddr: 0x0a00_0001,
            daddr: 0xc000_02c8,
            sport: 40000u16.to_be(),
            dport: 80u16.to_be(),
            protocol: 6,
            flags: SNAT_F_FORWARD,
            pad: 0,
        };
        let given = Snat4Value {
            addr: 0xc000_0201,
            port: 61000u16.to_be(),
            pad: 0,
        };
        let (rk, client) = V4::reply(&k, &given);
        assert_eq!((rk.saddr, rk.daddr, rk.flags), (k.daddr, given.addr, 0));
        assert_eq!((rk.sport, rk.dport), (k.dport, given.port));
        assert_eq!(V4::client(&rk, &client), V4::with_flags(&k, 0));
        let k6 = Ct6Key {
            saddr: [1; 16],
            daddr: [2; 16],
            sport: 1,
            dport: 2,
            protocol: 17,
            flags: SNAT_F_FORWARD,
            pad: 0,
        };
        let given6 = Snat6Value {
            addr: [3; 16],
            port: 3,
            pad: 0,
        };
        let (rk6, client6) = V6::reply(&k6, &given6);
        assert_eq!(V6::client(&rk6, &client6), V6::with_flags(&k6, 0));
    }
}

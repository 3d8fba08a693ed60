//! The desired state: every prefix with its claims, and longest-prefix lookups.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use cellium_datapath_bpf::IpcacheInfo;
use ipnet::IpNet;

use crate::source::Source;

/// A prefix as `cellium ipcache list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcacheEntry {
    /// The prefix (host bits cleared).
    pub prefix: IpNet,
    /// The identity in effect: that of the highest-precedence claim.
    pub identity: u32,
    /// Tunnel mode: the node that claim says hosts the prefix (traffic to it is encapsulated
    /// towards it).
    pub tunnel_endpoint: Option<Ipv4Addr>,
    /// Who made that claim.
    pub source: Source,
    /// The lower-precedence claims on the same prefix, highest first.
    pub shadowed: Vec<(Source, u32)>,
}

/// The claims on one prefix, by source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Claims([Option<IpcacheInfo>; Source::BY_PRECEDENCE.len()]);

impl Claims {
    fn effective(&self) -> Option<(Source, IpcacheInfo)> {
        self.ordered().next()
    }

    fn ordered(&self) -> impl Iterator<Item = (Source, IpcacheInfo)> + '_ {
        Source::BY_PRECEDENCE
            .into_iter()
            .filter_map(|s| self.0[s.index()].map(|info| (s, info)))
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// What a change did to what a prefix has in effect (identity and tunnel endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) prefix: IpNet,
    pub(crate) before: Option<IpcacheInfo>,
    pub(crate) after: Option<IpcacheInfo>,
}

impl Change {
    /// Whether the datapath needs to hear about it.
    pub(crate) fn is_visible(&self) -> bool {
        self.before != self.after
    }
}

/// Prefixes and their claims.
///
/// Longest-prefix lookups probe one hash lookup per prefix length in use, longest first:
/// at most 33 for IPv4 and 129 for IPv6, usually a handful.
#[derive(Debug, Default)]
pub(crate) struct PrefixTable {
    entries: HashMap<IpNet, Claims>,
    /// How many prefixes of each (is IPv6, length) there are.
    lengths: BTreeMap<(bool, u8), usize>,
}

impl PrefixTable {
    /// Records `source`'s claim of `prefix` for `info` (an identity, perhaps with a tunnel
    /// endpoint), replacing its earlier claim.
    pub(crate) fn claim(
        &mut self,
        prefix: IpNet,
        source: Source,
        info: impl Into<IpcacheInfo>,
    ) -> Change {
        let prefix = prefix.trunc();
        let claims = self.entries.entry(prefix).or_default();
        let before = claims.effective().map(|(_, info)| info);
        if claims.is_empty() {
            *self.lengths.entry(length_key(prefix)).or_default() += 1;
        }
        claims.0[source.index()] = Some(info.into());
        let after = claims.effective().map(|(_, info)| info);
        Change {
            prefix,
            before,
            after,
        }
    }

    /// Removes `source`'s claim of `prefix`; `None` if it had none.
    pub(crate) fn unclaim(&mut self, prefix: IpNet, source: Source) -> Option<Change> {
        let prefix = prefix.trunc();
        let claims = self.entries.get_mut(&prefix)?;
        let before = claims.effective().map(|(_, info)| info);
        claims.0[source.index()].take()?;
        let after = claims.effective().map(|(_, info)| info);
        if claims.is_empty() {
            self.entries.remove(&prefix);
            let key = length_key(prefix);
            if let Some(n) = self.lengths.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.lengths.remove(&key);
                }
            }
        }
        Some(Change {
            prefix,
            before,
            after,
        })
    }

    /// The longest prefix containing `ip`, with the identity in effect and its source.
    pub(crate) fn lookup(&self, ip: IpAddr) -> Option<(IpNet, u32, Source)> {
        let v6 = ip.is_ipv6();
        self.lengths
            .range((v6, 0)..=(v6, u8::MAX))
            .rev()
            .find_map(|(&(_, len), _)| {
                let net = IpNet::new(ip, len).ok()?.trunc();
                let (source, info) = self.entries.get(&net)?.effective()?;
                Some((net, info.identity, source))
            })
    }

    /// The entry of exactly `prefix`.
    pub(crate) fn get(&self, prefix: IpNet) -> Option<IpcacheEntry> {
        let prefix = prefix.trunc();
        self.entries.get(&prefix).and_then(|c| entry(prefix, c))
    }

    /// Every entry, ordered by prefix.
    pub(crate) fn list(&self) -> Vec<IpcacheEntry> {
        let mut out: Vec<IpcacheEntry> = self
            .entries
            .iter()
            .filter_map(|(p, c)| entry(*p, c))
            .collect();
        out.sort_by_key(|e| e.prefix);
        out
    }

    /// Every prefix with what the datapath should see.
    pub(crate) fn desired(&self) -> HashMap<IpNet, IpcacheInfo> {
        self.entries
            .iter()
            .filter_map(|(p, c)| c.effective().map(|(_, info)| (*p, info)))
            .collect()
    }

    /// The identity `source` claims for exactly `prefix`, if it has a claim.
    pub(crate) fn claim_of(&self, prefix: IpNet, source: Source) -> Option<u32> {
        self.entries.get(&prefix.trunc())?.0[source.index()].map(|info| info.identity)
    }

    /// The prefixes `source` claims.
    pub(crate) fn claimed_by(&self, source: Source) -> Vec<IpNet> {
        self.entries
            .iter()
            .filter(|(_, c)| c.0[source.index()].is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    /// How many prefixes there are.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

fn entry(prefix: IpNet, claims: &Claims) -> Option<IpcacheEntry> {
    let mut ordered = claims.ordered();
    let (source, info) = ordered.next()?;
    Some(IpcacheEntry {
        prefix,
        identity: info.identity,
        tunnel_endpoint: info.tunnel_endpoint,
        source,
        shadowed: ordered.map(|(s, info)| (s, info.identity)).collect(),
    })
}

fn length_key(prefix: IpNet) -> (bool, u8) {
    (matches!(prefix, IpNet::V6(_)), prefix.prefix_len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(c: Change) -> (Option<u32>, Option<u32>) {
        (c.before.map(|i| i.identity), c.after.map(|i| i.identity))
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_longest_prefix_wins() {
        let mut t = PrefixTable::default();
        t.claim(net("10.0.0.0/8"), Source::Policy, 100);
        t.claim(net("10.1.0.0/16"), Source::Policy, 200);
        t.claim(net("10.1.2.3/32"), Source::Endpoint, 300);
        t.claim(net("0.0.0.0/0"), Source::Policy, 400);
        let l = |t: &PrefixTable, s| t.lookup(ip(s)).map(|(p, id, _)| (p.to_string(), id));
        assert_eq!(l(&t, "10.1.2.3"), Some(("10.1.2.3/32".into(), 300)));
        assert_eq!(l(&t, "10.1.2.4"), Some(("10.1.0.0/16".into(), 200)));
        assert_eq!(l(&t, "10.2.0.1"), Some(("10.0.0.0/8".into(), 100)));
        assert_eq!(l(&t, "192.168.0.1"), Some(("0.0.0.0/0".into(), 400)));
        // IPv6 addresses never match IPv4 prefixes, not even 0.0.0.0/0.
        assert_eq!(l(&t, "fd00::1"), None);
        t.claim(net("fd00::/64"), Source::Policy, 500);
        assert_eq!(l(&t, "fd00::1"), Some(("fd00::/64".into(), 500)));
        assert_eq!(l(&t, "fd01::1"), None);
    }

    #[test]
    fn higher_precedence_claims_shadow_lower_ones() {
        let mut t = PrefixTable::default();
        let p = net("10.0.0.5/32");
        let c = t.claim(p, Source::Policy, 16_777_216);
        assert_eq!(ids(c), (None, Some(16_777_216)));
        let c = t.claim(p, Source::Endpoint, 300);
        assert_eq!(ids(c), (Some(16_777_216), Some(300)));
        let c = t.claim(p, Source::Host, 1);
        assert!(
            !c.is_visible(),
            "a host claim under an endpoint changes nothing"
        );
        let e = t.get(p).unwrap();
        assert_eq!((e.identity, e.source), (300, Source::Endpoint));
        assert_eq!(
            e.shadowed,
            vec![(Source::Host, 1), (Source::Policy, 16_777_216)]
        );
        // Deleting a claim reveals the next one.
        let c = t.unclaim(p, Source::Endpoint).unwrap();
        assert_eq!(ids(c), (Some(300), Some(1)));
        let c = t.unclaim(p, Source::Host).unwrap();
        assert_eq!(ids(c).1, Some(16_777_216));
        assert!(t.unclaim(p, Source::Host).is_none());
        let c = t.unclaim(p, Source::Policy).unwrap();
        assert_eq!(c.after, None);
        assert_eq!(t.len(), 0);
        assert!(t.lookup(ip("10.0.0.5")).is_none());
    }

    #[test]
    fn host_bits_are_cleared_and_listing_is_ordered() {
        let mut t = PrefixTable::default();
        t.claim(net("10.9.9.9/8"), Source::Policy, 7);
        t.claim(net("fd00::/64"), Source::Policy, 8);
        t.claim(net("1.0.0.0/8"), Source::Policy, 9);
        let list: Vec<String> = t.list().iter().map(|e| e.prefix.to_string()).collect();
        assert_eq!(list, vec!["1.0.0.0/8", "10.0.0.0/8", "fd00::/64"]);
        assert_eq!(t.desired()[&net("10.0.0.0/8")].identity, 7);
        assert_eq!(t.claimed_by(Source::Policy).len(), 3);
        assert!(t.claimed_by(Source::Host).is_empty());
    }

    #[test]
    fn a_reclaim_replaces_the_source_own_claim() {
        let mut t = PrefixTable::default();
        t.claim(net("10.0.0.1/32"), Source::Endpoint, 300);
        let c = t.claim(net("10.0.0.1/32"), Source::Endpoint, 301);
        assert_eq!(ids(c), (Some(300), Some(301)));
        assert!(t.get(net("10.0.0.1/32")).unwrap().shadowed.is_empty());
    }
}

//! The named container ports of the pods behind prefixes, and the union of them per identity:
//! what the port names of egress policy rules resolve against (a rule naming `http` allows, to
//! each peer identity, the numbers its pods call `http`).
//!
//! Ports belong to a claim: the endpoint manager's for a local pod's address (a feed of remote
//! endpoints would do the same with its own claims). They count for the identity the prefix has
//! in effect, and only while their claim is the one in effect: the datapath classifies the
//! address by that claim alone.

use std::collections::{BTreeMap, HashMap};

use cellium_resources::NamedPort;
use ipnet::IpNet;

use crate::source::Source;
use crate::table::PrefixTable;

/// Named ports by prefix and claim.
#[derive(Debug, Default)]
pub(crate) struct NamedPortTable {
    by_prefix: HashMap<IpNet, BTreeMap<Source, Vec<NamedPort>>>,
}

impl NamedPortTable {
    /// Makes `ports` those of `source`'s claim on `prefix` (none: forgets them). Returns
    /// whether anything changed.
    pub(crate) fn set(&mut self, prefix: IpNet, source: Source, ports: &[NamedPort]) -> bool {
        let prefix = prefix.trunc();
        let ports = canonical(ports);
        if ports.is_empty() {
            return self.remove(prefix, source);
        }
        let claims = self.by_prefix.entry(prefix).or_default();
        if claims.get(&source) == Some(&ports) {
            return false;
        }
        claims.insert(source, ports);
        true
    }

    /// Forgets the ports of `source`'s claim on `prefix`; returns whether it had any.
    pub(crate) fn remove(&mut self, prefix: IpNet, source: Source) -> bool {
        let prefix = prefix.trunc();
        let Some(claims) = self.by_prefix.get_mut(&prefix) else {
            return false;
        };
        let had = claims.remove(&source).is_some();
        if claims.is_empty() {
            self.by_prefix.remove(&prefix);
        }
        had
    }

    /// Whether any claim on `prefix` has ports: a change of the prefix's identity in effect
    /// then moves them to another identity.
    pub(crate) fn has(&self, prefix: IpNet) -> bool {
        self.by_prefix.contains_key(&prefix.trunc())
    }

    /// The ports of the claims in effect, united per identity, each list sorted.
    pub(crate) fn by_identity(&self, table: &PrefixTable) -> BTreeMap<u32, Vec<NamedPort>> {
        let mut out: BTreeMap<u32, Vec<NamedPort>> = BTreeMap::new();
        for (prefix, claims) in &self.by_prefix {
            let Some(entry) = table.get(*prefix) else {
                continue;
            };
            if let Some(ports) = claims.get(&entry.source) {
                out.entry(entry.identity)
                    .or_default()
                    .extend(ports.iter().cloned());
            }
        }
        for ports in out.values_mut() {
            *ports = canonical(ports);
        }
        out
    }
}

/// Sorted by (name, protocol, port), without duplicates: equal sets compare equal.
fn canonical(ports: &[NamedPort]) -> Vec<NamedPort> {
    let mut out = ports.to_vec();
    out.sort_by(|a, b| (&a.name, a.protocol, a.port).cmp(&(&b.name, b.protocol, b.port)));
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_resources::Protocol;

    fn port(name: &str, port: u16) -> NamedPort {
        NamedPort {
            name: name.into(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn ports_count_for_the_identity_in_effect() {
        let mut table = PrefixTable::default();
        let mut ports = NamedPortTable::default();
        table.claim(net("10.0.0.1/32"), Source::Endpoint, 300);
        table.claim(net("10.0.0.2/32"), Source::Endpoint, 300);
        table.claim(net("10.0.0.3/32"), Source::Endpoint, 301);
        assert!(ports.set(net("10.0.0.1/32"), Source::Endpoint, &[port("http", 80)]));
        assert!(!ports.set(net("10.0.0.1/32"), Source::Endpoint, &[port("http", 80)]));
        ports.set(
            net("10.0.0.2/32"),
            Source::Endpoint,
            &[port("http", 8080), port("http", 80)],
        );
        ports.set(net("10.0.0.3/32"), Source::Endpoint, &[port("sql", 5432)]);
        let by_id = ports.by_identity(&table);
        // Two pods of one identity naming `http` differently: the identity has both.
        assert_eq!(by_id[&300], vec![port("http", 80), port("http", 8080)]);
        assert_eq!(by_id[&301], vec![port("sql", 5432)]);

        // A claim that is not in effect does not count.
        ports.set(net("10.0.0.3/32"), Source::Policy, &[port("dns", 53)]);
        table.claim(net("10.0.0.3/32"), Source::Policy, 16_777_216);
        assert!(!ports.by_identity(&table).contains_key(&16_777_216));

        // A prefix's new identity takes its ports along.
        table.claim(net("10.0.0.3/32"), Source::Endpoint, 302);
        let by_id = ports.by_identity(&table);
        assert!(!by_id.contains_key(&301));
        assert_eq!(by_id[&302], vec![port("sql", 5432)]);

        assert!(ports.set(net("10.0.0.3/32"), Source::Endpoint, &[]));
        assert!(ports.remove(net("10.0.0.3/32"), Source::Policy));
        assert!(!ports.has(net("10.0.0.3/32")));
        assert!(!ports.remove(net("10.0.0.3/32"), Source::Policy));
    }
}

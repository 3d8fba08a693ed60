//! Turning policy rules into consistent LPM entries.
//!
//! The datapath decides with two longest-prefix lookups (the peer's identity
//! and "any"), where within one identity the longest entry wins. Rules do
//! not have that shape: "deny TCP" and "allow TCP 80-90" for one identity
//! must deny port 85, yet an allow block for 80-90 would be longer than the
//! deny. [`compile`] computes, per (identity, direction), what each protocol
//! and port must answer (deny if any deny rule covers it, else allow if any
//! allow rule does, else nothing) and emits entries whose longest match
//! gives exactly that answer, splitting port ranges into aligned blocks.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use crate::entry::{L4Match, PolicyEntry};
use crate::error::{Error, Result};
use crate::types::{Direction, Protocol, Verdict};

/// One rule of an endpoint's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// Peer identity; 0 = any identity.
    pub identity: u32,
    /// Direction relative to the endpoint.
    pub direction: Direction,
    /// `None` = every protocol (with `ports`: TCP, UDP and SCTP).
    pub protocol: Option<Protocol>,
    /// Destination ports; `None` = all. Only for protocols with ports.
    pub ports: Option<RangeInclusive<u16>>,
    /// Allow or deny.
    pub verdict: Verdict,
}

/// Sorted, disjoint, non-adjacent inclusive port intervals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PortSet(Vec<(u32, u32)>);

const MAX_PORT: u32 = 65535;

impl PortSet {
    fn is_full(&self) -> bool {
        self.0 == [(0, MAX_PORT)]
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn add(&mut self, lo: u32, hi: u32) {
        self.0.push((lo, hi));
        self.0.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.0.len());
        for &(l, h) in &self.0 {
            match merged.last_mut() {
                Some(last) if l <= last.1 + 1 => last.1 = last.1.max(h),
                _ => merged.push((l, h)),
            }
        }
        self.0 = merged;
    }

    fn minus(&self, other: &PortSet) -> PortSet {
        let mut out = Vec::new();
        for &(lo, hi) in &self.0 {
            let mut start = lo;
            for &(ol, oh) in &other.0 {
                if oh < start || ol > hi {
                    continue;
                }
                if ol > start {
                    out.push((start, ol - 1));
                }
                start = oh + 1;
            }
            if start <= hi {
                out.push((start, hi));
            }
        }
        PortSet(out)
    }

    /// Aligned power-of-two blocks covering exactly the set: (port, prefix bits).
    fn blocks(&self) -> Vec<(u16, u8)> {
        let mut out = Vec::new();
        for &(lo, hi) in &self.0 {
            let mut start = lo;
            while start <= hi {
                // The largest block aligned at `start` that stays within hi.
                let mut size_log = if start == 0 {
                    16
                } else {
                    start.trailing_zeros().min(16)
                };
                while start + (1 << size_log) - 1 > hi {
                    size_log -= 1;
                }
                out.push((start as u16, (16 - size_log) as u8));
                start += 1 << size_log;
            }
        }
        out
    }
}

/// What one (identity, direction) says per protocol.
#[derive(Debug, Default)]
struct Group {
    any_allow: bool,
    any_deny: bool,
    any_audit: bool,
    allow: BTreeMap<Protocol, PortSet>,
    deny: BTreeMap<Protocol, PortSet>,
    audit: BTreeMap<Protocol, PortSet>,
}

fn validate(rule: &PolicyRule) -> Result<()> {
    let bad = |why: &str| Error::InvalidRule {
        rule: format!("{rule:?}"),
        reason: why.to_owned(),
    };
    if let Some(ports) = &rule.ports {
        if ports.start() > ports.end() {
            return Err(bad("the port range is empty"));
        }
        if let Some(p) = rule.protocol.filter(|p| !p.has_ports() && !p.is_icmp()) {
            return Err(bad(&format!("{p} has no ports")));
        }
        if rule.protocol.is_some_and(Protocol::is_icmp) && *ports.end() > 255 {
            return Err(bad("an ICMP type is 0-255"));
        }
    }
    Ok(())
}

/// Compiles an endpoint's rules into policy map entries (see module docs).
/// The result is sorted and free of redundant entries.
pub fn compile(endpoint_id: u16, rules: &[PolicyRule]) -> Result<Vec<(PolicyEntry, Verdict)>> {
    let mut groups: BTreeMap<(u32, Direction), Group> = BTreeMap::new();
    for rule in rules {
        validate(rule)?;
        let g = groups.entry((rule.identity, rule.direction)).or_default();
        let protocols: Vec<Protocol> = match (rule.protocol, &rule.ports) {
            (Some(p), _) => vec![p],
            // "Port 80" without a protocol means every protocol with ports.
            (None, Some(_)) => vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp],
            (None, None) => {
                match rule.verdict {
                    Verdict::Allow => g.any_allow = true,
                    Verdict::Deny => g.any_deny = true,
                    Verdict::AuditDeny => g.any_audit = true,
                }
                continue;
            }
        };
        let (lo, hi) = rule.ports.as_ref().map_or((0, MAX_PORT), |r| {
            (u32::from(*r.start()), u32::from(*r.end()))
        });
        let sets = match rule.verdict {
            Verdict::Allow => &mut g.allow,
            Verdict::Deny => &mut g.deny,
            Verdict::AuditDeny => &mut g.audit,
        };
        for p in protocols {
            sets.entry(p).or_default().add(lo, hi);
        }
    }

    let mut out = BTreeSet::new();
    for ((identity, direction), g) in groups {
        let entry = |l4| PolicyEntry {
            endpoint_id,
            direction,
            identity,
            l4,
        };
        if g.any_deny {
            // Denies everything: nothing else can matter.
            out.insert((entry(L4Match::Any), Verdict::Deny));
            continue;
        }
        // An audited deny of everything outranks an allow of everything, and leaves no room
        // for a narrower allow (it would be longer, and win).
        if g.any_audit {
            out.insert((entry(L4Match::Any), Verdict::AuditDeny));
        } else if g.any_allow {
            out.insert((entry(L4Match::Any), Verdict::Allow));
        }
        let protocols: BTreeSet<Protocol> = (g.allow.keys())
            .chain(g.deny.keys())
            .chain(g.audit.keys())
            .copied()
            .collect();
        for p in protocols {
            let deny = g.deny.get(&p).cloned().unwrap_or_default();
            let audit = g.audit.get(&p).cloned().unwrap_or_default();
            let allow = g.allow.get(&p).cloned().unwrap_or_default();
            let port_entries = |set: &PortSet, verdict, out: &mut BTreeSet<_>| {
                for (port, prefix_bits) in set.blocks() {
                    out.insert((
                        entry(L4Match::PortBlock {
                            protocol: p,
                            port,
                            prefix_bits,
                        }),
                        verdict,
                    ));
                }
            };
            if deny.is_full() {
                out.insert((entry(L4Match::Protocol(p)), Verdict::Deny));
                continue;
            }
            // Deny blocks are always needed: a deny must also beat the other
            // lookup's (identity 0 or the peer's) allow. Audited ones alike.
            port_entries(&deny, Verdict::Deny, &mut out);
            if audit.is_full() {
                // The deny blocks are longer, so they win; nothing is left to allow.
                out.insert((entry(L4Match::Protocol(p)), Verdict::AuditDeny));
                continue;
            }
            port_entries(&audit.minus(&deny), Verdict::AuditDeny, &mut out);
            if g.any_allow || g.any_audit || allow.is_empty() {
                continue;
            }
            if allow.is_full() {
                // The deny and audit blocks are longer than this entry, so they win.
                out.insert((entry(L4Match::Protocol(p)), Verdict::Allow));
            } else {
                port_entries(&allow.minus(&deny).minus(&audit), Verdict::Allow, &mut out);
            }
        }
    }
    Ok(out.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{Decision, decide};

    fn rule(
        identity: u32,
        protocol: Option<Protocol>,
        ports: Option<RangeInclusive<u16>>,
        verdict: Verdict,
    ) -> PolicyRule {
        PolicyRule {
            identity,
            direction: Direction::Ingress,
            protocol,
            ports,
            verdict,
        }
    }

    /// The model's decision as a verdict (`None`: nothing matched).
    fn decided(
        entries: &[(PolicyEntry, Verdict)],
        identity: u32,
        protocol: Protocol,
        port: u16,
    ) -> Option<Verdict> {
        match decide(entries, Direction::Ingress, identity, protocol, port) {
            Decision::Allowed => Some(Verdict::Allow),
            Decision::Denied => Some(Verdict::Deny),
            Decision::Audited => Some(Verdict::AuditDeny),
            Decision::NoMatch => None,
        }
    }

    /// The rules' meaning, evaluated directly.
    fn intended(
        rules: &[PolicyRule],
        identity: u32,
        protocol: Protocol,
        port: u16,
    ) -> Option<Verdict> {
        let matching: Vec<&PolicyRule> = rules
            .iter()
            .filter(|r| r.direction == Direction::Ingress)
            .filter(|r| r.identity == identity || r.identity == 0)
            .filter(|r| match (r.protocol, &r.ports) {
                (None, None) => true,
                (None, Some(_)) => protocol.has_ports(),
                (Some(p), _) => p == protocol,
            })
            .filter(|r| r.ports.as_ref().is_none_or(|range| range.contains(&port)))
            .collect();
        if matching.iter().any(|r| r.verdict == Verdict::Deny) {
            Some(Verdict::Deny)
        } else if matching.iter().any(|r| r.verdict == Verdict::AuditDeny) {
            Some(Verdict::AuditDeny)
        } else if matching.is_empty() {
            None
        } else {
            Some(Verdict::Allow)
        }
    }

    fn check_equivalent(rules: &[PolicyRule]) {
        let entries = compile(1, rules).unwrap();
        for identity in [0, 5, 6] {
            for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Icmp] {
                for port in (0..=1100).chain([8079, 8080, 8081, 65534, 65535]) {
                    let port = if protocol == Protocol::Icmp { 0 } else { port };
                    assert_eq!(
                        decided(&entries, identity, protocol, port),
                        intended(rules, identity, protocol, port),
                        "identity {identity} {protocol} port {port}: entries {entries:#?}"
                    );
                }
            }
        }
    }

    #[test]
    fn ranges_become_aligned_blocks() {
        let mut s = PortSet::default();
        s.add(80, 90);
        assert_eq!(s.blocks(), vec![(80, 13), (88, 15), (90, 16)]);
        assert_eq!(PortSet(vec![(0, MAX_PORT)]).blocks(), vec![(0, 0)]);
        let mut one = PortSet::default();
        one.add(443, 443);
        assert_eq!(one.blocks(), vec![(443, 16)]);
        let mut top = PortSet::default();
        top.add(32768, 65535);
        assert_eq!(top.blocks(), vec![(32768, 1)]);
    }

    #[test]
    fn sets_merge_and_subtract() {
        let mut s = PortSet::default();
        s.add(10, 20);
        s.add(21, 30);
        s.add(5, 12);
        assert_eq!(s.0, vec![(5, 30)]);
        let mut d = PortSet::default();
        d.add(8, 9);
        d.add(30, 40);
        assert_eq!(s.minus(&d).0, vec![(5, 7), (10, 29)]);
    }

    #[test]
    fn a_broader_deny_overrides_narrower_allows() {
        let rules = [
            rule(5, Some(Protocol::Tcp), Some(80..=90), Verdict::Allow),
            rule(5, Some(Protocol::Tcp), None, Verdict::Deny),
        ];
        let entries = compile(1, &rules).unwrap();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].1, Verdict::Deny);
        check_equivalent(&rules);
    }

    #[test]
    fn a_narrow_deny_punches_through_an_allow() {
        let rules = [
            rule(5, Some(Protocol::Tcp), Some(1..=1000), Verdict::Allow),
            rule(5, Some(Protocol::Tcp), Some(22..=22), Verdict::Deny),
            rule(6, None, None, Verdict::Allow),
            rule(6, Some(Protocol::Udp), Some(53..=53), Verdict::Deny),
        ];
        check_equivalent(&rules);
    }

    #[test]
    fn identity_any_and_specific_identities_combine() {
        let rules = [
            rule(0, Some(Protocol::Tcp), Some(8080..=8080), Verdict::Allow),
            rule(5, Some(Protocol::Tcp), Some(8000..=8100), Verdict::Deny),
            rule(6, Some(Protocol::Icmp), None, Verdict::Allow),
            rule(0, None, Some(1000..=1003), Verdict::Allow),
        ];
        check_equivalent(&rules);
    }

    #[test]
    fn audited_denies_rank_between_denies_and_allows() {
        let rules = [
            rule(5, Some(Protocol::Tcp), Some(1..=1000), Verdict::Allow),
            rule(5, Some(Protocol::Tcp), Some(20..=30), Verdict::AuditDeny),
            rule(5, Some(Protocol::Tcp), Some(22..=22), Verdict::Deny),
            rule(0, Some(Protocol::Udp), None, Verdict::AuditDeny),
            rule(6, Some(Protocol::Udp), Some(53..=53), Verdict::Allow),
            rule(6, Some(Protocol::Udp), Some(60..=70), Verdict::Deny),
            rule(0, Some(Protocol::Tcp), Some(80..=80), Verdict::Allow),
        ];
        check_equivalent(&rules);
        // An audited deny of everything: only enforced denies punch through it.
        let rules = [
            rule(5, None, None, Verdict::AuditDeny),
            rule(5, None, None, Verdict::Allow),
            rule(5, Some(Protocol::Tcp), Some(443..=443), Verdict::Allow),
            rule(5, Some(Protocol::Tcp), Some(22..=22), Verdict::Deny),
        ];
        check_equivalent(&rules);
        let rules = [
            rule(6, Some(Protocol::Tcp), None, Verdict::AuditDeny),
            rule(6, Some(Protocol::Tcp), None, Verdict::Allow),
            rule(6, Some(Protocol::Tcp), Some(8080..=8081), Verdict::Deny),
        ];
        check_equivalent(&rules);
    }

    #[test]
    fn icmp_types_take_the_place_of_ports() {
        let rules = [
            rule(5, Some(Protocol::Icmp), Some(8..=8), Verdict::Allow),
            rule(5, Some(Protocol::Icmp), Some(13..=13), Verdict::Deny),
            rule(6, Some(Protocol::Icmp), None, Verdict::Allow),
            rule(6, Some(Protocol::Icmp), Some(0..=0), Verdict::Deny),
        ];
        let entries = compile(1, &rules).unwrap();
        let d = |id, t| decided(&entries, id, Protocol::Icmp, t);
        assert_eq!(d(5, 8), Some(Verdict::Allow));
        assert_eq!(d(5, 13), Some(Verdict::Deny));
        assert_eq!(d(5, 0), None);
        assert_eq!(d(6, 3), Some(Verdict::Allow));
        assert_eq!(d(6, 0), Some(Verdict::Deny));
    }

    #[test]
    fn everything_denied_collapses_to_one_entry() {
        let rules = [
            rule(5, None, None, Verdict::Deny),
            rule(5, Some(Protocol::Tcp), Some(1..=2), Verdict::Allow),
        ];
        let entries = compile(1, &rules).unwrap();
        assert_eq!(entries.len(), 1);
        check_equivalent(&rules);
    }

    #[test]
    fn invalid_rules_name_the_problem() {
        let err = compile(
            1,
            &[rule(
                5,
                Some(Protocol::Other(47)),
                Some(1..=2),
                Verdict::Allow,
            )],
        )
        .unwrap_err();
        assert!(err.to_string().contains("proto-47 has no ports"), "{err}");
        // ICMP's "ports" are its types, 0-255.
        let err = compile(
            1,
            &[rule(5, Some(Protocol::Icmp), Some(8..=256), Verdict::Allow)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("0-255"), "{err}");
        #[allow(clippy::reversed_empty_ranges)]
        let err = compile(
            1,
            &[rule(5, Some(Protocol::Tcp), Some(9..=2), Verdict::Allow)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn directions_are_kept_apart() {
        let rules = [
            PolicyRule {
                identity: 5,
                direction: Direction::Egress,
                protocol: None,
                ports: None,
                verdict: Verdict::Deny,
            },
            rule(5, None, None, Verdict::Allow),
        ];
        let entries = compile(3, &rules).unwrap();
        assert_eq!(entries.len(), 2);
        assert!(entries.iter().all(|(e, _)| e.endpoint_id == 3));
        check_equivalent(&rules);
    }
}

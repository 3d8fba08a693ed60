//! The datapath's decision over compiled entries, in Rust: for a new connection, two
//! longest-prefix lookups (the peer's identity, and identity 0 for "any peer"); a deny from
//! either wins, else an allow from either, else nothing matched (denied when the endpoint
//! enforces that direction). `bpf/lib/policy.h` is the same decision in C; the privileged
//! test `integration/tests/policy_model.rs` runs the real programs against this one.

use crate::entry::PolicyEntry;
use crate::types::{Direction, Protocol, Verdict};

/// What the datapath decides for a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// An allow entry matched and no deny did.
    Allowed,
    /// A deny entry matched.
    Denied,
    /// An audited deny entry matched and no deny did: passes, reported as an audit.
    Audited,
    /// Nothing matched: denied if the endpoint enforces the direction.
    NoMatch,
}

impl Decision {
    /// Combines the verdicts of the two lookups (`None`: that lookup found nothing).
    pub fn of_lookups(peer: Option<Verdict>, any: Option<Verdict>) -> Decision {
        match (peer, any) {
            (Some(Verdict::Deny), _) | (_, Some(Verdict::Deny)) => Decision::Denied,
            (Some(Verdict::AuditDeny), _) | (_, Some(Verdict::AuditDeny)) => Decision::Audited,
            (None, None) => Decision::NoMatch,
            _ => Decision::Allowed,
        }
    }

    /// Whether the connection passes, given whether the endpoint enforces the direction
    /// (the datapath looks nothing up in a direction it does not enforce).
    pub fn passes(self, enforced: bool) -> bool {
        !enforced || matches!(self, Decision::Allowed | Decision::Audited)
    }
}

/// The verdict of the longest entry among `entries` that matches (`direction`, `identity`,
/// `protocol`, `port`): one of the datapath's two lookups.
pub fn longest_match(
    entries: &[(PolicyEntry, Verdict)],
    direction: Direction,
    identity: u32,
    protocol: Protocol,
    port: u16,
) -> Option<Verdict> {
    entries
        .iter()
        .filter(|(e, _)| e.direction == direction && e.identity == identity)
        .filter(|(e, _)| e.l4.matches(protocol, port))
        .max_by_key(|(e, _)| e.l4.prefix_len())
        .map(|(_, v)| *v)
}

/// What the datapath decides for a new connection of the endpoint whose `entries` these are
/// (as `compile` returns them), in `direction`, with a peer of `identity`, for `protocol`
/// and destination `port` (for ICMP and ICMPv6, the message's type). Other protocols without
/// ports are looked up with port 0, as the datapath does.
pub fn decide(
    entries: &[(PolicyEntry, Verdict)],
    direction: Direction,
    identity: u32,
    protocol: Protocol,
    port: u16,
) -> Decision {
    let port = if protocol.has_ports() || protocol.is_icmp() {
        port
    } else {
        0
    };
    Decision::of_lookups(
        longest_match(entries, direction, identity, protocol, port),
        longest_match(entries, direction, 0, protocol, port),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::L4Match;

    fn entry(identity: u32, l4: L4Match) -> PolicyEntry {
        PolicyEntry {
            endpoint_id: 1,
            direction: Direction::Egress,
            identity,
            l4,
        }
    }

    #[test]
    fn the_longest_entry_decides_within_a_lookup_and_a_deny_wins_across() {
        let entries = [
            (entry(5, L4Match::Protocol(Protocol::Tcp)), Verdict::Deny),
            (
                entry(
                    5,
                    L4Match::PortBlock {
                        protocol: Protocol::Tcp,
                        port: 80,
                        prefix_bits: 16,
                    },
                ),
                Verdict::Allow,
            ),
            (entry(0, L4Match::Any), Verdict::Allow),
            (
                entry(
                    0,
                    L4Match::PortBlock {
                        protocol: Protocol::Udp,
                        port: 53,
                        prefix_bits: 16,
                    },
                ),
                Verdict::Deny,
            ),
        ];
        let d = |id, p, port| decide(&entries, Direction::Egress, id, p, port);
        assert_eq!(d(5, Protocol::Tcp, 80), Decision::Allowed);
        assert_eq!(d(5, Protocol::Tcp, 81), Decision::Denied);
        assert_eq!(d(6, Protocol::Tcp, 81), Decision::Allowed);
        assert_eq!(d(6, Protocol::Udp, 53), Decision::Denied);
        assert_eq!(
            decide(&entries, Direction::Ingress, 5, Protocol::Tcp, 80),
            Decision::NoMatch
        );
        assert!(Decision::NoMatch.passes(false) && !Decision::NoMatch.passes(true));
        assert!(Decision::Denied.passes(false) && Decision::Allowed.passes(true));
    }
}

//! The vocabulary of policy: directions, IP protocols and verdicts.

use std::fmt;

/// Traffic direction relative to an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Entering the pod.
    Ingress,
    /// Leaving the pod.
    Egress,
}

impl Direction {
    /// Both directions, in key order.
    pub const ALL: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// The number the datapath's keys and events use (`CEL_DIR_*`; `cellium-datapath-bpf`
    /// checks it against its headers).
    pub fn as_u8(self) -> u8 {
        match self {
            Direction::Ingress => 0,
            Direction::Egress => 1,
        }
    }

    /// The direction for a key number, if valid.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Direction::Ingress),
            1 => Some(Direction::Egress),
            _ => None,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        })
    }
}

/// An IP protocol, by its IANA number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// ICMP (echo identifiers play the port in conntrack; policy has no ports for it).
    Icmp,
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
    /// Any other IP protocol number.
    Other(u8),
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Icmp => 1,
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
            Protocol::Other(n) => n,
        }
    }

    /// Whether policy can name ports of this protocol (the datapath reads them).
    pub fn has_ports(self) -> bool {
        matches!(self, Protocol::Tcp | Protocol::Udp | Protocol::Sctp)
    }

    /// ICMP or ICMPv6, whose message type takes the port's place in policy (Cilium's
    /// `icmps`): a "port" 0..=255.
    pub fn is_icmp(self) -> bool {
        matches!(self, Protocol::Icmp | Protocol::Other(58))
    }

    /// What stands for the port of a connection in policy: its port, an ICMP message's type,
    /// else 0.
    pub fn policy_port(self, port: u16, icmp_type: u8) -> u16 {
        if self.has_ports() {
            port
        } else if self.is_icmp() {
            u16::from(icmp_type)
        } else {
            0
        }
    }
}

impl From<u8> for Protocol {
    fn from(n: u8) -> Self {
        match n {
            1 => Protocol::Icmp,
            6 => Protocol::Tcp,
            17 => Protocol::Udp,
            132 => Protocol::Sctp,
            n => Protocol::Other(n),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protocol::Icmp => f.write_str("icmp"),
            Protocol::Tcp => f.write_str("tcp"),
            Protocol::Udp => f.write_str("udp"),
            Protocol::Sctp => f.write_str("sctp"),
            Protocol::Other(n) => write!(f, "proto-{n}"),
        }
    }
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// Allow the connection.
    Allow,
    /// Deny the connection (wins over any allow).
    Deny,
    /// What a deny of a policy in audit mode becomes: the connection passes, reported as an
    /// audit verdict. Below [`Verdict::Deny`], above [`Verdict::Allow`].
    AuditDeny,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_round_trip() {
        for n in [1u8, 6, 17, 132, 47] {
            assert_eq!(Protocol::from(n).number(), n);
        }
        assert!(Protocol::Tcp.has_ports());
        assert!(!Protocol::Icmp.has_ports());
        assert!(!Protocol::Other(47).has_ports());
    }

    #[test]
    fn directions_round_trip() {
        for d in Direction::ALL {
            assert_eq!(Direction::from_u8(d.as_u8()), Some(d));
        }
        assert_eq!(Direction::from_u8(2), None);
    }
}

//! Compiled policy entries: what the datapath's policy map holds, as typed keys.

use crate::types::{Direction, Protocol};

/// What an entry matches below (endpoint, direction, identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Match {
    /// Every protocol and port.
    Any,
    /// One protocol, every port.
    Protocol(Protocol),
    /// A block of `2^(16 - prefix_bits)` ports starting at `port` (aligned).
    PortBlock {
        /// The protocol.
        protocol: Protocol,
        /// First port of the block.
        port: u16,
        /// Leading port bits that must match, 1..=16 (16 = one port).
        prefix_bits: u8,
    },
}

impl L4Match {
    /// How specific the match is: the number of key bits it fixes below the identity (0 for
    /// every protocol, 16 for one protocol, 16 + the port bits for a block). Within one
    /// identity, the matching entry with the longest prefix decides.
    pub fn prefix_len(&self) -> u8 {
        match *self {
            L4Match::Any => 0,
            L4Match::Protocol(_) => 16,
            L4Match::PortBlock { prefix_bits, .. } => 16 + prefix_bits.clamp(1, 16),
        }
    }

    /// Whether a connection of `protocol` to `port` falls under this match.
    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        match *self {
            L4Match::Any => true,
            L4Match::Protocol(p) => p == protocol,
            L4Match::PortBlock {
                protocol: p,
                port: base,
                prefix_bits,
            } => p == protocol && port & block_mask(prefix_bits) == base & block_mask(prefix_bits),
        }
    }
}

/// The mask of the leading `prefix_bits` bits of a port (clamped to 1..=16).
pub fn block_mask(prefix_bits: u8) -> u16 {
    let bits = u32::from(prefix_bits.clamp(1, 16));
    (0xffff_u32 << (16 - bits)) as u16
}

/// One policy entry's key, typed: an endpoint's allow or deny for a peer identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyEntry {
    /// The endpoint the entry belongs to.
    pub endpoint_id: u16,
    /// Traffic direction relative to the endpoint.
    pub direction: Direction,
    /// The peer identity; 0 = any identity.
    pub identity: u32,
    /// Protocol and ports.
    pub l4: L4Match,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_match_their_aligned_ports() {
        let block = L4Match::PortBlock {
            protocol: Protocol::Tcp,
            port: 1024,
            prefix_bits: 6,
        };
        assert!(block.matches(Protocol::Tcp, 1024));
        assert!(block.matches(Protocol::Tcp, 2047));
        assert!(!block.matches(Protocol::Tcp, 2048));
        assert!(!block.matches(Protocol::Udp, 1500));
        assert_eq!(block.prefix_len(), 22);
        assert_eq!(L4Match::Any.prefix_len(), 0);
        assert!(L4Match::Protocol(Protocol::Icmp).matches(Protocol::Icmp, 0));
    }
}

//! Typed vocabulary of the datapath: verdict reasons, MAC addresses and
//! endpoint flags, each convertible to the numbers the C headers use
//! (bpf/include/cellium/common.h). Directions and protocols are the policy
//! model's (`cellium-policy`), re-exported by the crate.

use std::fmt;
use std::str::FromStr;

// The crate's modules name them from here, with the types below.
pub use cellium_policy::{Direction, Protocol};

use crate::error::Error;

/// Why a packet was forwarded or dropped (`CEL_REASON_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Forwarded (not a drop).
    Forwarded,
    /// The source address is not the endpoint behind the interface.
    InvalidSource,
    /// An explicit deny entry matched.
    PolicyDeny,
    /// The endpoint enforces policy and nothing allowed the connection.
    PolicyDefaultDeny,
    /// A frontend without (reachable) backends.
    NoServiceBackend,
    /// Headers could not be parsed (a first fragment too short for its L4 header included).
    Malformed,
    /// The conntrack table refused a new entry.
    CtFull,
    /// Rewriting addresses or checksums failed.
    NatFailed,
    /// A later fragment whose first fragment was never seen: nothing says which ports,
    /// policy or translation it belongs to.
    FragmentNotFound,
    /// A first fragment whose ports could not be recorded for the later ones.
    FragmentTableFull,
    /// An IPv6 extension-header chain the datapath does not parse (an unknown extension
    /// header, a routing header with segments left, too many headers): never passed unchecked.
    ExtensionHeader,
    /// Tunnel mode: a packet for another node's pod could not be given its tunnel key, or a
    /// packet came out of the tunnel without one.
    EncapFailed,
    /// Tunnel mode: a VXLAN packet whose outer source is no node the agent knows; its VNI is
    /// not believed. Native routing: a DSR option from anything but another node (Cilium's
    /// `DROP_UNKNOWN_SENDER`).
    UnknownSender,
    /// Tunnel mode: a VNI carrying an identity no node sends, a reserved one other than host,
    /// health and init (Cilium's `DROP_INVALID_IDENTITY`).
    InvalidIdentity,
    /// An endpoint enforces the direction but has no policy map (not written yet, or
    /// removed): nothing allows, so nothing passes.
    NoPolicyMap,
    /// A new connection to a load balancer ingress IP of a service with
    /// `loadBalancerSourceRanges` from a client none of them holds (Cilium's
    /// `DROP_NOT_IN_SRC_RANGE`).
    NotInSrcRange,
    /// A number this version does not know.
    Unknown(u8),
}

impl Reason {
    /// Every reason the datapath emits, in number order.
    pub const KNOWN: [Reason; 16] = [
        Reason::Forwarded,
        Reason::InvalidSource,
        Reason::PolicyDeny,
        Reason::PolicyDefaultDeny,
        Reason::NoServiceBackend,
        Reason::Malformed,
        Reason::CtFull,
        Reason::NatFailed,
        Reason::FragmentNotFound,
        Reason::FragmentTableFull,
        Reason::ExtensionHeader,
        Reason::EncapFailed,
        Reason::UnknownSender,
        Reason::InvalidIdentity,
        Reason::NoPolicyMap,
        Reason::NotInSrcRange,
    ];

    /// The reason's number.
    pub fn as_u8(self) -> u8 {
        match self {
            Reason::Forwarded => 0,
            Reason::InvalidSource => 1,
            Reason::PolicyDeny => 2,
            Reason::PolicyDefaultDeny => 3,
            Reason::NoServiceBackend => 4,
            Reason::Malformed => 5,
            // 6 was "fragment not supported", before fragments were tracked.
            Reason::CtFull => 7,
            Reason::NatFailed => 8,
            // 9 was "ipv6 not enforced", before IPv6 was.
            Reason::FragmentNotFound => 10,
            Reason::FragmentTableFull => 11,
            Reason::ExtensionHeader => 12,
            Reason::EncapFailed => 13,
            Reason::UnknownSender => 14,
            Reason::InvalidIdentity => 15,
            Reason::NoPolicyMap => 16,
            Reason::NotInSrcRange => 17,
            Reason::Unknown(n) => n,
        }
    }

    /// Whether this reason is a drop.
    pub fn is_drop(self) -> bool {
        self != Reason::Forwarded
    }
}

impl From<u8> for Reason {
    fn from(n: u8) -> Self {
        Reason::KNOWN
            .iter()
            .copied()
            .find(|r| r.as_u8() == n)
            .unwrap_or(Reason::Unknown(n))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Forwarded => f.write_str("forwarded"),
            Reason::InvalidSource => f.write_str("invalid source"),
            Reason::PolicyDeny => f.write_str("policy denied"),
            Reason::PolicyDefaultDeny => f.write_str("policy default deny"),
            Reason::NoServiceBackend => f.write_str("no service backend"),
            Reason::Malformed => f.write_str("malformed packet"),
            Reason::CtFull => f.write_str("conntrack table full"),
            Reason::NatFailed => f.write_str("nat failed"),
            Reason::FragmentNotFound => f.write_str("first fragment not seen"),
            Reason::FragmentTableFull => f.write_str("fragment table full"),
            Reason::ExtensionHeader => f.write_str("unsupported extension header"),
            Reason::EncapFailed => f.write_str("encapsulation failed"),
            Reason::UnknownSender => f.write_str("unknown sender"),
            Reason::InvalidIdentity => f.write_str("invalid identity"),
            Reason::NoPolicyMap => f.write_str("no policy map"),
            Reason::NotInSrcRange => f.write_str("not in source range"),
            Reason::Unknown(n) => write!(f, "reason {n}"),
        }
    }
}

/// A MAC address, laid out as the six bytes the headers use.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(transparent)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::invalid(
                format!("mac address {s:?}"),
                "expected six hex bytes separated by ':'",
            )
        };
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(bad)?;
            if part.is_empty() || part.len() > 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

/// Endpoint flags (`CEL_EP_F_*`): which directions enforce policy.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct EndpointFlags(pub u16);

impl EndpointFlags {
    /// No enforcement: everything allowed.
    pub const NONE: EndpointFlags = EndpointFlags(0);
    /// Enforce policy on traffic entering the pod.
    pub const ENFORCE_INGRESS: EndpointFlags = EndpointFlags(1 << 0);
    /// Enforce policy on traffic leaving the pod.
    pub const ENFORCE_EGRESS: EndpointFlags = EndpointFlags(1 << 1);
    /// The ingress default deny comes only from policies in audit mode: what it would drop
    /// passes, reported as an audit verdict.
    pub const AUDIT_INGRESS: EndpointFlags = EndpointFlags(1 << 2);
    /// The same for egress.
    pub const AUDIT_EGRESS: EndpointFlags = EndpointFlags(1 << 3);

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: EndpointFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The flag that enforces `direction`.
    pub fn enforce(direction: Direction) -> EndpointFlags {
        match direction {
            Direction::Ingress => Self::ENFORCE_INGRESS,
            Direction::Egress => Self::ENFORCE_EGRESS,
        }
    }
}

impl std::ops::BitOr for EndpointFlags {
    type Output = EndpointFlags;

    fn bitor(self, rhs: Self) -> Self {
        EndpointFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for EndpointFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        if self.contains(Self::ENFORCE_INGRESS) {
            names.push("ENFORCE_INGRESS");
        }
        if self.contains(Self::ENFORCE_EGRESS) {
            names.push("ENFORCE_EGRESS");
        }
        if self.contains(Self::AUDIT_INGRESS) {
            names.push("AUDIT_INGRESS");
        }
        if self.contains(Self::AUDIT_EGRESS) {
            names.push("AUDIT_EGRESS");
        }
        let known = [
            Self::ENFORCE_INGRESS,
            Self::ENFORCE_EGRESS,
            Self::AUDIT_INGRESS,
            Self::AUDIT_EGRESS,
        ];
        let rest = known.iter().fold(self.0, |rest, f| rest & !f.0);
        if rest != 0 {
            return write!(f, "{}|{rest:#x}", names.join("|"));
        }
        if names.is_empty() {
            return f.write_str("NONE");
        }
        f.write_str(&names.join("|"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::c;

    #[test]
    fn numbers_match_the_headers() {
        assert_eq!(u64::from(Direction::Ingress.as_u8()), c::CEL_DIR_INGRESS);
        assert_eq!(u64::from(Direction::Egress.as_u8()), c::CEL_DIR_EGRESS);
        let reasons = [
            (Reason::Forwarded, c::CEL_REASON_FORWARDED),
            (Reason::InvalidSource, c::CEL_REASON_INVALID_SOURCE),
            (Reason::PolicyDeny, c::CEL_REASON_POLICY_DENY),
            (Reason::PolicyDefaultDeny, c::CEL_REASON_POLICY_DEFAULT_DENY),
            (Reason::NoServiceBackend, c::CEL_REASON_NO_SERVICE_BACKEND),
            (Reason::Malformed, c::CEL_REASON_MALFORMED),
            (Reason::CtFull, c::CEL_REASON_CT_FULL),
            (Reason::NatFailed, c::CEL_REASON_NAT_FAILED),
            (Reason::FragmentNotFound, c::CEL_REASON_FRAGMENT_NOT_FOUND),
            (Reason::FragmentTableFull, c::CEL_REASON_FRAGMENT_TABLE_FULL),
            (Reason::ExtensionHeader, c::CEL_REASON_EXTENSION_HEADER),
            (Reason::EncapFailed, c::CEL_REASON_ENCAP_FAILED),
            (Reason::UnknownSender, c::CEL_REASON_UNKNOWN_SENDER),
            (Reason::InvalidIdentity, c::CEL_REASON_INVALID_IDENTITY),
            (Reason::NoPolicyMap, c::CEL_REASON_NO_POLICY_MAP),
            (Reason::NotInSrcRange, c::CEL_REASON_NOT_IN_SRC_RANGE),
        ];
        for (r, n) in reasons {
            assert_eq!(u64::from(r.as_u8()), n, "{r}");
            assert_eq!(Reason::from(r.as_u8()), r);
        }
        assert_eq!(Reason::from(200), Reason::Unknown(200));
        assert_eq!(Reason::from(6), Reason::Unknown(6), "retired");
        assert_eq!(Reason::from(9), Reason::Unknown(9), "retired");
        assert_eq!(
            u64::from(EndpointFlags::ENFORCE_INGRESS.0),
            c::CEL_EP_F_ENFORCE_INGRESS
        );
        assert_eq!(
            u64::from(EndpointFlags::ENFORCE_EGRESS.0),
            c::CEL_EP_F_ENFORCE_EGRESS
        );
        assert_eq!(
            u64::from(EndpointFlags::AUDIT_INGRESS.0),
            c::CEL_EP_F_AUDIT_INGRESS
        );
        assert_eq!(
            u64::from(EndpointFlags::AUDIT_EGRESS.0),
            c::CEL_EP_F_AUDIT_EGRESS
        );
    }

    #[test]
    fn mac_parses_and_prints() {
        let mac: MacAddr = "02:00:0a:ff:00:01".parse().unwrap();
        assert_eq!(mac.0, [2, 0, 0x0a, 0xff, 0, 1]);
        assert_eq!(mac.to_string(), "02:00:0a:ff:00:01");
        assert!("02:00:0a:ff:00".parse::<MacAddr>().is_err());
        assert!("02:00:0a:ff:00:01:02".parse::<MacAddr>().is_err());
        assert!("02:00:0a:ff:00:zz".parse::<MacAddr>().is_err());
    }

    #[test]
    fn flags_compose() {
        let f = EndpointFlags::ENFORCE_INGRESS | EndpointFlags::ENFORCE_EGRESS;
        assert!(f.contains(EndpointFlags::enforce(Direction::Egress)));
        assert!(!EndpointFlags::NONE.contains(EndpointFlags::ENFORCE_INGRESS));
        assert_eq!(format!("{f:?}"), "ENFORCE_INGRESS|ENFORCE_EGRESS");
    }
}

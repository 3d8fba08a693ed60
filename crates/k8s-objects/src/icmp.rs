//! Cilium's `icmps`: ICMP and ICMPv6 message types a rule allows or denies, by number or by
//! Cilium's names (`EchoRequest`, `PacketTooBig`, ...).

use serde::Deserialize;
use serde_json::Value;

use crate::validate::FieldError;

/// The family of an ICMP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IcmpFamily {
    /// ICMP (IPv4).
    V4,
    /// ICMPv6.
    V6,
}

/// One ICMP or ICMPv6 message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IcmpType {
    /// Its family.
    pub family: IcmpFamily,
    /// The type number.
    pub icmp_type: u8,
}

/// An `icmps` item.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireIcmpRule {
    #[serde(default)]
    pub fields: Option<Vec<WireIcmpField>>,
}

/// A `fields` item.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireIcmpField {
    #[serde(default)]
    pub family: Option<String>,
    #[serde(default, rename = "type")]
    pub icmp_type: Option<Value>,
}

/// Cilium's ICMP (IPv4) type names.
const V4_NAMES: &[(&str, u8)] = &[
    ("EchoReply", 0),
    ("DestinationUnreachable", 3),
    ("Redirect", 5),
    ("Echo", 8),
    ("EchoRequest", 8),
    ("RouterAdvertisement", 9),
    ("RouterSelection", 10),
    ("TimeExceeded", 11),
    ("ParameterProblem", 12),
    ("Timestamp", 13),
    ("TimestampReply", 14),
    ("Photuris", 40),
    ("ExtendedEchoRequest", 42),
    ("ExtendedEchoReply", 43),
];

/// Cilium's ICMPv6 type names.
const V6_NAMES: &[(&str, u8)] = &[
    ("DestinationUnreachable", 1),
    ("PacketTooBig", 2),
    ("TimeExceeded", 3),
    ("ParameterProblem", 4),
    ("EchoRequest", 128),
    ("EchoReply", 129),
    ("MulticastListenerQuery", 130),
    ("MulticastListenerReport", 131),
    ("MulticastListenerDone", 132),
    ("RouterSolicitation", 133),
    ("RouterAdvertisement", 134),
    ("NeighborSolicitation", 135),
    ("NeighborAdvertisement", 136),
    ("RedirectMessage", 137),
    ("RouterRenumbering", 138),
    ("ICMPNodeInformationQuery", 139),
    ("ICMPNodeInformationResponse", 140),
    ("InverseNeighborDiscoverySolicitation", 141),
    ("InverseNeighborDiscoveryAdvertisement", 142),
    ("HomeAgentAddressDiscoveryRequest", 144),
    ("HomeAgentAddressDiscoveryReply", 145),
    ("MobilePrefixSolicitation", 146),
    ("MobilePrefixAdvertisement", 147),
    ("DuplicateAddressRequestCodeSuffix", 157),
    ("DuplicateAddressConfirmationCodeSuffix", 158),
    ("ExtendedEchoRequest", 160),
    ("ExtendedEchoReply", 161),
];

/// The types of a rule's `icmps` list (`field` names it in errors).
pub fn icmp_types(field: &str, rules: Vec<WireIcmpRule>) -> Result<Vec<IcmpType>, FieldError> {
    let mut out = Vec::new();
    for (i, rule) in rules.into_iter().enumerate() {
        for (j, f) in rule.fields.into_iter().flatten().enumerate() {
            out.push(icmp_type(&format!("{field}[{i}].fields[{j}]"), f)?);
        }
    }
    Ok(out)
}

fn icmp_type(field: &str, f: WireIcmpField) -> Result<IcmpType, FieldError> {
    let family = match f.family.as_deref() {
        None | Some("IPv4") => IcmpFamily::V4,
        Some("IPv6") => IcmpFamily::V6,
        Some(other) => {
            return Err(FieldError::new(
                format!("{field}.family"),
                format!("{other:?} is not IPv4 or IPv6"),
            ));
        }
    };
    let names = match family {
        IcmpFamily::V4 => V4_NAMES,
        IcmpFamily::V6 => V6_NAMES,
    };
    let bad = |why: String| FieldError::new(format!("{field}.type"), why);
    let icmp_type = match f.icmp_type {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u8::try_from(n).ok())
            .ok_or_else(|| bad(format!("{n} is not a type number 0-255")))?,
        Some(Value::String(s)) => match s.parse::<u8>() {
            Ok(n) => n,
            Err(_) => names
                .iter()
                .find(|(name, _)| *name == s)
                .map(|(_, n)| *n)
                .ok_or_else(|| bad(format!("{s:?} is no ICMP type name of its family")))?,
        },
        None => return Err(bad("a type is required".into())),
        Some(other) => return Err(bad(format!("{other} is not a number or a name"))),
    };
    Ok(IcmpType { family, icmp_type })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Vec<IcmpType>, FieldError> {
        icmp_types("icmps", serde_yaml::from_str(yaml).unwrap())
    }

    #[test]
    fn numbers_and_names_of_both_families() {
        let t = parse(
            "[{fields: [{type: 8}, {type: EchoRequest, family: IPv6}, {type: '13', family: IPv4}]}]",
        )
        .unwrap();
        let v4 = |icmp_type| IcmpType {
            family: IcmpFamily::V4,
            icmp_type,
        };
        let v6 = |icmp_type| IcmpType {
            family: IcmpFamily::V6,
            icmp_type,
        };
        assert_eq!(t, [v4(8), v6(128), v4(13)]);
        assert_eq!(
            parse("[{fields: [{type: PacketTooBig, family: IPv6}]}]").unwrap(),
            [v6(2)]
        );
    }

    #[test]
    fn bad_types_and_families_name_their_field() {
        for (yaml, field) in [
            ("[{fields: [{type: 256}]}]", "icmps[0].fields[0].type"),
            (
                "[{fields: [{type: PacketTooBig}]}]",
                "icmps[0].fields[0].type",
            ),
            (
                "[{fields: [{type: 8, family: IPX}]}]",
                "icmps[0].fields[0].family",
            ),
            (
                "[{fields: [{}, {family: IPv6}]}]",
                "icmps[0].fields[0].type",
            ),
        ] {
            assert_eq!(parse(yaml).unwrap_err().field, field, "{yaml}");
        }
    }
}

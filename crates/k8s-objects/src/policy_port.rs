//! The L4 part of policy rules, shared by NetworkPolicy and CiliumNetworkPolicy: ports by
//! number or name, port ranges, protocols; and CIDR blocks with their exceptions.

use std::fmt;

use ipnet::IpNet;

use crate::Protocol;
use crate::pod::port_name;
use crate::validate::FieldError;

/// A port a rule names: a number or a container port's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortRef {
    /// A port number, 1-65535.
    Number(u16),
    /// The name of a container port (IANA service name).
    Name(String),
}

impl fmt::Display for PortRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortRef::Number(n) => write!(f, "{n}"),
            PortRef::Name(name) => f.write_str(name),
        }
    }
}

/// One port entry of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyPort {
    /// The protocol; `None` = TCP, UDP and SCTP (Cilium's `ANY`). NetworkPolicy always has
    /// one (TCP when omitted, as the API server defaults it).
    pub protocol: Option<Protocol>,
    /// The port; `None` = every port of the protocol.
    pub port: Option<PortRef>,
    /// The last port of a range starting at `port` (only with a numeric port).
    pub end_port: Option<u16>,
}

impl fmt::Display for PolicyPort {
    /// `80/TCP`, `8000-8080/UDP`, `http/TCP`, `*/ANY`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.port, self.end_port) {
            (None, _) => f.write_str("*")?,
            (Some(p), Some(end)) => write!(f, "{p}-{end}")?,
            (Some(p), None) => write!(f, "{p}")?,
        }
        match self.protocol {
            Some(p) => write!(f, "/{p}"),
            None => f.write_str("/ANY"),
        }
    }
}

impl PolicyPort {
    /// Checks a port entry: a number in 1-65535 or a valid port name, and an `endPort` only
    /// after a numeric port and not below it.
    pub fn new(
        field: &str,
        protocol: Option<Protocol>,
        port: Option<PortRef>,
        end_port: Option<i64>,
    ) -> Result<PolicyPort, FieldError> {
        if let Some(PortRef::Name(name)) = &port {
            port_name(&format!("{field}.port"), name)?;
        }
        let end_port = match end_port {
            None => None,
            Some(end) => {
                let f = format!("{field}.endPort");
                let Some(PortRef::Number(start)) = port else {
                    return Err(FieldError::new(
                        f,
                        "may only be set together with a numeric port",
                    ));
                };
                let end = number(&f, end)?;
                if end < start {
                    return Err(FieldError::new(
                        f,
                        format!("{end} is below the port {start} the range starts at"),
                    ));
                }
                Some(end)
            }
        };
        Ok(PolicyPort {
            protocol,
            port,
            end_port,
        })
    }
}

/// A port number in 1-65535.
pub fn number(field: &str, n: i64) -> Result<u16, FieldError> {
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| FieldError::new(field, format!("{n} is not a port number (1-65535)")))
}

/// A port given as text: digits are a number, anything else a name.
pub fn port_from_text(field: &str, text: &str) -> Result<PortRef, FieldError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = text.parse().map_err(|_| {
            FieldError::new(field, format!("{text} is not a port number (1-65535)"))
        })?;
        return number(field, n).map(PortRef::Number);
    }
    port_name(field, text)?;
    Ok(PortRef::Name(text.to_string()))
}

/// A CIDR block and the prefixes inside it that are excluded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CidrBlock {
    /// The block.
    pub cidr: IpNet,
    /// Prefixes inside `cidr` that are not part of the block.
    pub except: Vec<IpNet>,
}

impl fmt::Display for CidrBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.cidr)?;
        if !self.except.is_empty() {
            let except: Vec<String> = self.except.iter().map(ToString::to_string).collect();
            write!(f, " except {}", except.join(","))?;
        }
        Ok(())
    }
}

impl CidrBlock {
    /// Checks a block: valid prefixes, each exception inside the block. `strict_except`
    /// requires each exception to be strictly smaller than the block (the NetworkPolicy rule);
    /// Cilium accepts an exception equal to the block.
    pub fn new(
        field: &str,
        cidr: &str,
        except: &[String],
        strict_except: bool,
    ) -> Result<CidrBlock, FieldError> {
        let cidr_net = parse_cidr(&format!("{field}.cidr"), cidr, false)?;
        let mut out = Vec::new();
        for (i, e) in except.iter().enumerate() {
            let f = format!("{field}.except[{i}]");
            let net = parse_cidr(&f, e, false)?;
            let inside = cidr_net.contains(&net)
                && (!strict_except || net.prefix_len() > cidr_net.prefix_len());
            if !inside {
                let what = if strict_except {
                    "a strict subset of"
                } else {
                    "inside"
                };
                return Err(FieldError::new(
                    f,
                    format!("{e} must be {what} the block's cidr {cidr}"),
                ));
            }
            out.push(net);
        }
        Ok(CidrBlock {
            cidr: cidr_net,
            except: out,
        })
    }
}

/// Parses `10.0.0.0/8` (host bits are cleared, as the API server's parser ignores them);
/// with `allow_address`, a bare address means its host prefix (Cilium's `fromCIDR`).
pub fn parse_cidr(field: &str, text: &str, allow_address: bool) -> Result<IpNet, FieldError> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    if allow_address && let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    Err(FieldError::new(
        field,
        format!("{text:?} is not a valid CIDR (e.g. 10.0.0.0/8 or fd00::/64)"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_ranges() {
        let p = PolicyPort::new(
            "p",
            Some(Protocol::Tcp),
            Some(PortRef::Number(80)),
            Some(90),
        )
        .unwrap();
        assert_eq!(p.to_string(), "80-90/TCP");
        let err = PolicyPort::new("p", None, Some(PortRef::Number(80)), Some(70)).unwrap_err();
        assert_eq!(err.field, "p.endPort");
        let err =
            PolicyPort::new("p", None, Some(PortRef::Name("http".into())), Some(90)).unwrap_err();
        assert!(err.reason.contains("numeric port"), "{}", err.reason);
        let err = PolicyPort::new("p", None, Some(PortRef::Number(80)), Some(70000)).unwrap_err();
        assert!(
            err.reason.contains("70000 is not a port number"),
            "{}",
            err.reason
        );
        assert_eq!(port_from_text("p", "443").unwrap(), PortRef::Number(443));
        assert_eq!(
            port_from_text("p", "http").unwrap(),
            PortRef::Name("http".into())
        );
        assert!(port_from_text("p", "0").is_err());
        assert!(port_from_text("p", "Not_A_Name").is_err());
    }

    #[test]
    fn cidr_blocks() {
        let b = CidrBlock::new("b", "10.0.0.0/8", &["10.1.0.0/16".into()], true).unwrap();
        assert_eq!(b.to_string(), "10.0.0.0/8 except 10.1.0.0/16");
        let err = CidrBlock::new("b", "10.0.0.0/8", &["11.0.0.0/16".into()], true).unwrap_err();
        assert_eq!(err.field, "b.except[0]");
        assert!(
            CidrBlock::new("b", "10.0.0.0/8", &["10.0.0.0/8".into()], true).is_err(),
            "NetworkPolicy needs a strict subset"
        );
        assert!(CidrBlock::new("b", "10.0.0.0/8", &["10.0.0.0/8".into()], false).is_ok());
        let err = CidrBlock::new("b", "10.0.0/8", &[], true).unwrap_err();
        assert_eq!(err.field, "b.cidr");
        assert_eq!(
            parse_cidr("c", "10.1.2.3/8", false).unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            parse_cidr("c", "10.1.2.3", true).unwrap().to_string(),
            "10.1.2.3/32"
        );
        assert!(parse_cidr("c", "10.1.2.3", false).is_err());
    }
}

//! Address text as CNI writes it: `ip`, `ip/prefix`.

use std::net::IpAddr;

/// An address with its prefix length, e.g. `10.0.0.5/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The address (not masked: CNI results keep the host bits).
    pub ip: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `ip/prefix`; the reason is returned on failure, for the caller's message.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (ip, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("\"{s}\" has no /prefix"))?;
        let ip = parse_ip(ip)?;
        let prefix = parse_prefix(ip, prefix)?;
        Ok(Cidr { ip, prefix })
    }

    /// `"4"` or `"6"`, as the 0.3.x/0.4.0 result's `version` field says.
    pub fn family(&self) -> &'static str {
        if self.ip.is_ipv4() { "4" } else { "6" }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix)
    }
}

/// Parses a bare IP address.
pub fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse()
        .map_err(|_| format!("\"{s}\" is not an IPv4 or IPv6 address"))
}

fn parse_prefix(ip: IpAddr, s: &str) -> Result<u8, String> {
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match s.parse::<u8>() {
        Ok(p) if p <= max => Ok(p),
        _ => Err(format!("\"{s}\" is not a prefix length of 0 to {max}")),
    }
}

/// Parses a requested address, `ip` or `ip/prefix` (the `ips` convention), into its canonical
/// text, so the agent sees one spelling however the user wrote it.
pub fn parse_requested(s: &str) -> Result<String, String> {
    let s = s.trim();
    match s.split_once('/') {
        Some(_) => Cidr::parse(s).map(|c| c.to_string()),
        None => parse_ip(s).map(|ip| ip.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_keep_host_bits_and_know_their_family() {
        let c = Cidr::parse("10.1.0.5/16").unwrap();
        assert_eq!(c.to_string(), "10.1.0.5/16");
        assert_eq!(c.family(), "4");
        let c = Cidr::parse("2001:DB8::5/64").unwrap();
        assert_eq!(c.to_string(), "2001:db8::5/64");
        assert_eq!(c.family(), "6");
    }

    #[test]
    fn bad_cidrs_say_why() {
        assert!(Cidr::parse("10.0.0.1").unwrap_err().contains("no /prefix"));
        assert!(Cidr::parse("10.0.0.1/33").unwrap_err().contains("0 to 32"));
        assert!(Cidr::parse("::1/129").unwrap_err().contains("0 to 128"));
        assert!(Cidr::parse("10.0.0/8").unwrap_err().contains("not an IPv4"));
    }

    #[test]
    fn requested_addresses_are_canonicalised() {
        assert_eq!(parse_requested(" 10.0.0.7 ").unwrap(), "10.0.0.7");
        assert_eq!(parse_requested("10.0.0.7/24").unwrap(), "10.0.0.7/24");
        assert_eq!(parse_requested("2001:0db8::0005").unwrap(), "2001:db8::5");
        assert!(parse_requested("ten").is_err());
        assert!(parse_requested("10.0.0.7/x").is_err());
    }
}

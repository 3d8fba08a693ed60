//! Which CIDRs can serve pods.
//!
//! A pod CIDR becomes the pods' addresses, their gateway (its first usable address, put on the
//! node) and the routes to them, so it must be unicast address space the node routes
//! normally, and not so broad that it covers destinations the node must reach elsewhere.

use ipnet::IpNet;

/// The shortest IPv4 pod CIDR: a /8 already holds 16 million pods.
pub const MIN_PREFIX_V4: u8 = 8;

/// The shortest IPv6 pod CIDR: a /48 is a whole site's address space.
pub const MIN_PREFIX_V6: u8 = 48;

/// Ranges no pod address may come from, with why.
const SPECIAL: [(&str, &str); 10] = [
    (
        "0.0.0.0/8",
        "\"this network\" (0.0.0.0/8), which is never routed",
    ),
    ("127.0.0.0/8", "loopback (127.0.0.0/8)"),
    (
        "169.254.0.0/16",
        "link-local (169.254.0.0/16), which is never routed",
    ),
    ("224.0.0.0/4", "multicast (224.0.0.0/4)"),
    (
        "255.255.255.255/32",
        "the limited broadcast address 255.255.255.255",
    ),
    ("::/128", "the unspecified address ::"),
    ("::1/128", "the loopback address ::1"),
    (
        "::ffff:0:0/96",
        "IPv4-mapped (::ffff:0:0/96), which never appears on the wire",
    ),
    ("fe80::/10", "link-local (fe80::/10), which is never routed"),
    ("ff00::/8", "multicast (ff00::/8)"),
];

/// Why `cidr` cannot serve pods, if it cannot.
pub(crate) fn unusable(cidr: IpNet) -> Option<String> {
    let cidr = cidr.trunc();
    let min = match cidr {
        IpNet::V4(_) => MIN_PREFIX_V4,
        IpNet::V6(_) => MIN_PREFIX_V6,
    };
    if cidr.prefix_len() < min {
        return Some(format!(
            "a prefix shorter than /{min} covers address space the node must reach elsewhere"
        ));
    }
    SPECIAL.iter().find_map(|(range, what)| {
        let range: IpNet = range.parse().ok()?;
        let overlaps = range.contains(&cidr) || cidr.contains(&range);
        overlaps.then(|| format!("it overlaps {what}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(cidr: &str) -> Option<String> {
        unusable(cidr.parse().unwrap())
    }

    #[test]
    fn ordinary_private_and_global_ranges_serve_pods() {
        for ok in [
            "10.244.0.0/24",
            "10.0.0.0/8",
            "192.168.1.0/31",
            "100.64.0.0/16",
            "240.10.0.0/24",
            "fd00::/48",
            "fd00:1::/64",
            "2001:db8::/64",
        ] {
            assert_eq!(why(ok), None, "{ok}");
        }
    }

    #[test]
    fn broad_and_special_ranges_are_refused_with_the_reason() {
        for (bad, reason) in [
            ("0.0.0.0/0", "shorter than /8"),
            ("10.0.0.0/7", "shorter than /8"),
            ("::/0", "shorter than /48"),
            ("2000::/3", "shorter than /48"),
            ("0.0.0.0/24", "this network"),
            ("127.0.0.0/24", "loopback"),
            ("127.0.0.0/8", "loopback"),
            ("169.254.1.0/24", "link-local"),
            ("224.1.0.0/16", "multicast"),
            ("239.255.255.0/24", "multicast"),
            ("255.255.255.0/24", "limited broadcast"),
            ("::/64", "unspecified"),
            ("::ffff:10.0.0.0/120", "IPv4-mapped"),
            ("fe80::/64", "link-local"),
            ("ff02::/64", "multicast"),
        ] {
            let got = why(bad).unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(got.contains(reason), "{bad}: {got}");
        }
    }
}

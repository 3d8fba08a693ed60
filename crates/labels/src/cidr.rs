//! How a prefix is written as the key of a `cidr:` label.
//!
//! IPv4 prefixes are written as usual (`10.0.0.0/8`). IPv6 prefixes have every `:` replaced
//! by `-`, as Cilium does, so that a key never holds the character that separates a label's
//! source from its key; a leading or trailing `-` gets a `0` next to it (`::/0` is
//! `0--0/0`, `fd00::/64` is `fd00--0/64`) so the key neither starts nor ends with a
//! separator. Host bits are always cleared: a label names a prefix, not an address.

use ipnet::IpNet;

/// The label key of `net` (host bits cleared).
pub fn encode(net: IpNet) -> String {
    let net = net.trunc();
    match net {
        IpNet::V4(_) => net.to_string(),
        IpNet::V6(v6) => {
            let mut addr = v6.network().to_string().replace(':', "-");
            if addr.starts_with('-') {
                addr.insert(0, '0');
            }
            if addr.ends_with('-') {
                addr.push('0');
            }
            format!("{addr}/{}", v6.prefix_len())
        }
    }
}

/// The prefix a `cidr:` label key names, in either the dashed or the colon form; host bits
/// are cleared. `None` when the key is not a prefix.
pub fn decode(key: &str) -> Option<IpNet> {
    let text = key.replace('-', ":");
    text.parse::<IpNet>().ok().map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_is_written_as_usual() {
        assert_eq!(encode(net("10.0.0.0/8")), "10.0.0.0/8");
        assert_eq!(encode(net("10.1.2.3/16")), "10.1.0.0/16");
        assert_eq!(decode("10.0.0.0/8"), Some(net("10.0.0.0/8")));
    }

    #[test]
    fn ipv6_uses_dashes_and_never_starts_or_ends_with_one() {
        for (prefix, key) in [
            ("fd00::/64", "fd00--0/64"),
            ("::/0", "0--0/0"),
            ("::1/128", "0--1/128"),
            ("2001:db8:1:2::/64", "2001-db8-1-2--0/64"),
            ("fd00::1:2/120", "fd00--1-0/120"),
        ] {
            assert_eq!(encode(net(prefix)), key, "{prefix}");
            assert_eq!(decode(key), Some(net(prefix).trunc()), "{key}");
        }
    }

    #[test]
    fn the_colon_form_decodes_too_and_garbage_does_not() {
        assert_eq!(decode("fd00::/64"), Some(net("fd00::/64")));
        assert_eq!(decode("10.0.0.1"), None);
        assert_eq!(decode("app"), None);
        assert_eq!(decode("10.0.0.0/33"), None);
    }
}

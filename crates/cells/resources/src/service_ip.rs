//! ClusterIP addresses: the service ranges and allocation from them, as the API server does.
//!
//! One range per family (`service-cidr` takes one or two CIDRs, one per family, the first
//! being the cluster's default family, as the API server's `--service-cluster-ip-range`). A
//! range holds 4 to 2^20 addresses (IPv4 /12 to /30, IPv6 /108 to /126), as the API server
//! accepts. An IPv4 range's first and last addresses (network and broadcast) are never handed
//! out, an IPv6 range's first (the subnet-router anycast address) neither. As the API server
//! (since Kubernetes 1.24), a range is split into a lower band, meant for addresses people
//! choose (`clusterIP: 10.96.0.10` for DNS, say), and an upper band that allocation uses
//! first, so an allocated address rarely takes one somebody meant to choose. Allocation takes
//! the next free address after the last one allocated, wrapping, so an address freed by a
//! deleted service is not handed to the next service at once (clients may still hold it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::IpNet;

use cellium_k8s_objects::IpFamily;

/// The most host bits a range may have (2^20 addresses), as the API server allows.
const MAX_HOST_BITS: u8 = 20;
/// The fewest (4 addresses).
const MIN_HOST_BITS: u8 = 2;

/// The service range of one family.
#[derive(Debug)]
pub struct ServiceRange {
    net: IpNet,
    /// The first usable address, as a number.
    first: u128,
    /// How many usable addresses there are.
    size: u32,
    /// How many of them, from the first, make the lower band.
    lower_band: u32,
    /// The offset of the last allocated address.
    cursor: AtomicU32,
}

impl ServiceRange {
    /// The range `net` (host bits are cleared), of 4 to 2^20 addresses.
    pub fn new(net: IpNet) -> Result<ServiceRange, String> {
        let net = net.trunc();
        let host_bits = net.max_prefix_len() - net.prefix_len();
        if !(MIN_HOST_BITS..=MAX_HOST_BITS).contains(&host_bits) {
            let (short, long) = match net {
                IpNet::V4(_) => (12, 30),
                IpNet::V6(_) => (108, 126),
            };
            return Err(format!(
                "{net} is not a usable service range (the prefix must be between /{short} and /{long})"
            ));
        }
        let total = 1u32 << host_bits;
        let (first, size) = match net {
            // Neither the network nor the broadcast address.
            IpNet::V4(v4) => (u128::from(u32::from(v4.network())) + 1, total - 2),
            // Not the subnet-router anycast address.
            IpNet::V6(v6) => (u128::from(v6.network()) + 1, total - 1),
        };
        Ok(ServiceRange {
            net,
            first,
            size,
            lower_band: lower_band(total).min(size),
            cursor: AtomicU32::new(u32::MAX),
        })
    }

    /// The range as configured.
    pub fn cidr(&self) -> IpNet {
        self.net
    }

    /// Its family.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.net.addr())
    }

    fn number(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6),
        }
    }

    fn address(&self, offset: u32) -> IpAddr {
        let n = self.first + u128::from(offset);
        match self.net {
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(0))),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }

    /// Whether `ip` may be a service's address: of this range's family, inside it, not one of
    /// the addresses never handed out.
    pub fn contains(&self, ip: IpAddr) -> bool {
        IpFamily::of(ip) == self.family()
            && Self::number(ip)
                .checked_sub(self.first)
                .is_some_and(|offset| offset < u128::from(self.size))
    }

    /// The next free address (not in `used`) of the upper band after the last one allocated,
    /// else of the lower band; `None` when the range is full.
    pub fn allocate(&self, used: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        let free = |offset: u32| {
            let ip = self.address(offset);
            (!used(ip)).then_some((offset, ip))
        };
        let upper = self.size - self.lower_band;
        let start = match self.cursor.load(Ordering::Relaxed) {
            c if c >= self.lower_band && c < self.size => c + 1 - self.lower_band,
            _ => 0,
        };
        let found = (0..upper)
            .map(|i| self.lower_band + (start + i) % upper)
            .find_map(free)
            .or_else(|| (0..self.lower_band).find_map(free))?;
        self.cursor.store(found.0, Ordering::Relaxed);
        Some(found.1)
    }
}

/// The lower band's size as the API server computes it: a sixteenth of the range, at least
/// 16 and at most 256 addresses (none for a range smaller than 16).
fn lower_band(total: u32) -> u32 {
    if total < 16 {
        return 0;
    }
    (total / 16).clamp(16, 256)
}

/// The cluster's service ranges: one or two, one per family; the first is the default family
/// of services that ask for none.
#[derive(Debug)]
pub struct ServiceRanges {
    ranges: Vec<ServiceRange>,
}

impl ServiceRanges {
    /// The ranges of `cidrs` (`service-cidr`): one, or two of different families.
    pub fn new(cidrs: &[IpNet]) -> Result<ServiceRanges, String> {
        let ranges = cidrs
            .iter()
            .map(|c| ServiceRange::new(*c))
            .collect::<Result<Vec<_>, _>>()?;
        match ranges.as_slice() {
            [] => Err("no range given (one CIDR, or one per family)".into()),
            [_] => Ok(ServiceRanges { ranges }),
            [a, b] if a.family() != b.family() => Ok(ServiceRanges { ranges }),
            [a, b] => Err(format!(
                "{} and {} are both {}: give one range per family",
                a.cidr(),
                b.cidr(),
                a.family()
            )),
            _ => Err(format!(
                "{} ranges given: at most two, one per family",
                ranges.len()
            )),
        }
    }

    /// The range of `family`, if the cluster has one.
    pub fn get(&self, family: IpFamily) -> Option<&ServiceRange> {
        self.ranges.iter().find(|r| r.family() == family)
    }

    /// The default family: the first range's.
    pub fn primary(&self) -> IpFamily {
        self.ranges
            .first()
            .map_or(IpFamily::Ipv4, ServiceRange::family)
    }

    /// Whether the cluster has a range of each family.
    pub fn dual_stack(&self) -> bool {
        self.ranges.len() == 2
    }

    /// The ranges as configured, the default family's first.
    pub fn cidrs(&self) -> Vec<IpNet> {
        self.ranges.iter().map(ServiceRange::cidr).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::net::Ipv4Addr;

    use super::*;

    fn range(cidr: &str) -> ServiceRange {
        ServiceRange::new(cidr.parse().unwrap()).unwrap()
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn network_and_broadcast_addresses_are_outside() {
        let r = range("10.96.0.0/12");
        assert!(!r.contains(v4(10, 96, 0, 0)));
        assert!(r.contains(v4(10, 96, 0, 1)));
        assert!(r.contains(v4(10, 111, 255, 254)));
        assert!(!r.contains(v4(10, 111, 255, 255)));
        assert!(!r.contains(v4(10, 112, 0, 1)));
        assert!(!r.contains(v4(10, 95, 255, 255)));
    }

    #[test]
    fn sizes_outside_12_to_30_are_refused() {
        assert!(ServiceRange::new("10.0.0.0/8".parse().unwrap()).is_err());
        assert!(ServiceRange::new("10.0.0.0/31".parse().unwrap()).is_err());
        assert_eq!(
            ServiceRange::new("10.96.7.9/16".parse().unwrap())
                .unwrap()
                .cidr()
                .to_string(),
            "10.96.0.0/16"
        );
    }

    #[test]
    fn allocation_uses_the_upper_band_first_then_the_lower_one() {
        // /24: 256 addresses, a lower band of 16 (10.0.0.1 - 10.0.0.16).
        let r = range("10.0.0.0/24");
        let mut used = HashSet::new();
        let first = r.allocate(|ip| used.contains(&ip)).unwrap();
        assert_eq!(first, v4(10, 0, 0, 17));
        used.insert(first);
        assert_eq!(r.allocate(|ip| used.contains(&ip)), Some(v4(10, 0, 0, 18)));
        // 10.0.0.18 was not taken, but the cursor moved on: freed addresses wait their turn.
        assert_eq!(r.allocate(|ip| used.contains(&ip)), Some(v4(10, 0, 0, 19)));
        for last in 17..=254 {
            used.insert(v4(10, 0, 0, last));
        }
        assert_eq!(r.allocate(|ip| used.contains(&ip)), Some(v4(10, 0, 0, 1)));
        for low in 1..=16 {
            used.insert(v4(10, 0, 0, low));
        }
        assert_eq!(r.allocate(|ip| used.contains(&ip)), None);
    }

    #[test]
    fn the_cursor_wraps_within_the_upper_band() {
        let r = range("10.0.0.0/28"); // 14 usable, all in the lower band
        let used: HashSet<_> = (1..=13).map(|i| v4(10, 0, 0, i)).collect();
        assert_eq!(r.allocate(|ip| used.contains(&ip)), Some(v4(10, 0, 0, 14)));
        let r = range("10.0.0.0/24");
        let used: HashSet<_> = (17..=254).map(|i| v4(10, 0, 0, i)).collect();
        r.cursor.store(200, Ordering::Relaxed);
        let mut used2 = used.clone();
        used2.remove(&v4(10, 0, 0, 20));
        assert_eq!(r.allocate(|ip| used2.contains(&ip)), Some(v4(10, 0, 0, 20)));
    }

    #[test]
    fn ipv6_ranges_keep_only_the_subnet_router_address_and_allocate_alike() {
        let r = range("fd00:96::/108");
        assert_eq!(r.family(), IpFamily::Ipv6);
        assert!(!r.contains("fd00:96::".parse().unwrap()));
        assert!(r.contains("fd00:96::1".parse().unwrap()));
        assert!(r.contains("fd00:96::f:ffff".parse().unwrap()));
        assert!(!r.contains("fd00:96::10:0".parse().unwrap()));
        assert!(!r.contains(v4(10, 96, 0, 1)));
        // 2^20 addresses: a lower band of 256, allocation after it.
        assert_eq!(r.allocate(|_| false), Some("fd00:96::101".parse().unwrap()));
        assert!(ServiceRange::new("fd00::/64".parse().unwrap()).is_err());
        assert!(ServiceRange::new("fd00::/127".parse().unwrap()).is_err());
    }

    #[test]
    fn one_range_per_family_the_first_being_the_default() {
        let cidrs = |s: &[&str]| -> Vec<IpNet> { s.iter().map(|c| c.parse().unwrap()).collect() };
        let r = ServiceRanges::new(&cidrs(&["fd00:96::/108", "10.96.0.0/12"])).unwrap();
        assert_eq!(r.primary(), IpFamily::Ipv6);
        assert!(r.dual_stack());
        assert_eq!(
            r.get(IpFamily::Ipv4).map(ServiceRange::cidr),
            Some("10.96.0.0/12".parse().unwrap())
        );
        let single = ServiceRanges::new(&cidrs(&["10.96.0.0/12"])).unwrap();
        assert!(!single.dual_stack() && single.get(IpFamily::Ipv6).is_none());
        for bad in [
            cidrs(&[]),
            cidrs(&["10.96.0.0/12", "10.100.0.0/16"]),
            cidrs(&["10.96.0.0/12", "fd00::/108", "fd01::/108"]),
        ] {
            assert!(ServiceRanges::new(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lower_band_sizes_follow_the_api_server() {
        assert_eq!(lower_band(1 << 20), 256);
        assert_eq!(lower_band(1 << 8), 16);
        assert_eq!(lower_band(1 << 12), 256);
        assert_eq!(lower_band(1 << 10), 64);
        assert_eq!(lower_band(8), 0);
    }
}

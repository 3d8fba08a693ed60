//! ClusterIP addresses: the service range and allocation from it, as the API server does.
//!
//! The range's first and last addresses (network and broadcast) are never handed out. As the
//! API server (since Kubernetes 1.24), the range is split into a lower band, meant for
//! addresses people choose (`clusterIP: 10.96.0.10` for DNS, say), and an upper band that
//! allocation uses first, so an allocated address rarely takes one somebody meant to choose.
//! Allocation takes the next free address after the last one allocated, wrapping, so an
//! address freed by a deleted service is not handed to the next service at once (clients may
//! still hold it).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::Ipv4Net;

/// The service range of the node's cluster.
#[derive(Debug)]
pub struct ServiceRange {
    net: Ipv4Net,
    /// The first usable address (the network address + 1), as a number.
    first: u32,
    /// How many usable addresses there are.
    size: u32,
    /// How many of them, from the first, make the lower band.
    lower_band: u32,
    /// The offset of the last allocated address.
    cursor: AtomicU32,
}

impl ServiceRange {
    /// The range `net` (host bits are cleared): a /12 to a /30, as the API server accepts.
    pub fn new(net: Ipv4Net) -> Result<ServiceRange, String> {
        let net = net.trunc();
        if !(12..=30).contains(&net.prefix_len()) {
            return Err(format!(
                "{net} is not a usable service range (the prefix must be between /12 and /30)"
            ));
        }
        let total = 1u32 << (32 - net.prefix_len());
        let first = u32::from(net.network()) + 1;
        let size = total - 2;
        Ok(ServiceRange {
            net,
            first,
            size,
            lower_band: lower_band(total).min(size),
            cursor: AtomicU32::new(u32::MAX),
        })
    }

    /// The range as configured.
    pub fn cidr(&self) -> Ipv4Net {
        self.net
    }

    /// Whether `ip` may be a service's address: inside the range, neither its network nor
    /// its broadcast address.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip)
            .checked_sub(self.first)
            .is_some_and(|offset| offset < self.size)
    }

    /// The next free address (not in `used`) of the upper band after the last one allocated,
    /// else of the lower band; `None` when the range is full.
    pub fn allocate(&self, used: impl Fn(Ipv4Addr) -> bool) -> Option<Ipv4Addr> {
        let free = |offset: u32| {
            let ip = Ipv4Addr::from(self.first + offset);
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn range(cidr: &str) -> ServiceRange {
        ServiceRange::new(cidr.parse().unwrap()).unwrap()
    }

    #[test]
    fn network_and_broadcast_addresses_are_outside() {
        let r = range("10.96.0.0/12");
        assert!(!r.contains(Ipv4Addr::new(10, 96, 0, 0)));
        assert!(r.contains(Ipv4Addr::new(10, 96, 0, 1)));
        assert!(r.contains(Ipv4Addr::new(10, 111, 255, 254)));
        assert!(!r.contains(Ipv4Addr::new(10, 111, 255, 255)));
        assert!(!r.contains(Ipv4Addr::new(10, 112, 0, 1)));
        assert!(!r.contains(Ipv4Addr::new(10, 95, 255, 255)));
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
        assert_eq!(first, Ipv4Addr::new(10, 0, 0, 17));
        used.insert(first);
        assert_eq!(
            r.allocate(|ip| used.contains(&ip)),
            Some(Ipv4Addr::new(10, 0, 0, 18))
        );
        // 10.0.0.18 was not taken, but the cursor moved on: freed addresses wait their turn.
        assert_eq!(
            r.allocate(|ip| used.contains(&ip)),
            Some(Ipv4Addr::new(10, 0, 0, 19))
        );
        for last in 17..=254 {
            used.insert(Ipv4Addr::new(10, 0, 0, last));
        }
        assert_eq!(
            r.allocate(|ip| used.contains(&ip)),
            Some(Ipv4Addr::new(10, 0, 0, 1))
        );
        for low in 1..=16 {
            used.insert(Ipv4Addr::new(10, 0, 0, low));
        }
        assert_eq!(r.allocate(|ip| used.contains(&ip)), None);
    }

    #[test]
    fn the_cursor_wraps_within_the_upper_band() {
        let r = range("10.0.0.0/28"); // 14 usable, all in the lower band
        let used: HashSet<_> = (1..=13).map(|i| Ipv4Addr::new(10, 0, 0, i)).collect();
        assert_eq!(
            r.allocate(|ip| used.contains(&ip)),
            Some(Ipv4Addr::new(10, 0, 0, 14))
        );
        let r = range("10.0.0.0/24");
        let used: HashSet<_> = (17..=254).map(|i| Ipv4Addr::new(10, 0, 0, i)).collect();
        r.cursor.store(200, Ordering::Relaxed);
        let mut used2 = used.clone();
        used2.remove(&Ipv4Addr::new(10, 0, 0, 20));
        assert_eq!(
            r.allocate(|ip| used2.contains(&ip)),
            Some(Ipv4Addr::new(10, 0, 0, 20))
        );
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

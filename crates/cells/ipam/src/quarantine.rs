//! Released addresses, kept from being handed out again for a while.
//!
//! A pod's address lives on after the pod: in peers' conntrack entries and caches, in
//! Services' endpoints until they catch up, in packets still on their way. Handed to a new
//! pod at once, it would receive traffic meant for the old one. So a released address waits
//! out `ipam-release-quarantine` before anyone gets it again, by request (`IP=`) or not.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use crate::pool::Pool;

/// Released addresses with their release times, and the quarantine period.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Quarantine {
    period: Duration,
    released: BTreeMap<IpAddr, SystemTime>,
    /// Every address not held is in quarantine until then: which addresses were released
    /// shortly before is unknown (the record could not be read at start).
    all_until: Option<SystemTime>,
}

impl Quarantine {
    pub(crate) fn new(period: Duration) -> Quarantine {
        Quarantine {
            period,
            ..Quarantine::default()
        }
    }

    pub(crate) fn period(&self) -> Duration {
        self.period
    }

    /// Whether `ip`, not held, may not be handed out at `now`: when it was released (if
    /// known) and until when it waits.
    pub(crate) fn until(
        &self,
        ip: IpAddr,
        now: SystemTime,
    ) -> Option<(Option<SystemTime>, SystemTime)> {
        let own = self
            .released
            .get(&ip)
            .map(|at| (Some(*at), *at + self.period));
        let all = self.all_until.map(|until| (None, until));
        [own, all]
            .into_iter()
            .flatten()
            .filter(|(_, until)| *until > now)
            .max_by_key(|(_, until)| *until)
    }

    /// Puts `ip` in quarantine from `now` (nothing when the period is zero).
    pub(crate) fn add(&mut self, ip: IpAddr, now: SystemTime) {
        if !self.period.is_zero() {
            self.released.insert(ip, now);
        }
    }

    /// Restores an entry read back from the record, trusting no time from the future (a
    /// clock set back, or a hostile file): such an entry counts from `now`.
    pub(crate) fn restore(&mut self, ip: IpAddr, released: SystemTime, now: SystemTime) {
        self.add(ip, released.min(now));
    }

    /// Puts every address not held in quarantine from `now`.
    pub(crate) fn add_all(&mut self, now: SystemTime) {
        self.set_all_until(now + self.period, now);
    }

    /// Restores a blanket quarantine read back from the record, no longer than a period
    /// from `now`.
    pub(crate) fn set_all_until(&mut self, until: SystemTime, now: SystemTime) {
        let until = until.min(now + self.period);
        if until > now {
            self.all_until = Some(until);
        }
    }

    /// Takes `ip` out of quarantine: it is held (again) by someone who never released it.
    pub(crate) fn remove(&mut self, ip: IpAddr) {
        self.released.remove(&ip);
    }

    /// Forgets what has waited long enough.
    pub(crate) fn prune(&mut self, now: SystemTime) {
        let period = self.period;
        self.released.retain(|_, at| *at + period > now);
        if self.all_until.is_some_and(|until| until <= now) {
            self.all_until = None;
        }
    }

    /// How many addresses of `pool` that nobody holds are in quarantine at `now`.
    pub(crate) fn count_in(&self, pool: &Pool, now: SystemTime) -> u64 {
        if self.all_until.is_some_and(|until| until > now) {
            return pool.capacity() - pool.used();
        }
        self.released
            .iter()
            .filter(|(ip, at)| {
                pool.contains(**ip) && pool.owner(**ip).is_none() && **at + self.period > now
            })
            .count() as u64
    }

    /// The entries in effect: (address, release time), and the blanket's end.
    pub(crate) fn entries(&self) -> (&BTreeMap<IpAddr, SystemTime>, Option<SystemTime>) {
        (&self.released, self.all_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_waits_out_the_period_from_its_release() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut q = Quarantine::new(Duration::from_secs(60));
        q.add(ip("10.0.0.5"), t0);
        assert_eq!(
            q.until(ip("10.0.0.5"), t0 + Duration::from_secs(59)),
            Some((Some(t0), t0 + Duration::from_secs(60)))
        );
        assert_eq!(q.until(ip("10.0.0.5"), t0 + Duration::from_secs(60)), None);
        assert_eq!(q.until(ip("10.0.0.6"), t0), None);
        q.prune(t0 + Duration::from_secs(60));
        assert!(q.entries().0.is_empty());
    }

    #[test]
    fn a_zero_period_quarantines_nothing() {
        let now = SystemTime::now();
        let mut q = Quarantine::new(Duration::ZERO);
        q.add(ip("10.0.0.5"), now);
        q.add_all(now);
        assert_eq!(q.until(ip("10.0.0.5"), now), None);
        assert_eq!(q.entries(), (&BTreeMap::new(), None));
    }

    #[test]
    fn times_from_the_future_count_from_now_and_a_blanket_is_at_most_one_period() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let far = now + Duration::from_secs(86_400 * 365);
        let mut q = Quarantine::new(Duration::from_secs(60));
        q.restore(ip("10.0.0.5"), far, now);
        assert_eq!(
            q.until(ip("10.0.0.5"), now),
            Some((Some(now), now + Duration::from_secs(60)))
        );
        q.set_all_until(far, now);
        assert_eq!(
            q.until(ip("10.0.0.9"), now),
            Some((None, now + Duration::from_secs(60)))
        );
    }
}

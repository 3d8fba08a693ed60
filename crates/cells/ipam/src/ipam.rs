//! The allocator over all of the node's pools.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use cellium_hive::{Config, Hook, Lifecycle, Reporter};
use cellium_resources::Resources;
use cellium_statedir::StateDir;
use ipnet::IpNet;

use crate::config::{IpamConfig, IpamMode};
use crate::error::{Error, Result};
use crate::node_cidrs;
use crate::pool::{Owner, Pool};
use crate::quarantine::Quarantine;
use crate::record::{Record, to_ms};
use crate::store::Store;

/// An address handed out, with what a pod needs to use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The address.
    pub ip: IpAddr,
    /// The pool's CIDR.
    pub cidr: IpNet,
    /// The pool's router: the pod's gateway.
    pub router: IpAddr,
}

/// A pool as `cellium ipam list` shows it.
#[derive(Debug, Clone)]
pub struct PoolInfo {
    /// The CIDR.
    pub cidr: IpNet,
    /// Where it came from.
    pub source: String,
    /// Addresses pods can get.
    pub capacity: u64,
    /// Addresses pods hold.
    pub used: u64,
    /// The router address.
    pub router: IpAddr,
    /// Every held address with its owner.
    pub allocations: Vec<(IpAddr, Owner)>,
}

/// The node's IP address manager.
///
/// Host scope: it hands out addresses of the node's own pod CIDRs and records who holds each.
/// Who holds what is not kept on disk: the endpoints are that record, and the endpoint manager
/// re-reserves every restored endpoint's addresses with [`restore`](Ipam::restore) at start,
/// before the API (and so any CNI ADD) is served; that order is what keeps an address from
/// being handed out twice across a restart.
///
/// What is kept, in `ipam.json` in the state directory, is where each pool's round-robin
/// cursor stands and which addresses were released recently: a released address is in
/// quarantine for `ipam-release-quarantine` (by request or not, nobody gets it), so that a
/// new pod never receives traffic meant for the pod that had it, also across a restart.
/// Every call that changes the record writes it before it returns, or fails and changes
/// nothing.
#[derive(Debug)]
pub struct Ipam {
    inner: Mutex<Inner>,
    store: Option<Store>,
}

/// Everything a call may change, cloned before the change so that a failed write can put it
/// back.
#[derive(Debug, Clone)]
pub(crate) struct Inner {
    pub(crate) pools: Vec<Pool>,
    pub(crate) quarantine: Quarantine,
    /// The record as last written (or read), to skip writes that change nothing.
    pub(crate) written: Option<Record>,
}

impl Inner {
    pub(crate) fn record(&self) -> Record {
        let mut record = Record::new();
        for pool in &self.pools {
            record.cursors.insert(pool.cidr(), pool.cursor());
        }
        let (released, all_until) = self.quarantine.entries();
        record.quarantine = released.iter().map(|(ip, at)| (*ip, to_ms(*at))).collect();
        record.all_until = all_until.map(to_ms);
        record
    }

    fn pool_of(&mut self, ip: IpAddr) -> Result<&mut Pool> {
        let first = self.pools.first().map(Pool::cidr);
        self.pools
            .iter_mut()
            .find(|p| p.contains(ip))
            .ok_or_else(|| Error::NotInPool {
                ip,
                cidr: first.unwrap_or_else(|| IpNet::from(ip)),
            })
    }

    /// Hands `ip` to `owner` unless it is in quarantine (a repeat by its holder is fine).
    fn reserve(&mut self, ip: IpAddr, owner: &str, now: SystemTime) -> Result<Allocation> {
        let quarantined = self.quarantine.until(ip, now);
        let pool = self.pool_of(ip)?;
        if pool.owner(ip).is_none()
            && let Some((released, until)) = quarantined
        {
            return Err(Error::Quarantined {
                ip,
                released,
                until,
            });
        }
        pool.allocate(ip, owner)?;
        Ok(allocation(pool, ip))
    }

    fn reserve_next(&mut self, family_: u8, owner: &str, now: SystemTime) -> Result<Allocation> {
        let Inner {
            pools, quarantine, ..
        } = self;
        let mut last_err = Error::NoPool { family: family_ };
        for pool in pools.iter_mut().filter(|p| family(p.cidr()) == family_) {
            let held_back = quarantine.count_in(pool, now);
            let in_quarantine = |ip| quarantine.until(ip, now).is_some();
            match pool.allocate_next_where(owner, in_quarantine, held_back) {
                Ok(ip) => return Ok(allocation(pool, ip)),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    fn families(&self) -> Vec<u8> {
        [4u8, 6]
            .into_iter()
            .filter(|f| self.pools.iter().any(|p| family(p.cidr()) == *f))
            .collect()
    }
}

impl Ipam {
    /// The allocator over the configured `pod-cidr`s (`ipam: config`) or the Node's pod CIDRs
    /// (`ipam: kubernetes`, which needs `resources` in Kubernetes mode), keeping its record in
    /// `state`; the `restore-ipam` start hook adds the Node's pools and reads the record back.
    pub fn new(
        cfg: Config<IpamConfig>,
        lc: Lifecycle,
        reporter: Reporter,
        state: Arc<StateDir>,
        resources: Option<Arc<Resources>>,
    ) -> Result<Arc<Ipam>> {
        let from_node = match cfg.ipam {
            IpamMode::Config => None,
            mode => {
                let resources = resources.ok_or(Error::NotKubernetes)?;
                let node = resources.node_name().ok_or(Error::NotKubernetes)?;
                Some((resources, node, mode))
            }
        };
        let cidrs: &[IpNet] = if from_node.is_some() {
            &[]
        } else {
            &cfg.pod_cidr
        };
        let mut ipam = Ipam::with_pools(cidrs, "config")
            .map_err(|e| Error::PodCidr {
                source: Box::new(e),
            })?
            .with_quarantine(cfg.ipam_release_quarantine);
        let waiting = reporter.child("pod-cidrs");
        ipam.store = Some(Store::new(state, reporter));
        let ipam = Arc::new(ipam);
        let this = ipam.clone();
        // Before the endpoint manager's restore (it depends on the allocator, so its hooks
        // come later): restored endpoints re-reserve against the restored quarantine, and
        // within the Node's pools.
        lc.append(Hook::new("restore-ipam").on_start(move |ctx| async move {
            if let Some((resources, node, mode)) = from_node {
                node_cidrs::wait_and_add(&this, &resources, &node, mode, &waiting, &ctx).await?;
                waiting.remove();
            } else {
                waiting.remove();
            }
            this.restore_record();
            Ok(())
        }));
        Ok(ipam)
    }

    /// An allocator over `cidrs`, all from `source`, kept in memory only, with no quarantine.
    pub fn with_pools(cidrs: &[IpNet], source: &str) -> Result<Ipam> {
        let ipam = Ipam {
            inner: Mutex::new(Inner {
                pools: Vec::new(),
                quarantine: Quarantine::new(Duration::ZERO),
                written: None,
            }),
            store: None,
        };
        for cidr in cidrs {
            ipam.add_pool(*cidr, source)?;
        }
        Ok(ipam)
    }

    /// Keeps released addresses from being handed out again for `period` (zero: never).
    pub fn with_quarantine(self, period: Duration) -> Ipam {
        self.lock().quarantine = Quarantine::new(period);
        self
    }

    /// Adds a pool; this is how other sources (the Kubernetes Node's `podCIDRs`, a cluster-pool
    /// operator) feed the allocator. Overlapping an existing pool is an error, and so is a
    /// CIDR that cannot serve pods (loopback, link-local, multicast, too broad...).
    pub fn add_pool(&self, cidr: IpNet, source: &str) -> Result<()> {
        let pool = Pool::new(cidr, source)?;
        let mut inner = self.lock();
        if let Some(other) = inner
            .pools
            .iter()
            .find(|p| p.cidr().contains(&pool.cidr()) || pool.cidr().contains(&p.cidr()))
        {
            return Err(Error::Overlap {
                cidr: pool.cidr(),
                other: other.cidr(),
            });
        }
        tracing::info!(cidr = %pool.cidr(), source, "pod CIDR added");
        inner.pools.push(pool);
        Ok(())
    }

    /// Which families (4, 6) have a pool.
    pub fn families(&self) -> Vec<u8> {
        self.lock().families()
    }

    /// Hands the next free address of `family` (4 or 6) that is not in quarantine to `owner`.
    pub fn allocate_next(&self, family_: u8, owner: &str) -> Result<Allocation> {
        self.change(|inner, now| inner.reserve_next(family_, owner, now))
    }

    /// Hands the requested `ip` to `owner` (idempotent for the same owner). An address in
    /// quarantine is refused with [`Error::Quarantined`], saying until when.
    pub fn allocate(&self, ip: IpAddr, owner: &str) -> Result<Allocation> {
        self.change(|inner, now| inner.reserve(ip, owner, now))
    }

    /// What a pod's create asks for, all or nothing: the `requested` addresses, or with none
    /// requested the next free address of each configured family. A request naming an
    /// address twice is refused ([`Error::DuplicateRequest`]); on any refusal nothing is
    /// allocated, and nothing is put in quarantine either.
    pub fn allocate_many(&self, requested: &[IpAddr], owner: &str) -> Result<Vec<Allocation>> {
        let mut seen = HashSet::new();
        if let Some(ip) = requested.iter().find(|ip| !seen.insert(**ip)) {
            return Err(Error::DuplicateRequest { ip: *ip });
        }
        self.change(|inner, now| {
            if requested.is_empty() {
                let families = inner.families();
                if families.is_empty() {
                    return Err(Error::NoPool { family: 4 });
                }
                families
                    .into_iter()
                    .map(|f| inner.reserve_next(f, owner, now))
                    .collect()
            } else {
                requested
                    .iter()
                    .map(|ip| inner.reserve(*ip, owner, now))
                    .collect()
            }
        })
    }

    /// Re-reserves `ip` for `owner`, who held it before the restart: the endpoint manager's
    /// restore. An address held all along was never released, so the quarantine does not
    /// apply (the entry of an address released and then restored is dropped), and a failure
    /// to write the record does not fail it: only a quarantine entry of an address held again
    /// would be lost. Fails only if someone else holds `ip` or it lies in no pool.
    pub fn restore(&self, ip: IpAddr, owner: &str) -> Result<Allocation> {
        let mut inner = self.lock();
        let pool = inner.pool_of(ip)?;
        pool.allocate(ip, owner)?;
        let allocation = allocation(pool, ip);
        inner.quarantine.remove(ip);
        if let Err(e) = self.persist(&mut inner, SystemTime::now()) {
            tracing::warn!(%ip, error = %e, "the record is written with the next change");
        }
        Ok(allocation)
    }

    /// Takes `ip` back and puts it in quarantine, returning who held it. If the record
    /// cannot be written, nothing changes and the error says why.
    pub fn try_release(&self, ip: IpAddr) -> Result<Option<Owner>> {
        self.change(|inner, now| {
            let Ok(pool) = inner.pool_of(ip) else {
                return Ok(None);
            };
            let released = pool.release(ip);
            if released.is_some() {
                inner.quarantine.add(ip, now);
            }
            Ok(released)
        })
    }

    /// Takes `ip` back and puts it in quarantine, returning who held it.
    ///
    /// Trap: when the record cannot be written the address is still released and
    /// quarantined, in memory only (the module turns Degraded, and the quarantine entry is
    /// lost if the agent restarts before a later write succeeds). Use
    /// [`try_release`](Ipam::try_release) to fail instead.
    pub fn release(&self, ip: IpAddr) -> Option<Owner> {
        let released = match self.try_release(ip) {
            Ok(released) => released,
            Err(e) => {
                tracing::error!(%ip, error = %e, "releasing in memory only");
                let mut inner = self.lock();
                let now = SystemTime::now();
                let released = inner.pool_of(ip).ok().and_then(|p| p.release(ip));
                if released.is_some() {
                    inner.quarantine.add(ip, now);
                }
                released
            }
        };
        if let Some(owner) = &released {
            tracing::debug!(%ip, owner, "address released");
        }
        released
    }

    /// Puts `ip`, which nobody holds, in quarantine as if released now: for the addresses of
    /// an endpoint found dead at restore, never re-reserved and so never released. Returns
    /// whether it did (an address someone holds is left alone).
    pub fn retire(&self, ip: IpAddr) -> Result<bool> {
        self.change(|inner, now| {
            let pool = inner.pool_of(ip)?;
            if pool.owner(ip).is_some() {
                return Ok(false);
            }
            inner.quarantine.add(ip, now);
            Ok(true)
        })
    }

    /// Addresses nobody holds that are in quarantine now, with the time each leaves it.
    pub fn quarantined(&self) -> Vec<(IpAddr, SystemTime)> {
        let inner = self.lock();
        let now = SystemTime::now();
        let (released, _) = inner.quarantine.entries();
        released
            .keys()
            .filter_map(|ip| Some((*ip, inner.quarantine.until(*ip, now)?.1)))
            .collect()
    }

    /// How long a released address stays in quarantine.
    pub fn quarantine_period(&self) -> Duration {
        self.lock().quarantine.period()
    }

    /// Who holds `ip`.
    pub fn owner(&self, ip: IpAddr) -> Option<Owner> {
        self.lock()
            .pools
            .iter()
            .find(|p| p.contains(ip))
            .and_then(|p| p.owner(ip).map(str::to_string))
    }

    /// The router (gateway) address of the pool `ip` belongs to.
    pub fn router_for(&self, ip: IpAddr) -> Option<IpAddr> {
        self.lock()
            .pools
            .iter()
            .find(|p| p.contains(ip))
            .map(Pool::router)
    }

    /// The routers of every pool: the node's own addresses on the pod networks.
    pub fn routers(&self) -> Vec<(IpAddr, IpNet)> {
        self.lock()
            .pools
            .iter()
            .map(|p| (p.router(), p.cidr()))
            .collect()
    }

    /// Every pool with its allocations.
    pub fn pools(&self) -> Vec<PoolInfo> {
        self.lock()
            .pools
            .iter()
            .map(|p| PoolInfo {
                cidr: p.cidr(),
                source: p.source().to_string(),
                capacity: p.capacity(),
                used: p.used(),
                router: p.router(),
                allocations: p.allocations().map(|(ip, o)| (ip, o.to_string())).collect(),
            })
            .collect()
    }

    /// Runs a change and writes the record; if either fails, everything is as before.
    fn change<T>(&self, f: impl FnOnce(&mut Inner, SystemTime) -> Result<T>) -> Result<T> {
        let mut inner = self.lock();
        let before = inner.clone();
        let now = SystemTime::now();
        let result = f(&mut inner, now).and_then(|value| {
            self.persist(&mut inner, now)?;
            Ok(value)
        });
        if result.is_err() {
            *inner = before;
        }
        result
    }

    /// Writes the record if it changed (a no-op without a state directory).
    pub(crate) fn persist(&self, inner: &mut Inner, now: SystemTime) -> Result<()> {
        inner.quarantine.prune(now);
        let Some(store) = &self.store else {
            return Ok(());
        };
        let record = inner.record();
        if inner.written.as_ref() == Some(&record) {
            return Ok(());
        }
        store.write(&record, &inner.quarantine, now)?;
        inner.written = Some(record);
        Ok(())
    }

    pub(crate) fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the pools consistent (every mutation is a
        // single insert or remove, or a whole restore of a snapshot), so a poisoned lock is
        // safe to keep using.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn family(cidr: IpNet) -> u8 {
    match cidr {
        IpNet::V4(_) => 4,
        IpNet::V6(_) => 6,
    }
}

fn allocation(pool: &Pool, ip: IpAddr) -> Allocation {
    Allocation {
        ip,
        cidr: pool.cidr(),
        router: pool.router(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(cidrs: &[&str]) -> Ipam {
        let cidrs: Vec<IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        Ipam::with_pools(&cidrs, "config").unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_family_comes_from_its_own_pool() {
        let ipam = ipam(&["10.1.0.0/24", "fd00:1::/64"]);
        assert_eq!(ipam.families(), vec![4, 6]);
        let v4 = ipam.allocate_next(4, "a").unwrap();
        let v6 = ipam.allocate_next(6, "a").unwrap();
        assert_eq!(v4.ip.to_string(), "10.1.0.2");
        assert_eq!(v4.router.to_string(), "10.1.0.1");
        assert_eq!(v6.ip.to_string(), "fd00:1::2");
        assert_eq!(ipam.owner(v6.ip).as_deref(), Some("a"));
    }

    #[test]
    fn a_full_pool_moves_on_to_the_next_one() {
        let ipam = ipam(&["10.1.0.0/30", "10.2.0.0/30"]);
        assert_eq!(
            ipam.allocate_next(4, "a").unwrap().ip.to_string(),
            "10.1.0.2"
        );
        assert_eq!(
            ipam.allocate_next(4, "b").unwrap().ip.to_string(),
            "10.2.0.2"
        );
        let err = ipam.allocate_next(4, "c").unwrap_err();
        assert!(err.to_string().contains("exhausted"), "{err}");
    }

    #[test]
    fn a_missing_family_is_named() {
        let err = ipam(&["10.1.0.0/24"]).allocate_next(6, "a").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no IPv6 pod CIDR is configured (set pod-cidr)"
        );
    }

    #[test]
    fn overlapping_pools_are_refused() {
        let cidrs: Vec<IpNet> = vec![
            "10.0.0.0/16".parse().unwrap(),
            "10.0.1.0/24".parse().unwrap(),
        ];
        let err = Ipam::with_pools(&cidrs, "config").unwrap_err();
        assert_eq!(err.to_string(), "pod CIDR 10.0.1.0/24 overlaps 10.0.0.0/16");
    }

    #[test]
    fn release_returns_the_owner_and_frees_the_address() {
        let ipam = ipam(&["10.1.0.0/24"]);
        let a = ipam.allocate("10.1.0.50".parse().unwrap(), "a").unwrap();
        assert_eq!(ipam.release(a.ip).as_deref(), Some("a"));
        assert_eq!(ipam.release(a.ip), None);
        ipam.allocate(a.ip, "b").unwrap();
        let info = &ipam.pools()[0];
        assert_eq!(info.used, 1);
        assert_eq!(info.capacity, 253);
    }

    #[test]
    fn a_released_address_is_in_quarantine_for_requests_and_round_robin() {
        let ipam = ipam(&["10.1.0.0/29"]).with_quarantine(Duration::from_secs(60));
        let a = ipam.allocate(ip("10.1.0.2"), "pod-a").unwrap();
        assert_eq!(ipam.release(a.ip).as_deref(), Some("pod-a"));
        let err = ipam.allocate(a.ip, "pod-b").unwrap_err();
        let Error::Quarantined {
            ip: got,
            released: Some(released),
            until,
        } = err
        else {
            panic!("{err}");
        };
        assert_eq!(got, a.ip);
        assert_eq!(
            until.duration_since(released).unwrap(),
            Duration::from_secs(60)
        );
        let text = Error::Quarantined {
            ip: got,
            released: Some(released),
            until,
        }
        .to_string();
        assert!(
            text.contains("10.1.0.2") && text.contains("in quarantine until"),
            "{text}"
        );
        // Round robin fills the other four and then reports the one in quarantine.
        for _ in 0..4 {
            assert_ne!(ipam.allocate_next(4, "x").unwrap().ip, a.ip);
        }
        let err = ipam.allocate_next(4, "x").unwrap_err();
        assert!(
            matches!(err, Error::Exhausted { quarantined: 1, .. }),
            "{err}"
        );
        assert_eq!(ipam.quarantined().len(), 1);
    }

    #[test]
    fn a_zero_quarantine_hands_a_released_address_out_again() {
        let ipam = ipam(&["10.1.0.0/24"]).with_quarantine(Duration::ZERO);
        let a = ipam.allocate(ip("10.1.0.7"), "a").unwrap();
        ipam.release(a.ip);
        ipam.allocate(a.ip, "b").unwrap();
    }

    #[test]
    fn a_duplicate_or_failing_request_allocates_nothing() {
        let ipam = ipam(&["10.1.0.0/24", "fd00::/64"]).with_quarantine(Duration::from_secs(60));
        let err = ipam
            .allocate_many(&[ip("10.1.0.5"), ip("fd00::5"), ip("10.1.0.5")], "a")
            .unwrap_err();
        assert!(matches!(err, Error::DuplicateRequest { .. }), "{err}");
        assert_eq!(err.to_string(), "address 10.1.0.5 is requested twice");
        ipam.allocate(ip("10.1.0.6"), "b").unwrap();
        let err = ipam
            .allocate_many(&[ip("10.1.0.5"), ip("10.1.0.6")], "a")
            .unwrap_err();
        assert!(matches!(err, Error::InUse { .. }), "{err}");
        assert_eq!(ipam.owner(ip("10.1.0.5")), None, "rolled back");
        assert!(
            ipam.quarantined().is_empty(),
            "an address taken back by a failed request was never used: no quarantine"
        );
        ipam.allocate(ip("10.1.0.5"), "c").unwrap();
        let both = ipam.allocate_many(&[], "d").unwrap();
        assert_eq!(both.len(), 2, "{both:?}");
        let small = ipam_small_v6_full();
        let err = small.allocate_many(&[], "e").unwrap_err();
        assert!(matches!(err, Error::Exhausted { .. }), "{err}");
        assert_eq!(small.pools()[0].used, 0, "the IPv4 address was given back");
    }

    /// An IPv4 pool with room and a full IPv6 pool (a /126 holds a router and two pods).
    fn ipam_small_v6_full() -> Ipam {
        let ipam = ipam(&["10.9.0.0/24", "fd09::/126"]);
        for _ in 0..2 {
            ipam.allocate_next(6, "full").unwrap();
        }
        ipam
    }

    #[test]
    fn restore_is_not_held_back_by_the_quarantine() {
        let ipam = ipam(&["10.1.0.0/24"]).with_quarantine(Duration::from_secs(60));
        let a = ipam.allocate(ip("10.1.0.9"), "endpoint 3").unwrap();
        ipam.release(a.ip);
        assert!(ipam.allocate(a.ip, "endpoint 3").is_err());
        assert_eq!(ipam.restore(a.ip, "endpoint 3").unwrap(), a);
        assert!(ipam.quarantined().is_empty());
        let err = ipam.restore(a.ip, "endpoint 4").unwrap_err();
        assert!(matches!(err, Error::InUse { .. }), "{err}");
        assert!(!ipam.retire(a.ip).unwrap(), "a held address is left alone");
        assert!(ipam.retire(ip("10.1.0.10")).unwrap());
        assert!(matches!(
            ipam.allocate(ip("10.1.0.10"), "x"),
            Err(Error::Quarantined { .. })
        ));
    }
}

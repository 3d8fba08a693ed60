//! The allocator over all of the node's pools.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_hive::Config;
use ipnet::IpNet;

use crate::config::IpamConfig;
use crate::error::{Error, Result};
use crate::pool::{Owner, Pool};

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
/// It keeps no state on disk: the endpoints are the record, and the endpoint manager
/// re-reserves every restored endpoint's addresses at start, before the API (and so any CNI
/// ADD) is served; that order is what keeps an address from being handed out twice across a
/// restart.
#[derive(Debug)]
pub struct Ipam {
    pools: Mutex<Vec<Pool>>,
}

impl Ipam {
    /// The allocator over the configured `pod-cidr`s.
    pub fn new(cfg: Config<IpamConfig>) -> Result<Arc<Ipam>> {
        let ipam = Ipam::with_pools(&cfg.pod_cidr, "config")?;
        Ok(Arc::new(ipam))
    }

    /// An allocator over `cidrs`, all from `source`.
    pub fn with_pools(cidrs: &[IpNet], source: &str) -> Result<Ipam> {
        let ipam = Ipam {
            pools: Mutex::new(Vec::new()),
        };
        for cidr in cidrs {
            ipam.add_pool(*cidr, source)?;
        }
        Ok(ipam)
    }

    /// Adds a pool; this is how other sources (the Kubernetes Node's `podCIDRs`, a cluster-pool
    /// operator) feed the allocator. Overlapping an existing pool is an error.
    pub fn add_pool(&self, cidr: IpNet, source: &str) -> Result<()> {
        let pool = Pool::new(cidr, source)?;
        let mut pools = self.lock();
        if let Some(other) = pools
            .iter()
            .find(|p| p.cidr().contains(&pool.cidr()) || pool.cidr().contains(&p.cidr()))
        {
            return Err(Error::Overlap {
                cidr: pool.cidr(),
                other: other.cidr(),
            });
        }
        tracing::info!(cidr = %pool.cidr(), source, "pod CIDR added");
        pools.push(pool);
        Ok(())
    }

    /// Which families (4, 6) have a pool.
    pub fn families(&self) -> Vec<u8> {
        let pools = self.lock();
        [4u8, 6]
            .into_iter()
            .filter(|f| pools.iter().any(|p| family(p.cidr()) == *f))
            .collect()
    }

    /// Hands the next free address of `family` (4 or 6) to `owner`.
    pub fn allocate_next(&self, family_: u8, owner: &str) -> Result<Allocation> {
        let mut pools = self.lock();
        let mut last_err = Error::NoPool { family: family_ };
        for pool in pools.iter_mut().filter(|p| family(p.cidr()) == family_) {
            match pool.allocate_next(owner) {
                Ok(ip) => return Ok(allocation(pool, ip)),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    /// Hands the requested `ip` to `owner` (idempotent for the same owner).
    pub fn allocate(&self, ip: IpAddr, owner: &str) -> Result<Allocation> {
        let mut pools = self.lock();
        let Some(pool) = pools.iter_mut().find(|p| p.contains(ip)) else {
            let cidr = pools
                .first()
                .map(Pool::cidr)
                .unwrap_or_else(|| IpNet::from(ip));
            return Err(Error::NotInPool { ip, cidr });
        };
        pool.allocate(ip, owner)?;
        Ok(allocation(pool, ip))
    }

    /// Takes `ip` back, returning who held it.
    pub fn release(&self, ip: IpAddr) -> Option<Owner> {
        let released = self
            .lock()
            .iter_mut()
            .find(|p| p.contains(ip))
            .and_then(|p| p.release(ip));
        if let Some(owner) = &released {
            tracing::debug!(%ip, owner, "address released");
        }
        released
    }

    /// Who holds `ip`.
    pub fn owner(&self, ip: IpAddr) -> Option<Owner> {
        self.lock()
            .iter()
            .find(|p| p.contains(ip))
            .and_then(|p| p.owner(ip).map(str::to_string))
    }

    /// The router (gateway) address of the pool `ip` belongs to.
    pub fn router_for(&self, ip: IpAddr) -> Option<IpAddr> {
        self.lock()
            .iter()
            .find(|p| p.contains(ip))
            .map(Pool::router)
    }

    /// The routers of every pool: the node's own addresses on the pod networks.
    pub fn routers(&self) -> Vec<(IpAddr, IpNet)> {
        self.lock().iter().map(|p| (p.router(), p.cidr())).collect()
    }

    /// Every pool with its allocations.
    pub fn pools(&self) -> Vec<PoolInfo> {
        self.lock()
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

    fn lock(&self) -> MutexGuard<'_, Vec<Pool>> {
        // A panic while holding the lock leaves the pools consistent (every mutation is a
        // single insert or remove), so a poisoned lock is safe to keep using.
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
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
}

//! The cluster's pod CIDR pools and who holds what: no I/O, so every rule is tested here.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;

use crate::config::ClusterPoolConfig;
use crate::error::{Error, Result};

/// An address family of the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Family::V4 => "cluster-pool-ipv4-cidr",
            Family::V6 => "cluster-pool-ipv6-cidr",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// One family's pools, and the prefix length of what is cut from them.
#[derive(Debug, Clone)]
struct Pools {
    family: Family,
    cidrs: Vec<IpNet>,
    mask: u8,
}

/// Why a node's CIDR could not be taken or given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another node holds this CIDR, or one overlapping it.
    Conflict { cidr: IpNet, owner: String },
    /// No CIDR of this family is left.
    Exhausted { family: Family, pools: Vec<IpNet> },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Conflict { cidr, owner } => {
                write!(f, "pod CIDR {cidr} is already allocated to node {owner}")
            }
            Refusal::Exhausted { family, pools } => {
                let pools: Vec<String> = pools.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "{family} pool exhausted: no free pod CIDR left in {} ({})",
                    pools.join(", "),
                    family.key()
                )
            }
        }
    }
}

/// The pools and every node's CIDRs of them.
#[derive(Debug, Clone)]
pub(crate) struct ClusterPool {
    pools: Vec<Pools>,
    /// CIDR (of a pool) -> the node holding it.
    owners: BTreeMap<IpNet, String>,
}

/// What [`ClusterPool::assign`] decided for a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// The node's pod CIDRs as they should be written: those it had, then new ones.
    pub(crate) pod_cidrs: Vec<IpNet>,
    /// Whether `pod_cidrs` differs from what the node has.
    pub(crate) changed: bool,
    /// What could not be done, for the node's `status.ipam.operator-status.error`.
    pub(crate) refusals: Vec<Refusal>,
}

impl ClusterPool {
    /// The pools of the configuration, checked: each CIDR of its key's family, and a mask
    /// size no shorter than any pool's prefix.
    pub(crate) fn new(cfg: &ClusterPoolConfig) -> Result<ClusterPool> {
        let mut pools = Vec::new();
        for (family, cidrs, mask, mask_key, max) in [
            (
                Family::V4,
                &cfg.cluster_pool_ipv4_cidr,
                cfg.cluster_pool_ipv4_mask_size,
                "cluster-pool-ipv4-mask-size",
                32,
            ),
            (
                Family::V6,
                &cfg.cluster_pool_ipv6_cidr,
                cfg.cluster_pool_ipv6_mask_size,
                "cluster-pool-ipv6-mask-size",
                128,
            ),
        ] {
            if cidrs.is_empty() {
                continue;
            }
            if mask > max {
                return Err(Error::Config {
                    key: mask_key,
                    reason: format!("{mask} is longer than an {family} prefix ({max})"),
                });
            }
            for (i, cidr) in cidrs.iter().enumerate() {
                if Family::of(cidr) != family {
                    return Err(Error::Config {
                        key: family.key(),
                        reason: format!("{cidr} is not an {family} CIDR"),
                    });
                }
                if cidr.prefix_len() > mask {
                    return Err(Error::Config {
                        key: mask_key,
                        reason: format!("{mask} is shorter than the prefix of the pool {cidr}"),
                    });
                }
                if let Some(other) = cidrs[..i]
                    .iter()
                    .find(|o| o.contains(cidr) || cidr.contains(*o))
                {
                    return Err(Error::Config {
                        key: family.key(),
                        reason: format!("{cidr} overlaps {other}"),
                    });
                }
            }
            pools.push(Pools {
                family,
                cidrs: cidrs.iter().map(IpNet::trunc).collect(),
                mask,
            });
        }
        Ok(ClusterPool {
            pools,
            owners: BTreeMap::new(),
        })
    }

    /// Whether any family has a pool.
    pub(crate) fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// The pool a node's CIDR belongs to: of its family, inside one of its CIDRs, with its
    /// mask size. CIDRs outside every pool are the node's own business: kept, never handed
    /// out, never in conflict.
    fn pool_of(&self, cidr: &IpNet) -> Option<&Pools> {
        self.pools.iter().find(|p| {
            p.family == Family::of(cidr) && p.cidrs.iter().any(|pool| pool.contains(cidr))
        })
    }

    /// Who holds `cidr` or a CIDR overlapping it, other than `node`.
    ///
    /// Held CIDRs are ordered by (network address, prefix length), so those inside `cidr`
    /// are one range of the map and those around it are its supernets, one per shorter
    /// prefix: a lookup costs a logarithm, not a walk of every node, which matters when a
    /// thousand nodes are given CIDRs at a leader's start.
    fn holder(&self, cidr: &IpNet, node: &str) -> Option<&String> {
        let cidr = cidr.trunc();
        let last = IpNet::new(cidr.broadcast(), cidr.max_prefix_len()).ok()?;
        let inside = self
            .owners
            .range(cidr..=last)
            .find(|(held, owner)| owner.as_str() != node && cidr.contains(*held));
        if let Some((_, owner)) = inside {
            return Some(owner);
        }
        (0..cidr.prefix_len())
            .filter_map(|len| IpNet::new(cidr.addr(), len).ok().map(|n| n.trunc()))
            .filter_map(|sup| self.owners.get(&sup))
            .find(|owner| owner.as_str() != node)
    }

    /// The CIDRs `node` holds.
    pub(crate) fn held_by(&self, node: &str) -> Vec<IpNet> {
        self.owners
            .iter()
            .filter(|(_, o)| o.as_str() == node)
            .map(|(c, _)| *c)
            .collect()
    }

    /// Decides `node`'s pod CIDRs from those it has (`current`, its `spec.ipam.podCIDRs`):
    /// each it has is occupied for it, unless another node holds it (a conflict, left in
    /// its spec and reported); each family with a pool and none of the node's CIDRs gets
    /// one: one it was given before and whose write did not land, or the first free one.
    ///
    /// Idempotent: the same `current` twice gives the same answer and holds the same.
    pub(crate) fn assign(&mut self, node: &str, current: &[IpNet]) -> Assignment {
        let mut out = Assignment {
            pod_cidrs: current.to_vec(),
            refusals: self.occupy(node, current),
            ..Default::default()
        };
        let held = self.held_by(node);
        for i in 0..self.pools.len() {
            let family = self.pools[i].family;
            if current.iter().any(|c| Family::of(c) == family) {
                continue;
            }
            // Given before (a write refused or not yet seen back): the same one again, so
            // that a node never holds two of a family.
            if let Some(given) = held.iter().find(|c| Family::of(c) == family) {
                out.pod_cidrs.push(*given);
                out.changed = true;
                continue;
            }
            match self.first_free(i) {
                Some(cidr) => {
                    self.owners.insert(cidr, node.to_string());
                    out.pod_cidrs.push(cidr);
                    out.changed = true;
                }
                None => out.refusals.push(Refusal::Exhausted {
                    family,
                    pools: self.pools[i].cidrs.clone(),
                }),
            }
        }
        out
    }

    /// Occupies for `node` the CIDRs it has, without handing out anything: what the
    /// initial list does for every node before any is given a CIDR. The CIDRs another node
    /// holds are refused as conflicts.
    pub(crate) fn occupy(&mut self, node: &str, current: &[IpNet]) -> Vec<Refusal> {
        let mut refusals = Vec::new();
        for cidr in current {
            if self.pool_of(cidr).is_none() {
                continue;
            }
            match self.holder(cidr, node) {
                Some(owner) => refusals.push(Refusal::Conflict {
                    cidr: *cidr,
                    owner: owner.clone(),
                }),
                None => {
                    self.owners.insert(cidr.trunc(), node.to_string());
                }
            }
        }
        refusals
    }

    /// Gives back everything `node` holds (the node is gone).
    pub(crate) fn release(&mut self, node: &str) -> Vec<IpNet> {
        let held = self.held_by(node);
        for c in &held {
            self.owners.remove(c);
        }
        held
    }

    /// How many CIDRs are held, for health.
    pub(crate) fn held(&self) -> usize {
        self.owners.len()
    }

    fn first_free(&self, pool: usize) -> Option<IpNet> {
        let p = &self.pools[pool];
        p.cidrs.iter().find_map(|net| {
            // Most candidates are held exactly, as handed out: that check is one lookup.
            net.subnets(p.mask)
                .ok()?
                .filter(|c| !self.owners.contains_key(c))
                .find(|c| self.holder(c, "").is_none())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn pool(v4: &[&str], v6: &[&str]) -> ClusterPool {
        ClusterPool::new(&ClusterPoolConfig {
            cluster_pool_ipv4_cidr: v4.iter().map(|s| net(s)).collect(),
            cluster_pool_ipv6_cidr: v6.iter().map(|s| net(s)).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn each_family_gets_one_cidr_and_the_same_node_gets_the_same_again() {
        let mut p = pool(&["10.0.0.0/22"], &["fd00::/104"]);
        let a = p.assign("a", &[]);
        assert_eq!(a.pod_cidrs, vec![net("10.0.0.0/24"), net("fd00::/112")]);
        assert!(a.changed && a.refusals.is_empty());
        // The write not seen back yet: the same ones again.
        assert_eq!(p.assign("a", &[]).pod_cidrs, a.pod_cidrs);
        let again = p.assign("a", &a.pod_cidrs);
        assert!(!again.changed && again.refusals.is_empty());
        let b = p.assign("b", &[]);
        assert_eq!(b.pod_cidrs, vec![net("10.0.1.0/24"), net("fd00::1:0/112")]);
    }

    #[test]
    fn what_nodes_hold_is_occupied_and_a_second_claim_is_a_conflict() {
        let mut p = pool(&["10.0.0.0/23"], &[]);
        assert!(p.assign("a", &[net("10.0.0.0/24")]).refusals.is_empty());
        let b = p.assign("b", &[net("10.0.0.0/24")]);
        assert_eq!(
            b.refusals,
            vec![Refusal::Conflict {
                cidr: net("10.0.0.0/24"),
                owner: "a".into()
            }]
        );
        assert!(!b.changed, "a conflicting node keeps its spec: {b:?}");
        assert_eq!(
            b.refusals[0].to_string(),
            "pod CIDR 10.0.0.0/24 is already allocated to node a"
        );
        // Outside the pools: kept, not held.
        let c = p.assign("c", &[net("192.168.0.0/24")]);
        assert!(c.refusals.is_empty() && !c.changed);
        assert_eq!(p.assign("d", &[]).pod_cidrs, vec![net("10.0.1.0/24")]);
    }

    #[test]
    fn an_exhausted_pool_is_refused_and_a_release_frees_the_cidr() {
        let mut p = pool(&["10.0.0.0/24", "10.1.0.0/24"], &[]);
        p.assign("a", &[]);
        assert_eq!(p.assign("b", &[]).pod_cidrs, vec![net("10.1.0.0/24")]);
        let c = p.assign("c", &[]);
        assert!(c.pod_cidrs.is_empty() && !c.changed);
        assert_eq!(
            c.refusals[0].to_string(),
            "IPv4 pool exhausted: no free pod CIDR left in 10.0.0.0/24, 10.1.0.0/24 (cluster-pool-ipv4-cidr)"
        );
        assert_eq!(p.release("a"), vec![net("10.0.0.0/24")]);
        assert_eq!(p.assign("c", &[]).pod_cidrs, vec![net("10.0.0.0/24")]);
        assert_eq!(p.held(), 2);
    }

    #[test]
    fn overlapping_claims_of_other_sizes_conflict_and_are_skipped() {
        let mut p = pool(&["10.0.0.0/16"], &[]);
        assert!(p.assign("a", &[net("10.0.0.0/24")]).refusals.is_empty());
        for (node, claim) in [("b", "10.0.0.0/23"), ("c", "10.0.0.128/25")] {
            let r = p.assign(node, &[net(claim)]);
            assert_eq!(
                r.refusals,
                vec![Refusal::Conflict {
                    cidr: net(claim),
                    owner: "a".into()
                }],
                "{node}"
            );
        }
        // A hand-written /22 held by d: none of its /24s is handed out.
        assert!(p.assign("d", &[net("10.0.4.0/22")]).refusals.is_empty());
        let given: Vec<IpNet> = ["e", "f", "g", "h"]
            .iter()
            .flat_map(|n| p.assign(n, &[]).pod_cidrs)
            .collect();
        assert_eq!(
            given,
            ["10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24", "10.0.8.0/24"]
                .map(net)
                .to_vec()
        );
    }

    #[test]
    fn a_thousand_nodes_get_distinct_cidrs_quickly() {
        let mut p = pool(&["10.0.0.0/8"], &["fd00::/96"]);
        let start = std::time::Instant::now();
        let mut all = std::collections::BTreeSet::new();
        for i in 0..1000 {
            for cidr in p.assign(&format!("n{i}"), &[]).pod_cidrs {
                assert!(all.insert(cidr), "{cidr} twice");
            }
        }
        assert_eq!(all.len(), 2000);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn bad_pools_name_their_key() {
        let cases = [
            (
                ClusterPoolConfig {
                    cluster_pool_ipv4_cidr: vec![net("10.0.0.0/16")],
                    cluster_pool_ipv4_mask_size: 8,
                    ..Default::default()
                },
                "cluster-pool-ipv4-mask-size:",
            ),
            (
                ClusterPoolConfig {
                    cluster_pool_ipv4_cidr: vec![net("fd00::/64")],
                    ..Default::default()
                },
                "cluster-pool-ipv4-cidr:",
            ),
            (
                ClusterPoolConfig {
                    cluster_pool_ipv6_cidr: vec![net("fd00::/64"), net("fd00::/96")],
                    ..Default::default()
                },
                "cluster-pool-ipv6-cidr:",
            ),
        ];
        for (cfg, key) in cases {
            let err = ClusterPool::new(&cfg).unwrap_err().to_string();
            assert!(err.starts_with(key), "{err}");
        }
        assert!(
            ClusterPool::new(&ClusterPoolConfig::default())
                .unwrap()
                .is_empty()
        );
    }
}

//! The operator's configuration sections, one per cell, with Cilium's key names and defaults.

use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The `leader-election` section: which Lease, who this operator is, and the timing.
///
/// The timing is client-go's (and Cilium's operator's): a leader renews every
/// `leader-election-retry-period`; it stops acting as leader when it could not renew for
/// `leader-election-renew-deadline`; another operator takes the Lease over once it has seen
/// the same record unchanged for `leader-election-lease-duration`. The deadline must be
/// shorter than the duration, so that an old leader has stopped writing before a new one can
/// start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct LeaderElectionConfig {
    /// The Lease's name (default `cellium-operator`).
    pub leader_election_lease_name: String,
    /// The Lease's namespace (default `kube-system`).
    pub leader_election_namespace: String,
    /// This operator's name in the Lease's `holderIdentity` (default: the host name and the
    /// process id, which differ between two replicas).
    pub operator_id: Option<String>,
    /// How long a Lease not renewed stays with its holder (default 15 s).
    #[serde(with = "humantime_serde")]
    pub leader_election_lease_duration: Duration,
    /// How long a leader keeps acting without a successful renewal (default 10 s).
    #[serde(with = "humantime_serde")]
    pub leader_election_renew_deadline: Duration,
    /// How often the Lease is renewed, or tried when another holds it (default 2 s).
    #[serde(with = "humantime_serde")]
    pub leader_election_retry_period: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            leader_election_lease_name: "cellium-operator".into(),
            leader_election_namespace: "kube-system".into(),
            operator_id: None,
            leader_election_lease_duration: Duration::from_secs(15),
            leader_election_renew_deadline: Duration::from_secs(10),
            leader_election_retry_period: Duration::from_secs(2),
        }
    }
}

/// The `cluster-pool` section: the pools every CiliumNode's pod CIDRs are cut from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct ClusterPoolConfig {
    /// IPv4 pools, each cut into CIDRs of `cluster-pool-ipv4-mask-size` (default: none; no
    /// IPv4 pod CIDR is handed out).
    pub cluster_pool_ipv4_cidr: Vec<IpNet>,
    /// The prefix length of each node's IPv4 pod CIDR (default 24).
    pub cluster_pool_ipv4_mask_size: u8,
    /// IPv6 pools (default: none).
    pub cluster_pool_ipv6_cidr: Vec<IpNet>,
    /// The prefix length of each node's IPv6 pod CIDR (default 112, as Cilium's).
    pub cluster_pool_ipv6_mask_size: u8,
}

impl Default for ClusterPoolConfig {
    fn default() -> Self {
        ClusterPoolConfig {
            cluster_pool_ipv4_cidr: Vec::new(),
            cluster_pool_ipv4_mask_size: 24,
            cluster_pool_ipv6_cidr: Vec::new(),
            cluster_pool_ipv6_mask_size: 112,
        }
    }
}

/// The `gc` section: how often each kind of leftover is looked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct GcConfig {
    /// How often unused CiliumIdentities are looked for (default 15 min). An identity is
    /// deleted when two rounds in a row found it unused, so it lives at least this long
    /// after its last user went.
    #[serde(with = "humantime_serde")]
    pub identity_gc_interval: Duration,
    /// How often CiliumEndpoints whose Pod is gone are deleted (default 5 min).
    #[serde(with = "humantime_serde")]
    pub endpoint_gc_interval: Duration,
    /// How often CiliumNodes whose Node is gone are looked for (default 5 min); one is
    /// deleted when two rounds in a row found its Node missing.
    #[serde(with = "humantime_serde")]
    pub nodes_gc_interval: Duration,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            identity_gc_interval: Duration::from_secs(15 * 60),
            endpoint_gc_interval: Duration::from_secs(5 * 60),
            nodes_gc_interval: Duration::from_secs(5 * 60),
        }
    }
}

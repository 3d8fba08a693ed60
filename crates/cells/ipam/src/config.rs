//! The `ipam` configuration section.

use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Where the node's pod CIDRs come from (key `ipam`, with Cilium's values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IpamMode {
    /// From `pod-cidr` (standalone).
    #[default]
    Config,
    /// From this node's Node object, `spec.podCIDRs` (Cilium's "Kubernetes host scope"):
    /// Kubernetes mode only.
    Kubernetes,
    /// From this node's CiliumNode, `spec.ipam.podCIDRs`, which `cellium-operator` assigns from
    /// its cluster pools: Kubernetes mode only.
    ClusterPool,
}

/// Which addresses pods get, and how soon a released one is reused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct IpamConfig {
    /// Where the pod CIDRs come from: `config` (`pod-cidr`, the default), `kubernetes` (the
    /// Node's `spec.podCIDRs`) or `cluster-pool` (the CiliumNode's `spec.ipam.podCIDRs`, from
    /// the operator); `pod-cidr` is not used by the last two.
    pub ipam: IpamMode,
    /// The node's pod CIDRs, IPv4 and/or IPv6. A pod gets one address of each family
    /// configured, from the first pool of that family with room.
    pub pod_cidr: Vec<IpNet>,
    /// How long a released address is kept from being handed out again, by request or not
    /// (`ipam-release-quarantine`; `0s` disables it). The default covers the datapath's
    /// conntrack lifetime of connections other than established TCP (60 s) and the time
    /// peers and Services take to notice that a pod is gone.
    #[serde(with = "humantime_serde")]
    pub ipam_release_quarantine: Duration,
}

impl Default for IpamConfig {
    fn default() -> Self {
        IpamConfig {
            ipam: IpamMode::Config,
            pod_cidr: vec!["10.244.0.0/24".parse().expect("a valid literal CIDR")],
            ipam_release_quarantine: Duration::from_secs(60),
        }
    }
}

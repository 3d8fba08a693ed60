//! The `endpoint-manager` configuration section.

use serde::{Deserialize, Serialize};

/// Cilium's default for `bpf-policy-map-max`.
pub const DEFAULT_POLICY_MAP_MAX: usize = 16384;

/// Cilium's default for `cluster-name`.
pub const DEFAULT_CLUSTER_NAME: &str = "default";

/// How pods' interfaces are set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct EndpointConfig {
    /// The MTU of the node's network. Pods' interfaces get it, minus the encapsulation's
    /// headers in tunnel mode (50 bytes for VXLAN), unless the CNI configuration sets one.
    pub mtu: u32,
    /// At start, remove restored endpoints whose addresses the configured pod CIDRs no longer
    /// cover (their pods lose their interfaces). Off, such endpoints stop the agent from
    /// starting, with a message naming them.
    pub remove_endpoints_outside_pod_cidr: bool,
    /// The most policy map entries one endpoint may hold (Cilium's name and default). An
    /// endpoint whose policy compiles to more is locked down: it enforces both directions
    /// with no entry (everything denied) until its policy fits again, and no other endpoint's
    /// entries are touched.
    pub bpf_policy_map_max: usize,
    /// The cluster's name (Cilium's `cluster-name`): every pod's identity carries it as
    /// `k8s:io.cilium.k8s.policy.cluster`, so policies may select on it.
    pub cluster_name: String,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            mtu: 1500,
            remove_endpoints_outside_pod_cidr: false,
            bpf_policy_map_max: DEFAULT_POLICY_MAP_MAX,
            cluster_name: DEFAULT_CLUSTER_NAME.to_string(),
        }
    }
}

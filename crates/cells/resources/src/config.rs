//! The `resources` configuration section.

use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// The default of `apply-max-bytes`: the Kubernetes API server's limit on a request body.
pub const DEFAULT_APPLY_MAX_BYTES: usize = 3 * 1024 * 1024;

/// The default of `apply-max-depth`.
pub const DEFAULT_APPLY_MAX_DEPTH: usize = 64;

/// The deepest `apply-max-depth` may be: the YAML decoder refuses deeper documents anyway.
pub const MAX_APPLY_MAX_DEPTH: usize = 128;

/// What the resources cell needs to know to behave as the API server, and the bounds it puts
/// on the work one applied text may cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ResourcesConfig {
    /// The range ClusterIP services get their address from, as the API server's
    /// `--service-cluster-ip-range`. IPv4 only (the datapath balances IPv4); between a /12 and
    /// a /30, as the API server accepts.
    pub service_cidr: Ipv4Net,
    /// The largest text `apply` and `delete` take, in bytes (one file of `cellium apply -f`,
    /// one file of the policy directory); larger ones are refused unread.
    pub apply_max_bytes: usize,
    /// How deeply mappings and sequences may nest in one YAML document (1 to 128); deeper
    /// documents are refused before they are decoded.
    pub apply_max_depth: usize,
    /// A directory of Kubernetes YAML files applied as they change; empty (the default) for
    /// none. A file removed, or an object removed from a file, is deleted; a file that does
    /// not apply leaves the previous state of its objects in place.
    pub policy_dir: PathBuf,
}

impl Default for ResourcesConfig {
    fn default() -> Self {
        ResourcesConfig {
            service_cidr: Ipv4Net::new(std::net::Ipv4Addr::new(10, 96, 0, 0), 12)
                .unwrap_or_default(),
            apply_max_bytes: DEFAULT_APPLY_MAX_BYTES,
            apply_max_depth: DEFAULT_APPLY_MAX_DEPTH,
            policy_dir: PathBuf::new(),
        }
    }
}

impl ResourcesConfig {
    /// The policy directory, if one is set.
    pub fn policy_dir(&self) -> Option<&Path> {
        (!self.policy_dir.as_os_str().is_empty()).then_some(self.policy_dir.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_range_is_the_api_servers() {
        assert_eq!(
            ResourcesConfig::default().service_cidr.to_string(),
            "10.96.0.0/12"
        );
    }
}

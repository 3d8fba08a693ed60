//! The `resources` configuration section.

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize};

use crate::apply::node_ports::NodePortRange;

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
    /// The ranges ClusterIP services get their addresses from, as the API server's
    /// `--service-cluster-ip-range`: one CIDR, or one per family (a list, or one string with
    /// the two separated by a comma), the first being the family of services that ask for
    /// none. Each holds 4 to 2^20 addresses (IPv4 /12 to /30, IPv6 /108 to /126), as the API
    /// server accepts.
    #[serde(deserialize_with = "one_or_many")]
    pub service_cidr: Vec<IpNet>,
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
    /// The range node ports of NodePort and LoadBalancer services come from in standalone
    /// mode (`FIRST-LAST`, or Cilium's `FIRST,LAST`), as the API server's
    /// `--service-node-port-range`; in Kubernetes mode the API server allocates them.
    #[serde(default)]
    pub node_port_range: NodePortRange,
}

impl Default for ResourcesConfig {
    fn default() -> Self {
        ResourcesConfig {
            service_cidr: vec![IpNet::V4(
                ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, 96, 0, 0), 12).unwrap_or_default(),
            )],
            apply_max_bytes: DEFAULT_APPLY_MAX_BYTES,
            apply_max_depth: DEFAULT_APPLY_MAX_DEPTH,
            policy_dir: PathBuf::new(),
            node_port_range: NodePortRange::default(),
        }
    }
}

/// A list of CIDRs from a list, or from one string of comma-separated CIDRs (the form a
/// single value always had).
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        One(String),
        Many(Vec<String>),
    }
    let texts = match Form::deserialize(d)? {
        Form::One(text) => text.split(',').map(|s| s.trim().to_string()).collect(),
        Form::Many(list) => list,
    };
    texts
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<IpNet>()
                .map_err(|_| serde::de::Error::custom(format!("{t:?} is not a CIDR")))
        })
        .collect()
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
            ResourcesConfig::default().service_cidr,
            vec!["10.96.0.0/12".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn service_cidr_takes_one_range_or_one_per_family_in_either_form() {
        let read = |json: &str| -> Result<Vec<IpNet>, String> {
            let doc = format!("{{\"service-cidr\": {json}}}");
            let defaults = serde_json::to_value(ResourcesConfig::default()).unwrap();
            let mut merged = defaults.as_object().unwrap().clone();
            let given: serde_json::Value = serde_json::from_str(&doc).unwrap();
            merged.extend(given.as_object().unwrap().clone());
            serde_json::from_value::<ResourcesConfig>(serde_json::Value::Object(merged))
                .map(|c| c.service_cidr)
                .map_err(|e| e.to_string())
        };
        let both: Vec<IpNet> = vec![
            "10.96.0.0/12".parse().unwrap(),
            "fd00:96::/108".parse().unwrap(),
        ];
        assert_eq!(read("\"10.96.0.0/12\"").unwrap(), both[..1]);
        assert_eq!(read("\"10.96.0.0/12, fd00:96::/108\"").unwrap(), both);
        assert_eq!(read("[\"10.96.0.0/12\", \"fd00:96::/108\"]").unwrap(), both);
        let err = read("\"10.96.0.0\"").unwrap_err();
        assert!(err.contains("\"10.96.0.0\" is not a CIDR"), "{err}");
    }
}

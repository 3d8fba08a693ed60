//! Nodes: what IPAM (`ipam: kubernetes`) and routing read.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::key::{Object, ObjectKey};
use crate::validate::{self, FieldError};

/// A node: its pod CIDRs and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// `spec.podCIDRs` (or the older `spec.podCIDR`): one per family, assigned by the
    /// controller manager; Cilium's "Kubernetes host scope" IPAM hands pods addresses from them.
    pub pod_cidrs: Vec<IpNet>,
    /// `status.addresses` of type `InternalIP`, then `ExternalIP`.
    pub addresses: Vec<IpAddr>,
}

impl Node {
    /// From the Kubernetes object. An address or CIDR that does not parse is an error naming
    /// its field: a node whose pod CIDRs cannot be read must not be half-used.
    pub fn from_k8s(node: k8s_openapi::api::core::v1::Node) -> Result<Node, FieldError> {
        let name = node
            .metadata
            .name
            .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
        validate::dns1123_subdomain("metadata.name", &name)?;
        let labels = node.metadata.labels.unwrap_or_default();
        let spec = node.spec.unwrap_or_default();
        let cidrs = match spec.pod_cidrs {
            Some(list) if !list.is_empty() => list,
            _ => spec.pod_cidr.into_iter().collect(),
        };
        let pod_cidrs = cidrs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.parse::<IpNet>().map(|n| n.trunc()).map_err(|e| {
                    FieldError::new(format!("spec.podCIDRs[{i}]"), format!("{c:?}: {e}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut addresses = Vec::new();
        for kind in ["InternalIP", "ExternalIP"] {
            let status = node.status.as_ref();
            for (i, a) in status
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
                .enumerate()
            {
                if a.type_ != kind {
                    continue;
                }
                let ip = a.address.parse().map_err(|e| {
                    FieldError::new(
                        format!("status.addresses[{i}].address"),
                        format!("{:?}: {e}", a.address),
                    )
                })?;
                addresses.push(ip);
            }
        }
        Ok(Node {
            name,
            labels,
            pod_cidrs,
            addresses,
        })
    }
}

impl Object for Node {
    const KIND: &'static str = "Node";
    fn key(&self) -> ObjectKey {
        ObjectKey::cluster(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Result<Node, FieldError> {
        Node::from_k8s(serde_json::from_value(json).unwrap())
    }

    #[test]
    fn pod_cidrs_and_addresses_are_read() {
        let n = node(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24", "fd00:1::/64"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "ExternalIP", "address": "192.0.2.1"},
                {"type": "InternalIP", "address": "10.0.0.1"}
            ]}
        }))
        .unwrap();
        assert_eq!(n.pod_cidrs.len(), 2);
        assert_eq!(
            n.addresses,
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "192.0.2.1".parse().unwrap()
            ]
        );
        let old = node(
            serde_json::json!({"metadata": {"name": "n2"}, "spec": {"podCIDR": "10.2.0.0/24"}}),
        )
        .unwrap();
        assert_eq!(old.pod_cidrs, vec!["10.2.0.0/24".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn a_bad_cidr_names_its_field() {
        let err = node(
            serde_json::json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.0.0.0/33"]}}),
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.podCIDRs[0]");
    }
}

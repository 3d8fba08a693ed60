//! The `cilium.io/v2` kinds that describe the cluster rather than its policy: CiliumNode,
//! CiliumIdentity and CiliumEndpoint, as the cluster's cells read them. From the API server
//! only, never applied. Each is read leniently (their producers, agents and the operator,
//! fill what they know) but what is read is checked: an address or CIDR that does not parse
//! is an error naming its field.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::NamedPort;
use crate::key::{Object, ObjectKey};
use crate::pod::port_name;
use crate::validate::FieldError;

/// A node as its agent (and the operator's IPAM) describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumNode {
    /// The node's name.
    pub name: String,
    /// `spec.addresses[].ip`.
    pub addresses: Vec<IpAddr>,
    /// `spec.ipam.podCIDRs`: the pod CIDRs the operator gave it (`ipam: cluster-pool`).
    pub pod_cidrs: Vec<IpNet>,
    /// `status.ipam.operator-status.error`: why the operator gave it none (its pools are
    /// exhausted, say).
    pub operator_error: Option<String>,
}

/// A cluster-wide security identity: its number and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumIdentity {
    /// The number (the object's name).
    pub id: u32,
    /// `security-labels`: `source:key` to value.
    pub labels: BTreeMap<String, String>,
}

/// An endpoint as its node's agent publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumEndpoint {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// `status.id`: the endpoint id on its node.
    pub id: u64,
    /// `status.identity.id`.
    pub identity: u32,
    /// `status.networking.addressing[].ipv4/ipv6`.
    pub addresses: Vec<IpAddr>,
    /// `status.networking.node`: the address of the node that hosts it.
    pub node_ip: Option<IpAddr>,
    /// `status.named-ports`: the pod's named container ports, which egress rules naming a
    /// port mean when this endpoint is the peer.
    pub named_ports: Vec<NamedPort>,
}

impl Object for CiliumNode {
    const KIND: &'static str = "CiliumNode";
    fn key(&self) -> ObjectKey {
        ObjectKey::cluster(&self.name)
    }
}

impl Object for CiliumIdentity {
    const KIND: &'static str = "CiliumIdentity";
    fn key(&self) -> ObjectKey {
        ObjectKey::cluster(self.id.to_string())
    }
}

impl Object for CiliumEndpoint {
    const KIND: &'static str = "CiliumEndpoint";
    fn key(&self) -> ObjectKey {
        ObjectKey::namespaced(&self.namespace, &self.name)
    }
}

fn name_of(value: &Value) -> Result<String, FieldError> {
    value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))
}

fn parse<T: std::str::FromStr>(field: &str, text: &str) -> Result<T, FieldError>
where
    T::Err: std::fmt::Display,
{
    text.parse()
        .map_err(|e| FieldError::new(field, format!("{text:?}: {e}")))
}

/// The strings at `pointer` (an array of strings, or absent).
fn strings<'a>(value: &'a Value, pointer: &str) -> impl Iterator<Item = (usize, &'a str)> {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, v)| v.as_str().map(|s| (i, s)))
}

impl CiliumNode {
    /// From the API server's object.
    pub fn from_api(value: &Value) -> Result<CiliumNode, FieldError> {
        let name = name_of(value)?;
        let mut addresses = Vec::new();
        for (i, a) in value
            .pointer("/spec/addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(ip) = a.get("ip").and_then(Value::as_str) {
                addresses.push(parse(&format!("spec.addresses[{i}].ip"), ip)?);
            }
        }
        let pod_cidrs = strings(value, "/spec/ipam/podCIDRs")
            .map(|(i, c)| parse::<IpNet>(&format!("spec.ipam.podCIDRs[{i}]"), c).map(|n| n.trunc()))
            .collect::<Result<_, _>>()?;
        let operator_error = value
            .pointer("/status/ipam/operator-status/error")
            .and_then(Value::as_str)
            .filter(|e| !e.is_empty())
            .map(String::from);
        Ok(CiliumNode {
            name,
            addresses,
            pod_cidrs,
            operator_error,
        })
    }
}

impl CiliumIdentity {
    /// From the API server's object.
    pub fn from_api(value: &Value) -> Result<CiliumIdentity, FieldError> {
        let name = name_of(value)?;
        let id = parse("metadata.name", &name)?;
        let labels = value
            .get("security-labels")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                v.as_str()
                    .map(|v| (k.clone(), v.to_string()))
                    .ok_or_else(|| {
                        FieldError::new(format!("security-labels.{k}"), "must be a string")
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(CiliumIdentity { id, labels })
    }
}

impl CiliumEndpoint {
    /// From the API server's object.
    pub fn from_api(value: &Value) -> Result<CiliumEndpoint, FieldError> {
        let name = name_of(value)?;
        let namespace = value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let status = value.get("status").cloned().unwrap_or(Value::Null);
        let number = |pointer: &str| status.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
        let identity = u32::try_from(number("/identity/id"))
            .map_err(|_| FieldError::new("status.identity.id", "not an identity number"))?;
        let mut addresses = Vec::new();
        for (i, pair) in status
            .pointer("/networking/addressing")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for family in ["ipv4", "ipv6"] {
                if let Some(ip) = pair
                    .get(family)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    addresses.push(parse(
                        &format!("status.networking.addressing[{i}].{family}"),
                        ip,
                    )?);
                }
            }
        }
        let node_ip = match status.pointer("/networking/node").and_then(Value::as_str) {
            Some(ip) if !ip.is_empty() => Some(parse("status.networking.node", ip)?),
            _ => None,
        };
        Ok(CiliumEndpoint {
            namespace,
            name,
            id: number("/id"),
            identity,
            addresses,
            node_ip,
            named_ports: named_ports(&status)?,
        })
    }
}

/// `status.named-ports[]`: `{name, port, protocol}` (protocol TCP when absent).
fn named_ports(status: &Value) -> Result<Vec<NamedPort>, FieldError> {
    let entries = status.get("named-ports").and_then(Value::as_array);
    let mut out = Vec::new();
    for (i, p) in entries.into_iter().flatten().enumerate() {
        let field = format!("status.named-ports[{i}]");
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        port_name(&format!("{field}.name"), name)?;
        let port = p
            .get("port")
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                FieldError::new(format!("{field}.port"), "not a port number (1-65535)")
            })?;
        let protocol = match p.get("protocol").and_then(Value::as_str) {
            None => crate::Protocol::Tcp,
            Some(text) => parse(&format!("{field}.protocol"), text)?,
        };
        out.push(NamedPort {
            name: name.to_string(),
            port,
            protocol,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cilium_kinds_read_what_the_cluster_cells_need() {
        let node = CiliumNode::from_api(&json!({"metadata": {"name": "n1"},
            "spec": {"addresses": [{"type": "InternalIP", "ip": "10.0.0.1"}],
                     "ipam": {"podCIDRs": ["10.1.0.0/24"]}}}))
        .unwrap();
        assert_eq!(
            node.pod_cidrs,
            vec!["10.1.0.0/24".parse::<IpNet>().unwrap()]
        );
        let id = CiliumIdentity::from_api(&json!({"metadata": {"name": "3001"},
            "security-labels": {"k8s:app": "web"}}))
        .unwrap();
        assert_eq!((id.id, id.labels["k8s:app"].as_str()), (3001, "web"));
        let ep = CiliumEndpoint::from_api(&json!({"metadata": {"name": "web", "namespace": "shop"},
            "status": {"id": 7, "identity": {"id": 3001},
                       "networking": {"addressing": [{"ipv4": "10.1.0.5", "ipv6": "fd00::5"}], "node": "10.0.0.1"}}}))
        .unwrap();
        assert_eq!((ep.id, ep.identity, ep.addresses.len()), (7, 3001, 2));
        let bad = CiliumEndpoint::from_api(&json!({"metadata": {"name": "web"},
            "status": {"networking": {"addressing": [{"ipv4": "10.1.0.500"}]}}}))
        .unwrap_err();
        assert_eq!(bad.field, "status.networking.addressing[0].ipv4");
        assert!(CiliumIdentity::from_api(&json!({"metadata": {"name": "web"}})).is_err());
    }

    #[test]
    fn named_ports_are_read_and_checked() {
        let ep = |ports: Value| {
            CiliumEndpoint::from_api(&json!({"metadata": {"name": "web"},
                "status": {"identity": {"id": 3001}, "named-ports": ports}}))
        };
        let ok = ep(json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                           {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "m", "port": 9}]))
        .unwrap();
        assert_eq!(
            ok.named_ports,
            vec![
                NamedPort {
                    name: "http".into(),
                    port: 8080,
                    protocol: crate::Protocol::Tcp
                },
                NamedPort {
                    name: "dns".into(),
                    port: 53,
                    protocol: crate::Protocol::Udp
                },
                NamedPort {
                    name: "m".into(),
                    port: 9,
                    protocol: crate::Protocol::Tcp
                },
            ]
        );
        for (bad, field) in [
            (
                json!([{"name": "http", "port": 0}]),
                "status.named-ports[0].port",
            ),
            (json!([{"port": 80}]), "status.named-ports[0].name"),
            (
                json!([{"name": "ok", "port": 80}, {"name": "x", "port": 80, "protocol": "ICMP"}]),
                "status.named-ports[1].protocol",
            ),
        ] {
            assert_eq!(ep(bad).unwrap_err().field, field);
        }
    }
}

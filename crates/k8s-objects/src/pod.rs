//! Pods: the labels, named ports and ServiceAccount policies need.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::Protocol;
use crate::key::{Object, ObjectKey};
use crate::validate::{self, FieldError};

/// A container port with a name, which policies may refer to instead of a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    /// The port's name (an IANA service name).
    pub name: String,
    /// The port number.
    pub port: u16,
    /// The protocol.
    pub protocol: Protocol,
}

/// A container port published on the node (`hostPort`, or an entry of the CNI `portMappings`
/// capability a runtime passes): the agent serves it as Cilium's HostPort service, so that no
/// `portmap` plugin is needed. Serialized as endpoint records keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPort {
    /// `hostIP`: the node address it is published on; `None` (absent, `0.0.0.0` or `::`)
    /// for every node address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<IpAddr>,
    /// `hostPort`.
    pub host_port: u16,
    /// `containerPort`: where the pod listens.
    pub container_port: u16,
    /// The protocol.
    pub protocol: Protocol,
}

/// A pod: its name, labels, named container ports, host ports and ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its named container ports.
    pub ports: Vec<NamedPort>,
    /// Its container ports published on the node (`hostPort`).
    pub host_ports: Vec<HostPort>,
    /// Its ServiceAccount (`spec.serviceAccountName`, `default` when unset, as the API server
    /// defaults it): policies select on it as `io.cilium.k8s.policy.serviceaccount`.
    pub service_account: String,
}

impl Pod {
    /// From the Kubernetes object, checked and defaulted as the API server would (the namespace
    /// defaults to `default`, a port's protocol to TCP).
    pub fn from_k8s(pod: k8s_openapi::api::core::v1::Pod) -> Result<Pod, FieldError> {
        let meta = pod.metadata;
        let name = meta.name.ok_or_else(|| {
            FieldError::new(
                "metadata.name",
                "a name is required (generateName is not supported)",
            )
        })?;
        validate::dns1123_subdomain("metadata.name", &name)?;
        let namespace = meta.namespace.unwrap_or_else(|| "default".to_string());
        validate::dns1123_label("metadata.namespace", &namespace)?;
        let labels = meta.labels.unwrap_or_default();
        validate::labels("metadata.labels", &labels)?;
        let spec = pod
            .spec
            .ok_or_else(|| FieldError::new("spec", "a pod needs a spec"))?;
        if spec.containers.is_empty() {
            return Err(FieldError::new(
                "spec.containers",
                "at least one container is required",
            ));
        }
        let service_account = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".to_string());
        validate::dns1123_subdomain("spec.serviceAccountName", &service_account)?;
        let mut ports = Vec::new();
        let mut host_ports = Vec::new();
        for (c, container) in spec.containers.iter().enumerate() {
            for (p, port) in container.ports.iter().flatten().enumerate() {
                let field = format!("spec.containers[{c}].ports[{p}]");
                let number = u16::try_from(port.container_port)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        FieldError::new(
                            format!("{field}.containerPort"),
                            format!("{} is not a port number (1-65535)", port.container_port),
                        )
                    })?;
                let protocol = match port.protocol.as_deref() {
                    None => Protocol::Tcp,
                    Some(p) => p
                        .parse()
                        .map_err(|e| FieldError::new(format!("{field}.protocol"), e))?,
                };
                if let Some(name) = &port.name {
                    port_name(&format!("{field}.name"), name)?;
                    ports.push(NamedPort {
                        name: name.clone(),
                        port: number,
                        protocol,
                    });
                }
                if let Some(host) = host_port(&field, port, number, protocol)? {
                    host_ports.push(host);
                }
            }
        }
        Ok(Pod {
            namespace,
            name,
            labels,
            ports,
            host_ports,
            service_account,
        })
    }
}

/// The container port's `hostPort` and `hostIP`, checked as the API server does; `None`
/// without a `hostPort` (a `hostIP` alone publishes nothing).
fn host_port(
    field: &str,
    port: &k8s_openapi::api::core::v1::ContainerPort,
    container_port: u16,
    protocol: Protocol,
) -> Result<Option<HostPort>, FieldError> {
    let Some(number) = port.host_port else {
        return Ok(None);
    };
    let host_port = u16::try_from(number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            FieldError::new(
                format!("{field}.hostPort"),
                format!("{number} is not a port number (1-65535)"),
            )
        })?;
    let host_ip = match port.host_ip.as_deref() {
        None | Some("") => None,
        Some(ip) => {
            let ip: IpAddr = ip.parse().map_err(|_| {
                FieldError::new(
                    format!("{field}.hostIP"),
                    format!("{ip:?} is not an IP address"),
                )
            })?;
            (!ip.is_unspecified()).then_some(ip)
        }
    };
    Ok(Some(HostPort {
        host_ip,
        host_port,
        container_port,
        protocol,
    }))
}

/// An IANA service name: at most 15 characters, lower-case alphanumerics and '-', at least one
/// letter, no '-' at either end or twice in a row.
pub fn port_name(field: &str, name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    ok.then_some(()).ok_or_else(|| {
        FieldError::new(
            field,
            format!("{name:?} is not a valid port name (at most 15 characters: a-z, 0-9 and '-', with at least one letter)"),
        )
    })
}

impl Object for Pod {
    const KIND: &'static str = "Pod";
    fn key(&self) -> ObjectKey {
        ObjectKey::namespaced(&self.namespace, &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Pod, FieldError> {
        Pod::from_k8s(serde_yaml::from_str(yaml).unwrap())
    }

    #[test]
    fn named_ports_and_defaults() {
        let pod = parse(
            r#"
apiVersion: v1
kind: Pod
metadata: { name: web, labels: { app: web } }
spec:
  containers:
  - name: c
    image: x
    ports:
    - { name: http, containerPort: 8080 }
    - { name: dns, containerPort: 53, protocol: UDP }
    - { containerPort: 9000 }
"#,
        )
        .unwrap();
        assert_eq!(pod.namespace, "default");
        assert_eq!(pod.labels["app"], "web");
        assert_eq!(pod.service_account, "default");
        assert_eq!(
            pod.ports,
            vec![
                NamedPort {
                    name: "http".into(),
                    port: 8080,
                    protocol: Protocol::Tcp
                },
                NamedPort {
                    name: "dns".into(),
                    port: 53,
                    protocol: Protocol::Udp
                },
            ]
        );
    }

    #[test]
    fn service_account_name() {
        let pod = parse(
            "apiVersion: v1\nkind: Pod\nmetadata: { name: web }\nspec: { serviceAccountName: builder, containers: [ { name: c } ] }",
        )
        .unwrap();
        assert_eq!(pod.service_account, "builder");
        let err = parse(
            "apiVersion: v1\nkind: Pod\nmetadata: { name: web }\nspec: { serviceAccountName: Bad_Name, containers: [ { name: c } ] }",
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.serviceAccountName", "{err:?}");
    }

    #[test]
    fn bad_fields_are_named() {
        let base = "apiVersion: v1\nkind: Pod\nmetadata: { name: web }\n";
        let err = parse(&format!(
            "{base}spec: {{ containers: [ {{ name: c, ports: [ {{ name: Http, containerPort: 80 }} ] }} ] }}"
        ))
        .unwrap_err();
        assert_eq!(err.field, "spec.containers[0].ports[0].name");
        let err = parse(&format!(
            "{base}spec: {{ containers: [ {{ name: c, ports: [ {{ containerPort: 70000 }} ] }} ] }}"
        ))
        .unwrap_err();
        assert_eq!(err.field, "spec.containers[0].ports[0].containerPort");
        let err = parse(&format!("{base}spec: {{ containers: [] }}")).unwrap_err();
        assert_eq!(err.field, "spec.containers");
    }
}

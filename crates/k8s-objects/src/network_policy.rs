//! `networking.k8s.io/v1 NetworkPolicy`, checked and defaulted as the API server does.

use k8s_openapi::api::networking::v1 as k8s;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::Protocol;
use crate::key::{Object, ObjectKey};
use crate::pod::port_name;
use crate::policy_port::{CidrBlock, PolicyPort, PortRef, number};
use crate::selector::{LabelSelector, SelectorFlavor};
use crate::validate::{self, FieldError};

/// A direction a NetworkPolicy restricts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyType {
    /// Traffic to the selected pods.
    Ingress,
    /// Traffic from the selected pods.
    Egress,
}

/// A peer of a NetworkPolicy rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NetworkPolicyPeer {
    /// Pods: `podSelector` alone (pods of the policy's namespace), `namespaceSelector` alone
    /// (every pod of the matching namespaces), or both (pods matching both).
    Pods {
        /// `podSelector`.
        pod_selector: Option<LabelSelector>,
        /// `namespaceSelector`.
        namespace_selector: Option<LabelSelector>,
    },
    /// `ipBlock`.
    IpBlock(CidrBlock),
}

/// One `ingress` or `egress` rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetworkPolicyRule {
    /// `from` / `to`; empty (absent or `[]`) = every peer, as the API documents.
    pub peers: Vec<NetworkPolicyPeer>,
    /// `ports`; empty (absent or `[]`) = every port and protocol.
    pub ports: Vec<PolicyPort>,
}

/// A NetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// The namespace (defaulted to `default`).
    pub namespace: String,
    /// The name.
    pub name: String,
    /// The pods (of `namespace`) the policy applies to; empty = all of them.
    pub pod_selector: LabelSelector,
    /// The directions it restricts, defaulted as the API server does: `Ingress`, plus
    /// `Egress` when egress rules are present.
    pub policy_types: Vec<PolicyType>,
    /// Ingress rules (ignored unless `policy_types` holds `Ingress`).
    pub ingress: Vec<NetworkPolicyRule>,
    /// Egress rules (ignored unless `policy_types` holds `Egress`).
    pub egress: Vec<NetworkPolicyRule>,
    /// In audit mode ([`crate::AUDIT_MODE_ANNOTATION`]).
    pub audit: bool,
}

impl Object for NetworkPolicy {
    const KIND: &'static str = "NetworkPolicy";
    fn key(&self) -> ObjectKey {
        ObjectKey::namespaced(&self.namespace, &self.name)
    }
}

impl NetworkPolicy {
    /// Whether the policy restricts `t`.
    pub fn restricts(&self, t: PolicyType) -> bool {
        self.policy_types.contains(&t)
    }

    /// From the Kubernetes object.
    pub fn from_k8s(np: k8s::NetworkPolicy) -> Result<NetworkPolicy, FieldError> {
        let meta = np.metadata;
        let name = meta
            .name
            .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
        validate::dns1123_subdomain("metadata.name", &name)?;
        let namespace = meta.namespace.unwrap_or_else(|| "default".to_string());
        validate::dns1123_label("metadata.namespace", &namespace)?;
        validate::labels("metadata.labels", &meta.labels.unwrap_or_default())?;
        let audit = crate::audit_mode(meta.annotations.as_ref())?;
        let spec = np.spec.unwrap_or_default();
        let pod_selector = match spec.pod_selector {
            Some(sel) => {
                LabelSelector::from_k8s("spec.podSelector", sel, SelectorFlavor::Kubernetes)?
            }
            None => LabelSelector::default(),
        };
        let ingress = spec
            .ingress
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, r)| rule(&format!("spec.ingress[{i}]"), "from", r.from, r.ports))
            .collect::<Result<Vec<_>, _>>()?;
        let egress = spec
            .egress
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, r)| rule(&format!("spec.egress[{i}]"), "to", r.to, r.ports))
            .collect::<Result<Vec<_>, _>>()?;
        let policy_types = match spec.policy_types {
            Some(types) if !types.is_empty() => policy_types(&types)?,
            // The API server's default: Ingress always, Egress when egress rules exist.
            _ if egress.is_empty() => vec![PolicyType::Ingress],
            _ => vec![PolicyType::Ingress, PolicyType::Egress],
        };
        Ok(NetworkPolicy {
            namespace,
            name,
            pod_selector,
            policy_types,
            ingress,
            egress,
            audit,
        })
    }
}

fn policy_types(types: &[String]) -> Result<Vec<PolicyType>, FieldError> {
    let mut out = Vec::new();
    for (i, t) in types.iter().enumerate() {
        let field = format!("spec.policyTypes[{i}]");
        let t = match t.as_str() {
            "Ingress" => PolicyType::Ingress,
            "Egress" => PolicyType::Egress,
            other => {
                return Err(FieldError::new(
                    field,
                    format!("unsupported value {other:?} (expected \"Ingress\" or \"Egress\")"),
                ));
            }
        };
        if out.contains(&t) {
            return Err(FieldError::new(field, format!("duplicate value {t:?}")));
        }
        out.push(t);
    }
    Ok(out)
}

fn rule(
    field: &str,
    peers_name: &str,
    peers: Option<Vec<k8s::NetworkPolicyPeer>>,
    ports: Option<Vec<k8s::NetworkPolicyPort>>,
) -> Result<NetworkPolicyRule, FieldError> {
    let peers = peers
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, p)| peer(&format!("{field}.{peers_name}[{i}]"), p))
        .collect::<Result<Vec<_>, _>>()?;
    let ports = ports
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, p)| port(&format!("{field}.ports[{i}]"), p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NetworkPolicyRule { peers, ports })
}

fn peer(field: &str, p: k8s::NetworkPolicyPeer) -> Result<NetworkPolicyPeer, FieldError> {
    match (p.pod_selector, p.namespace_selector, p.ip_block) {
        (None, None, None) => Err(FieldError::new(
            field,
            "must specify a peer (podSelector, namespaceSelector or ipBlock)",
        )),
        (None, None, Some(block)) => Ok(NetworkPolicyPeer::IpBlock(CidrBlock::new(
            &format!("{field}.ipBlock"),
            &block.cidr,
            &block.except.unwrap_or_default(),
            true,
        )?)),
        (_, _, Some(_)) => Err(FieldError::new(
            field,
            "ipBlock may not be combined with podSelector or namespaceSelector",
        )),
        (pods, namespaces, None) => Ok(NetworkPolicyPeer::Pods {
            pod_selector: pods
                .map(|s| {
                    LabelSelector::from_k8s(
                        &format!("{field}.podSelector"),
                        s,
                        SelectorFlavor::Kubernetes,
                    )
                })
                .transpose()?,
            namespace_selector: namespaces
                .map(|s| {
                    LabelSelector::from_k8s(
                        &format!("{field}.namespaceSelector"),
                        s,
                        SelectorFlavor::Kubernetes,
                    )
                })
                .transpose()?,
        }),
    }
}

fn port(field: &str, p: k8s::NetworkPolicyPort) -> Result<PolicyPort, FieldError> {
    let protocol = match p.protocol.as_deref() {
        None => Protocol::Tcp,
        Some(text) => text
            .parse()
            .map_err(|e| FieldError::new(format!("{field}.protocol"), e))?,
    };
    let port = match p.port {
        None => None,
        Some(IntOrString::Int(n)) => Some(PortRef::Number(number(
            &format!("{field}.port"),
            i64::from(n),
        )?)),
        Some(IntOrString::String(name)) => {
            port_name(&format!("{field}.port"), &name)?;
            Some(PortRef::Name(name))
        }
    };
    PolicyPort::new(field, Some(protocol), port, p.end_port.map(i64::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<NetworkPolicy, FieldError> {
        let yaml = format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: np}}\nspec: {spec}"
        );
        NetworkPolicy::from_k8s(serde_yaml::from_str(&yaml).unwrap())
    }

    #[test]
    fn defaults_as_the_api_server() {
        let np = parse("{podSelector: {}, ingress: [{ports: [{port: 80}]}]}").unwrap();
        assert_eq!(np.namespace, "default");
        assert_eq!(np.policy_types, vec![PolicyType::Ingress]);
        assert_eq!(np.ingress[0].ports[0].protocol, Some(Protocol::Tcp));
        let np = parse("{podSelector: {}, egress: [{}]}").unwrap();
        assert_eq!(
            np.policy_types,
            vec![PolicyType::Ingress, PolicyType::Egress]
        );
        let np = parse("{podSelector: {}, policyTypes: [Egress]}").unwrap();
        assert_eq!(np.policy_types, vec![PolicyType::Egress]);
        assert!(np.egress.is_empty());
    }

    #[test]
    fn peers_and_ports_are_checked() {
        let err = parse("{podSelector: {}, ingress: [{from: [{}]}]}").unwrap_err();
        assert_eq!(err.field, "spec.ingress[0].from[0]");
        let err = parse(
            "{podSelector: {}, ingress: [{from: [{podSelector: {}, ipBlock: {cidr: 10.0.0.0/8}}]}]}",
        )
        .unwrap_err();
        assert!(err.reason.contains("may not be combined"), "{}", err.reason);
        let err = parse(
            "{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16]}}]}]}",
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.egress[0].to[0].ipBlock.except[0]");
        let err = parse("{podSelector: {}, ingress: [{ports: [{port: 0}]}]}").unwrap_err();
        assert_eq!(err.field, "spec.ingress[0].ports[0].port");
        let err = parse("{podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}")
            .unwrap_err();
        assert_eq!(err.field, "spec.ingress[0].ports[0].endPort");
        let err = parse("{podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}").unwrap_err();
        assert_eq!(err.field, "spec.ingress[0].ports[0].protocol");
        let err = parse("{podSelector: {}, policyTypes: [Ingress, Ingress]}").unwrap_err();
        assert_eq!(err.field, "spec.policyTypes[1]");
        let err = parse("{podSelector: {}, policyTypes: [ingress]}").unwrap_err();
        assert!(err.reason.contains("unsupported value"), "{}", err.reason);
    }

    #[test]
    fn peers_keep_their_shape() {
        let np = parse(
            "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: web}}, namespaceSelector: {matchLabels: {team: a}}}, {ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}], ports: [{port: http, protocol: UDP}, {port: 8000, endPort: 8080}]}]}",
        )
        .unwrap();
        let rule = &np.ingress[0];
        assert!(matches!(
            &rule.peers[0],
            NetworkPolicyPeer::Pods {
                pod_selector: Some(_),
                namespace_selector: Some(_)
            }
        ));
        assert!(matches!(&rule.peers[1], NetworkPolicyPeer::IpBlock(b) if b.except.len() == 1));
        let ports: Vec<String> = rule.ports.iter().map(ToString::to_string).collect();
        assert_eq!(ports, vec!["http/UDP", "8000-8080/TCP"]);
    }
}

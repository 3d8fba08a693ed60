//! The wire shape of Cilium's policy kinds and the checks Cilium's CRD validation and rule
//! sanitizer make.
//!
//! Only the L3/L4 part of the language is enforced. The other fields Cilium defines (L7
//! `rules`, `toFQDNs`, `toServices`, `nodeSelector`, ...) are decoded so that using one is a
//! clear "not supported" naming the field, never a rule silently applied without it: a policy
//! that meant "allow only GET /health" must not become "allow everything on port 80".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml::Value;

use crate::Protocol;
use crate::cilium_policy::{CiliumPeerRule, CiliumPolicy, CiliumRule, Entity};
use crate::policy_port::{CidrBlock, PolicyPort, PortRef, number, parse_cidr, port_from_text};
use crate::selector::{LabelSelector, RawSelector, SelectorFlavor};
use crate::validate::{self, FieldError};

/// A `CiliumNetworkPolicy` or `CiliumClusterwideNetworkPolicy` document.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiliumPolicyDoc {
    // `apiVersion` and `kind` were checked by the caller; declared so they are known fields.
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: Option<WireRule>,
    /// `specs`.
    #[serde(default)]
    pub specs: Option<Vec<WireRule>>,
    // `status` is written by the server and ignored on apply, as the API server does.
    #[serde(default, rename = "status")]
    _status: Option<Value>,
}

/// One rule.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireRule {
    #[serde(default)]
    pub endpoint_selector: Option<RawSelector>,
    #[serde(default)]
    pub node_selector: Option<Value>,
    #[serde(default)]
    pub ingress: Option<Vec<WireIngress>>,
    #[serde(default)]
    pub ingress_deny: Option<Vec<WireIngress>>,
    #[serde(default)]
    pub egress: Option<Vec<WireEgress>>,
    #[serde(default)]
    pub egress_deny: Option<Vec<WireEgress>>,
    #[serde(default)]
    pub enable_default_deny: Option<WireDefaultDeny>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub labels: Option<Value>,
    #[serde(default)]
    pub log: Option<Value>,
}

/// `enableDefaultDeny`.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct WireDefaultDeny {
    #[serde(default)]
    pub ingress: Option<bool>,
    #[serde(default)]
    pub egress: Option<bool>,
}

/// An ingress or ingressDeny rule.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireIngress {
    #[serde(default)]
    pub from_endpoints: Option<Vec<RawSelector>>,
    #[serde(default, rename = "fromCIDR")]
    pub from_cidr: Option<Vec<String>>,
    #[serde(default, rename = "fromCIDRSet")]
    pub from_cidr_set: Option<Vec<WireCidrRule>>,
    #[serde(default)]
    pub from_entities: Option<Vec<String>>,
    #[serde(default)]
    pub to_ports: Option<Vec<WirePortRule>>,
    #[serde(default)]
    pub from_requires: Option<Value>,
    #[serde(default)]
    pub from_groups: Option<Value>,
    #[serde(default)]
    pub from_nodes: Option<Value>,
    #[serde(default)]
    pub icmps: Option<Value>,
    #[serde(default)]
    pub authentication: Option<Value>,
}

/// An egress or egressDeny rule.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireEgress {
    #[serde(default)]
    pub to_endpoints: Option<Vec<RawSelector>>,
    #[serde(default, rename = "toCIDR")]
    pub to_cidr: Option<Vec<String>>,
    #[serde(default, rename = "toCIDRSet")]
    pub to_cidr_set: Option<Vec<WireCidrRule>>,
    #[serde(default)]
    pub to_entities: Option<Vec<String>>,
    #[serde(default)]
    pub to_ports: Option<Vec<WirePortRule>>,
    #[serde(default)]
    pub to_requires: Option<Value>,
    #[serde(default)]
    pub to_groups: Option<Value>,
    #[serde(default)]
    pub to_nodes: Option<Value>,
    #[serde(default)]
    pub to_services: Option<Value>,
    #[serde(default, rename = "toFQDNs")]
    pub to_fqdns: Option<Value>,
    #[serde(default)]
    pub icmps: Option<Value>,
    #[serde(default)]
    pub authentication: Option<Value>,
}

/// A `fromCIDRSet` / `toCIDRSet` item.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireCidrRule {
    #[serde(default)]
    pub cidr: Option<String>,
    #[serde(default)]
    pub except: Option<Vec<String>>,
    #[serde(default)]
    pub cidr_group_ref: Option<Value>,
    #[serde(default)]
    pub cidr_group_selector: Option<Value>,
}

/// A `toPorts` item.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WirePortRule {
    #[serde(default)]
    pub ports: Option<Vec<WirePort>>,
    #[serde(default)]
    pub rules: Option<Value>,
    #[serde(default, rename = "originatingTLS")]
    pub originating_tls: Option<Value>,
    #[serde(default, rename = "terminatingTLS")]
    pub terminating_tls: Option<Value>,
    #[serde(default)]
    pub server_names: Option<Value>,
    #[serde(default)]
    pub listener: Option<Value>,
}

/// A `ports` item.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WirePort {
    #[serde(default)]
    pub port: Option<Value>,
    #[serde(default)]
    pub end_port: Option<i64>,
    #[serde(default)]
    pub protocol: Option<String>,
}

/// Fails when an unsupported field is present.
fn unsupported(field: String, present: bool, what: &str) -> Result<(), FieldError> {
    if present {
        Err(FieldError::new(
            field,
            format!(
                "not supported: {what}; only the L3/L4 part of Cilium's policy language is enforced"
            ),
        ))
    } else {
        Ok(())
    }
}

impl CiliumPolicyDoc {
    /// Checks and converts the document; `clusterwide` for the cluster-scoped kind, whose
    /// namespace must be unset.
    pub fn into_policy(self, clusterwide: bool) -> Result<CiliumPolicy, FieldError> {
        let meta = self.metadata;
        let name = meta
            .name
            .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
        validate::dns1123_subdomain("metadata.name", &name)?;
        validate::labels("metadata.labels", &meta.labels.unwrap_or_default())?;
        let namespace = if clusterwide {
            if meta.namespace.is_some() {
                return Err(FieldError::new(
                    "metadata.namespace",
                    "a CiliumClusterwideNetworkPolicy is cluster-scoped and takes no namespace",
                ));
            }
            String::new()
        } else {
            let ns = meta.namespace.unwrap_or_else(|| "default".to_string());
            validate::dns1123_label("metadata.namespace", &ns)?;
            ns
        };
        let mut rules = Vec::new();
        if let Some(spec) = self.spec {
            rules.push(rule("spec", spec)?);
        }
        for (i, spec) in self.specs.into_iter().flatten().enumerate() {
            rules.push(rule(&format!("specs[{i}]"), spec)?);
        }
        if rules.is_empty() {
            return Err(FieldError::new(
                "spec",
                "a policy needs a spec or a non-empty specs list",
            ));
        }
        Ok(CiliumPolicy {
            namespace,
            name,
            rules,
        })
    }
}

fn rule(field: &str, r: WireRule) -> Result<CiliumRule, FieldError> {
    unsupported(
        format!("{field}.nodeSelector"),
        r.node_selector.is_some(),
        "host policies (nodeSelector)",
    )?;
    unsupported(format!("{field}.labels"), r.labels.is_some(), "rule labels")?;
    unsupported(format!("{field}.log"), r.log.is_some(), "policy logging")?;
    let endpoint_selector = r.endpoint_selector.ok_or_else(|| {
        FieldError::new(
            format!("{field}.endpointSelector"),
            "is required (a rule applies to the endpoints it selects)",
        )
    })?;
    let endpoint_selector = LabelSelector::from_raw(
        &format!("{field}.endpointSelector"),
        endpoint_selector,
        SelectorFlavor::Cilium,
    )?;
    let ingress = list(field, "ingress", r.ingress, ingress_rule)?;
    let ingress_deny = list(field, "ingressDeny", r.ingress_deny, ingress_rule)?;
    let egress = list(field, "egress", r.egress, egress_rule)?;
    let egress_deny = list(field, "egressDeny", r.egress_deny, egress_rule)?;
    for (name, rules) in [("ingressDeny", &ingress_deny), ("egressDeny", &egress_deny)] {
        for (i, rule) in rules.iter().enumerate() {
            // Cilium's deny port rules have no names: a named port cannot be denied.
            if let Some(p) = rule
                .ports
                .iter()
                .flatten()
                .find(|p| matches!(p.port, Some(PortRef::Name(_))))
            {
                return Err(FieldError::new(
                    format!("{field}.{name}[{i}].toPorts"),
                    format!("named port {p} is not allowed in a deny rule"),
                ));
            }
        }
    }
    let dd = r.enable_default_deny;
    let default_deny_ingress = dd
        .as_ref()
        .and_then(|d| d.ingress)
        .unwrap_or(!ingress.is_empty() || !ingress_deny.is_empty());
    let default_deny_egress = dd
        .as_ref()
        .and_then(|d| d.egress)
        .unwrap_or(!egress.is_empty() || !egress_deny.is_empty());
    Ok(CiliumRule {
        endpoint_selector,
        ingress,
        ingress_deny,
        egress,
        egress_deny,
        default_deny_ingress,
        default_deny_egress,
        description: r.description.unwrap_or_default(),
    })
}

fn list<W>(
    field: &str,
    name: &str,
    items: Option<Vec<W>>,
    f: fn(&str, W) -> Result<CiliumPeerRule, FieldError>,
) -> Result<Vec<CiliumPeerRule>, FieldError> {
    items
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, w)| f(&format!("{field}.{name}[{i}]"), w))
        .collect()
}

/// The fields both directions share, under their direction's names.
struct Parts {
    endpoints: (&'static str, Option<Vec<RawSelector>>),
    cidr: (&'static str, Option<Vec<String>>),
    cidr_set: (&'static str, Option<Vec<WireCidrRule>>),
    entities: (&'static str, Option<Vec<String>>),
    to_ports: Option<Vec<WirePortRule>>,
}

fn ingress_rule(field: &str, r: WireIngress) -> Result<CiliumPeerRule, FieldError> {
    let f = |name: &str| format!("{field}.{name}");
    unsupported(f("fromRequires"), r.from_requires.is_some(), "fromRequires")?;
    unsupported(
        f("fromGroups"),
        r.from_groups.is_some(),
        "cloud provider groups (fromGroups)",
    )?;
    unsupported(
        f("fromNodes"),
        r.from_nodes.is_some(),
        "node selectors (fromNodes)",
    )?;
    unsupported(f("icmps"), r.icmps.is_some(), "ICMP type rules (icmps)")?;
    unsupported(
        f("authentication"),
        r.authentication.is_some(),
        "mutual authentication",
    )?;
    peer_rule(
        field,
        Parts {
            endpoints: ("fromEndpoints", r.from_endpoints),
            cidr: ("fromCIDR", r.from_cidr),
            cidr_set: ("fromCIDRSet", r.from_cidr_set),
            entities: ("fromEntities", r.from_entities),
            to_ports: r.to_ports,
        },
    )
}

fn egress_rule(field: &str, r: WireEgress) -> Result<CiliumPeerRule, FieldError> {
    let f = |name: &str| format!("{field}.{name}");
    unsupported(f("toRequires"), r.to_requires.is_some(), "toRequires")?;
    unsupported(
        f("toGroups"),
        r.to_groups.is_some(),
        "cloud provider groups (toGroups)",
    )?;
    unsupported(
        f("toNodes"),
        r.to_nodes.is_some(),
        "node selectors (toNodes)",
    )?;
    unsupported(
        f("toServices"),
        r.to_services.is_some(),
        "service selectors (toServices)",
    )?;
    unsupported(
        f("toFQDNs"),
        r.to_fqdns.is_some(),
        "DNS-based policy (toFQDNs)",
    )?;
    unsupported(f("icmps"), r.icmps.is_some(), "ICMP type rules (icmps)")?;
    unsupported(
        f("authentication"),
        r.authentication.is_some(),
        "mutual authentication",
    )?;
    peer_rule(
        field,
        Parts {
            endpoints: ("toEndpoints", r.to_endpoints),
            cidr: ("toCIDR", r.to_cidr),
            cidr_set: ("toCIDRSet", r.to_cidr_set),
            entities: ("toEntities", r.to_entities),
            to_ports: r.to_ports,
        },
    )
}

fn peer_rule(field: &str, parts: Parts) -> Result<CiliumPeerRule, FieldError> {
    // Cilium's sanitizer refuses to combine two kinds of L3 peers in one rule.
    let named: Vec<&str> = [
        (
            parts.endpoints.0,
            parts.endpoints.1.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            parts.cidr.0,
            parts.cidr.1.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            parts.cidr_set.0,
            parts.cidr_set.1.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            parts.entities.0,
            parts.entities.1.as_ref().is_some_and(|v| !v.is_empty()),
        ),
    ]
    .into_iter()
    .filter_map(|(n, set)| set.then_some(n))
    .collect();
    if named.len() > 1 {
        return Err(FieldError::new(
            field,
            format!(
                "combining {} and {} in one rule is not supported (write one rule for each)",
                named[0], named[1]
            ),
        ));
    }
    let (ep_name, endpoints) = parts.endpoints;
    let endpoints = endpoints
        .map(|sels| {
            sels.into_iter()
                .enumerate()
                .map(|(i, s)| {
                    LabelSelector::from_raw(
                        &format!("{field}.{ep_name}[{i}]"),
                        s,
                        SelectorFlavor::Cilium,
                    )
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let (cidr_name, cidrs) = parts.cidr;
    let cidrs = cidrs
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(i, c)| parse_cidr(&format!("{field}.{cidr_name}[{i}]"), c, false))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let (set_name, sets) = parts.cidr_set;
    let cidr_sets = sets
        .map(|list| {
            list.into_iter()
                .enumerate()
                .map(|(i, s)| cidr_rule(&format!("{field}.{set_name}[{i}]"), s))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let (ent_name, entities) = parts.entities;
    let entities = entities
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(i, e)| {
                    e.parse::<Entity>()
                        .map_err(|why| FieldError::new(format!("{field}.{ent_name}[{i}]"), why))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let ports = parts
        .to_ports
        .map(|rules| {
            let mut ports = Vec::new();
            for (i, r) in rules.into_iter().enumerate() {
                ports.extend(port_rule(&format!("{field}.toPorts[{i}]"), r)?);
            }
            Ok::<_, FieldError>(ports)
        })
        .transpose()?;
    Ok(CiliumPeerRule {
        endpoints,
        cidrs,
        cidr_sets,
        entities,
        ports,
    })
}

fn cidr_rule(field: &str, s: WireCidrRule) -> Result<CidrBlock, FieldError> {
    unsupported(
        format!("{field}.cidrGroupRef"),
        s.cidr_group_ref.is_some(),
        "CIDR groups (cidrGroupRef)",
    )?;
    unsupported(
        format!("{field}.cidrGroupSelector"),
        s.cidr_group_selector.is_some(),
        "CIDR groups (cidrGroupSelector)",
    )?;
    let cidr = s
        .cidr
        .ok_or_else(|| FieldError::new(format!("{field}.cidr"), "is required"))?;
    CidrBlock::new(field, &cidr, &s.except.unwrap_or_default(), false)
}

fn port_rule(field: &str, r: WirePortRule) -> Result<Vec<PolicyPort>, FieldError> {
    let f = |name: &str| format!("{field}.{name}");
    unsupported(f("rules"), r.rules.is_some(), "L7 rules (HTTP, Kafka, DNS)")?;
    unsupported(
        f("originatingTLS"),
        r.originating_tls.is_some(),
        "TLS interception",
    )?;
    unsupported(
        f("terminatingTLS"),
        r.terminating_tls.is_some(),
        "TLS interception",
    )?;
    unsupported(
        f("serverNames"),
        r.server_names.is_some(),
        "TLS server names",
    )?;
    unsupported(f("listener"), r.listener.is_some(), "Envoy listeners")?;
    r.ports
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, p)| port(&format!("{field}.ports[{i}]"), p))
        .collect()
}

fn port(field: &str, p: WirePort) -> Result<PolicyPort, FieldError> {
    let protocol = match p.protocol.as_deref() {
        // Cilium's default: any protocol with ports.
        None | Some("ANY") => None,
        Some(text) => Some(text.parse::<Protocol>().map_err(|_| {
            FieldError::new(
                format!("{field}.protocol"),
                format!("unsupported protocol {text:?} (expected TCP, UDP, SCTP or ANY)"),
            )
        })?),
    };
    let pf = format!("{field}.port");
    let port = match p.port {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(port_from_text(&pf, &s)?),
        Some(Value::Number(n)) => {
            let n = n.as_i64().ok_or_else(|| {
                FieldError::new(&pf, format!("{n} is not a port number (1-65535)"))
            })?;
            Some(PortRef::Number(number(&pf, n)?))
        }
        Some(_) => {
            return Err(FieldError::new(pf, "must be a port number or a port name"));
        }
    };
    PolicyPort::new(field, protocol, port, p.end_port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::decode;

    fn parse(kind: &str, body: &str) -> Result<CiliumPolicy, FieldError> {
        let yaml = format!("apiVersion: cilium.io/v2\nkind: {kind}\n{body}");
        let doc: CiliumPolicyDoc = decode(serde_yaml::from_str(&yaml).unwrap())?;
        doc.into_policy(kind == "CiliumClusterwideNetworkPolicy")
    }

    fn cnp(spec: &str) -> Result<CiliumPolicy, FieldError> {
        parse(
            "CiliumNetworkPolicy",
            &format!("metadata: {{name: p}}\nspec: {spec}"),
        )
    }

    #[test]
    fn the_l3_l4_language_decodes() {
        let p = cnp(r#"
  endpointSelector: {matchLabels: {app: db}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: web}}]
    toPorts: [{ports: [{port: "5432"}, {port: 8000, endPort: 8080, protocol: UDP}, {port: http}]}]
  - fromCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}]
  - fromEntities: [host, remote-node]
  egressDeny:
  - toCIDR: [192.168.0.0/16]
"#)
        .unwrap();
        assert_eq!(p.namespace, "default");
        let r = &p.rules[0];
        assert!(r.default_deny_ingress && r.default_deny_egress);
        let ports: Vec<String> = r.ingress[0]
            .ports
            .iter()
            .flatten()
            .map(ToString::to_string)
            .collect();
        assert_eq!(ports, vec!["5432/ANY", "8000-8080/UDP", "http/ANY"]);
        assert_eq!(
            r.ingress[2].entities,
            Some(vec![Entity::Host, Entity::RemoteNode])
        );
        assert_eq!(
            r.egress_deny[0].cidrs.as_ref().unwrap()[0].to_string(),
            "192.168.0.0/16"
        );
    }

    #[test]
    fn default_deny_follows_the_sections_unless_set() {
        let p = cnp("{endpointSelector: {}, ingress: [{}]}").unwrap();
        assert!(p.rules[0].default_deny_ingress && !p.rules[0].default_deny_egress);
        let p = cnp("{endpointSelector: {}, ingress: [{}], enableDefaultDeny: {ingress: false}}")
            .unwrap();
        assert!(!p.rules[0].default_deny_ingress);
    }

    #[test]
    fn l7_and_other_unsupported_fields_are_named() {
        let err = cnp(
            "{endpointSelector: {}, ingress: [{toPorts: [{ports: [{port: '80'}], rules: {http: [{method: GET}]}}]}]}",
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.ingress[0].toPorts[0].rules");
        assert!(
            err.reason.starts_with("not supported: L7 rules"),
            "{}",
            err.reason
        );
        let err =
            cnp("{endpointSelector: {}, egress: [{toFQDNs: [{matchName: a.com}]}]}").unwrap_err();
        assert_eq!(err.field, "spec.egress[0].toFQDNs");
        let err =
            cnp("{endpointSelector: {}, egress: [{toServices: [{k8sService: {serviceName: a}}]}]}")
                .unwrap_err();
        assert_eq!(err.field, "spec.egress[0].toServices");
        let err = cnp("{nodeSelector: {}}").unwrap_err();
        assert_eq!(err.field, "spec.nodeSelector");
        let err = cnp("{endpointSelector: {}, ingress: [{fromEndpoint: [{}]}]}").unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.reason.as_str()),
            ("spec.ingress[0].fromEndpoint", "unknown field")
        );
    }

    #[test]
    fn invalid_values_are_named() {
        let cases = [
            (
                "{endpointSelector: {}, ingress: [{fromCIDRSet: [{cidr: 10.0.0.0/8, except: [11.0.0.0/8]}]}]}",
                "spec.ingress[0].fromCIDRSet[0].except[0]",
            ),
            (
                "{endpointSelector: {}, ingress: [{fromCIDR: [10.0.0.0/33]}]}",
                "spec.ingress[0].fromCIDR[0]",
            ),
            (
                "{endpointSelector: {}, ingress: [{fromEntities: [world, everyone]}]}",
                "spec.ingress[0].fromEntities[1]",
            ),
            (
                "{endpointSelector: {}, ingress: [{toPorts: [{ports: [{port: '70000'}]}]}]}",
                "spec.ingress[0].toPorts[0].ports[0].port",
            ),
            (
                "{endpointSelector: {}, ingress: [{toPorts: [{ports: [{port: '80', protocol: ICMP}]}]}]}",
                "spec.ingress[0].toPorts[0].ports[0].protocol",
            ),
            (
                "{endpointSelector: {}, ingress: [{toPorts: [{ports: [{port: '80', endPort: 79}]}]}]}",
                "spec.ingress[0].toPorts[0].ports[0].endPort",
            ),
            (
                "{endpointSelector: {matchExpressions: [{key: a, operator: In}]}}",
                "spec.endpointSelector.matchExpressions[0].values",
            ),
            (
                "{endpointSelector: {}, ingress: [{fromEndpoints: [{}], fromCIDR: [10.0.0.0/8]}]}",
                "spec.ingress[0]",
            ),
            (
                "{endpointSelector: {}, ingressDeny: [{toPorts: [{ports: [{port: http}]}]}]}",
                "spec.ingressDeny[0].toPorts",
            ),
            ("{ingress: [{}]}", "spec.endpointSelector"),
        ];
        for (spec, field) in cases {
            let err = cnp(spec).unwrap_err();
            assert_eq!(err.field, field, "{spec}: {}", err.reason);
        }
    }

    #[test]
    fn specs_and_scopes() {
        let p = parse(
            "CiliumClusterwideNetworkPolicy",
            "metadata: {name: c}\nspecs: [{endpointSelector: {}}, {endpointSelector: {matchLabels: {a: b}}}]",
        )
        .unwrap();
        assert_eq!((p.namespace.as_str(), p.rules.len()), ("", 2));
        let err = parse(
            "CiliumClusterwideNetworkPolicy",
            "metadata: {name: c, namespace: x}\nspec: {endpointSelector: {}}",
        )
        .unwrap_err();
        assert_eq!(err.field, "metadata.namespace");
        let err = parse("CiliumNetworkPolicy", "metadata: {name: c}").unwrap_err();
        assert_eq!(err.field, "spec");
    }
}

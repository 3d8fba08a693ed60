//! The wire shape of Cilium's policy kinds and the checks Cilium's CRD validation and rule
//! sanitizer make.
//!
//! Only the L3/L4 part of the language is enforced. The other fields Cilium defines (L7
//! `rules`, `toFQDNs`, `nodeSelector`, ...) are decoded so that using one is a
//! clear "not supported" naming the field, never a rule silently applied without it: a policy
//! that meant "allow only GET /health" must not become "allow everything on port 80".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml::Value;

use crate::Protocol;
use crate::cilium_policy::{
    CidrGroupMatch, CidrGroupRef, CiliumPeerRule, CiliumPolicy, CiliumRule, Entity, RuleLabel,
    ServiceRef,
};
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
    pub labels: Option<Vec<WireLabel>>,
    #[serde(default)]
    pub log: Option<WireLog>,
}

/// A rule label.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct WireLabel {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
}

/// A `toServices` item.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireService {
    #[serde(default)]
    pub k8s_service: Option<WireServiceName>,
    #[serde(default)]
    pub k8s_service_selector: Option<WireServiceSelector>,
}

/// `k8sService`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireServiceName {
    #[serde(default)]
    pub service_name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// `k8sServiceSelector`.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct WireServiceSelector {
    #[serde(default)]
    pub selector: Option<RawSelector>,
    #[serde(default)]
    pub namespace: Option<String>,
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
    pub icmps: Option<Vec<crate::icmp::WireIcmpRule>>,
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
    pub to_services: Option<Vec<WireService>>,
    #[serde(default, rename = "toFQDNs")]
    pub to_fqdns: Option<Value>,
    #[serde(default)]
    pub icmps: Option<Vec<crate::icmp::WireIcmpRule>>,
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
    pub cidr_group_ref: Option<String>,
    #[serde(default)]
    pub cidr_group_selector: Option<RawSelector>,
}

/// A rule's `log` (Cilium 1.18): a free text put into the flows the rule decides.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct WireLog {
    #[serde(default)]
    pub value: Option<String>,
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

/// Fails when `fromRequires` / `toRequires` is present: Cilium deprecated them (they narrow
/// every other rule selecting the endpoint, a surprise its users tripped over), and a policy
/// enforced without them would allow more than written.
fn deprecated(field: String, present: bool) -> Result<(), FieldError> {
    if present {
        Err(FieldError::new(
            field,
            "deprecated by Cilium and not supported: put the required labels into the rule's own selectors",
        ))
    } else {
        Ok(())
    }
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
        let audit = crate::audit_mode(meta.annotations.as_ref())?;
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
            audit,
        })
    }
}

fn rule(field: &str, r: WireRule) -> Result<CiliumRule, FieldError> {
    unsupported(
        format!("{field}.nodeSelector"),
        r.node_selector.is_some(),
        "host policies (nodeSelector)",
    )?;
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
            // A service's backends are only known once it and its slices are read: a deny
            // rule on them would let through, while they are not, what it means to deny.
            unsupported(
                format!("{field}.{name}[{i}].toServices"),
                rule.services.is_some(),
                "toServices in a deny rule (a service not read yet would deny nothing)",
            )?;
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
        log: r.log.and_then(|l| l.value).filter(|v| !v.is_empty()),
        labels: rule_labels(&format!("{field}.labels"), r.labels.unwrap_or_default())?,
    })
}

fn rule_labels(field: &str, labels: Vec<WireLabel>) -> Result<Vec<RuleLabel>, FieldError> {
    labels
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let key = l
                .key
                .filter(|k| !k.is_empty())
                .ok_or_else(|| FieldError::new(format!("{field}[{i}].key"), "is required"))?;
            Ok(RuleLabel {
                source: l.source.unwrap_or_default(),
                key,
                value: l.value.unwrap_or_default(),
            })
        })
        .collect()
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
    services: Option<Vec<WireService>>,
    to_ports: Option<Vec<WirePortRule>>,
    icmps: Option<Vec<crate::icmp::WireIcmpRule>>,
}

fn ingress_rule(field: &str, r: WireIngress) -> Result<CiliumPeerRule, FieldError> {
    let f = |name: &str| format!("{field}.{name}");
    deprecated(f("fromRequires"), r.from_requires.is_some())?;
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
            services: None,
            to_ports: r.to_ports,
            icmps: r.icmps,
        },
    )
}

fn egress_rule(field: &str, r: WireEgress) -> Result<CiliumPeerRule, FieldError> {
    let f = |name: &str| format!("{field}.{name}");
    deprecated(f("toRequires"), r.to_requires.is_some())?;
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
        f("toFQDNs"),
        r.to_fqdns.is_some(),
        "DNS-based policy (toFQDNs)",
    )?;
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
            services: r.to_services,
            to_ports: r.to_ports,
            icmps: r.icmps,
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
        (
            "toServices",
            parts.services.as_ref().is_some_and(|v| !v.is_empty()),
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
    let (cidr_sets, cidr_groups) = match sets {
        None => (None, None),
        Some(list) => {
            let (mut blocks, mut groups) = (Vec::new(), Vec::new());
            for (i, s) in list.into_iter().enumerate() {
                match cidr_rule(&format!("{field}.{set_name}[{i}]"), s)? {
                    CidrItem::Block(b) => blocks.push(b),
                    CidrItem::Group(g) => groups.push(g),
                }
            }
            // An empty list still names peers (none); a list of groups only has no blocks.
            let blocks = (groups.is_empty() || !blocks.is_empty()).then_some(blocks);
            (blocks, (!groups.is_empty()).then_some(groups))
        }
    };
    let services = parts
        .services
        .map(|list| {
            list.into_iter()
                .enumerate()
                .map(|(i, s)| service_ref(&format!("{field}.toServices[{i}]"), s))
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
    let icmps = parts
        .icmps
        .map(|rules| crate::icmp::icmp_types(&format!("{field}.icmps"), rules))
        .transpose()?;
    Ok(CiliumPeerRule {
        endpoints,
        cidrs,
        cidr_sets,
        cidr_groups,
        entities,
        services,
        ports,
        icmps,
    })
}

/// A `toServices` item: exactly one of `k8sService` and `k8sServiceSelector`.
fn service_ref(field: &str, s: WireService) -> Result<ServiceRef, FieldError> {
    let namespace = |f: String, ns: Option<String>| -> Result<Option<String>, FieldError> {
        let ns = ns.filter(|n| !n.is_empty());
        if let Some(n) = &ns {
            validate::dns1123_label(&f, n)?;
        }
        Ok(ns)
    };
    match (s.k8s_service, s.k8s_service_selector) {
        (Some(svc), None) => {
            let f = format!("{field}.k8sService");
            let name = svc
                .service_name
                .filter(|n| !n.is_empty())
                .ok_or_else(|| FieldError::new(format!("{f}.serviceName"), "is required"))?;
            validate::dns1123_label(&format!("{f}.serviceName"), &name)?;
            Ok(ServiceRef::Name {
                namespace: namespace(format!("{f}.namespace"), svc.namespace)?,
                name,
            })
        }
        (None, Some(sel)) => {
            let f = format!("{field}.k8sServiceSelector");
            let raw = sel
                .selector
                .ok_or_else(|| FieldError::new(format!("{f}.selector"), "is required"))?;
            Ok(ServiceRef::Selector {
                namespace: namespace(format!("{f}.namespace"), sel.namespace)?,
                selector: LabelSelector::from_raw(
                    &format!("{f}.selector"),
                    raw,
                    SelectorFlavor::Kubernetes,
                )?,
            })
        }
        _ => Err(FieldError::new(
            field,
            "exactly one of k8sService and k8sServiceSelector is required",
        )),
    }
}

/// A `fromCIDRSet` / `toCIDRSet` item, with a prefix or naming CIDR groups.
enum CidrItem {
    Block(CidrBlock),
    Group(CidrGroupRef),
}

/// Exactly one of `cidr`, `cidrGroupRef` and `cidrGroupSelector`, as Cilium's CRD requires.
/// A group's exceptions are checked against its prefixes only when the group is read (it may
/// not exist yet): each applies to the group prefixes that contain it.
fn cidr_rule(field: &str, s: WireCidrRule) -> Result<CidrItem, FieldError> {
    let except = s.except.unwrap_or_default();
    let groups = match (s.cidr, s.cidr_group_ref, s.cidr_group_selector) {
        (Some(cidr), None, None) => {
            return CidrBlock::new(field, &cidr, &except, false).map(CidrItem::Block);
        }
        (None, Some(name), None) => {
            validate::dns1123_subdomain(&format!("{field}.cidrGroupRef"), &name)?;
            CidrGroupMatch::Name(name)
        }
        (None, None, Some(raw)) => CidrGroupMatch::Selector(LabelSelector::from_raw(
            &format!("{field}.cidrGroupSelector"),
            raw,
            SelectorFlavor::Kubernetes,
        )?),
        _ => {
            return Err(FieldError::new(
                field,
                "exactly one of cidr, cidrGroupRef and cidrGroupSelector is required",
            ));
        }
    };
    let except = except
        .iter()
        .enumerate()
        .map(|(i, e)| parse_cidr(&format!("{field}.except[{i}]"), e, false))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CidrItem::Group(CidrGroupRef { groups, except }))
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
        let err = cnp(
            "{endpointSelector: {}, egressDeny: [{toServices: [{k8sService: {serviceName: a}}]}]}",
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.egressDeny[0].toServices");
        assert!(err.reason.starts_with("not supported: "), "{}", err.reason);
        let err = cnp("{nodeSelector: {}}").unwrap_err();
        assert_eq!(err.field, "spec.nodeSelector");
        let err = cnp("{endpointSelector: {}, egress: [{toRequires: [{matchLabels: {a: b}}]}]}")
            .unwrap_err();
        assert_eq!(err.field, "spec.egress[0].toRequires");
        assert!(
            err.reason.starts_with("deprecated by Cilium"),
            "{}",
            err.reason
        );
        // ICMP types are read, with their field in errors.
        let p =
            cnp("{endpointSelector: {}, ingressDeny: [{icmps: [{fields: [{type: 8}]}]}]}").unwrap();
        assert_eq!(p.rules[0].ingress_deny[0].icmps.as_ref().unwrap().len(), 1);
        let err = cnp("{endpointSelector: {}, egress: [{icmps: [{fields: [{type: Nope}]}]}]}")
            .unwrap_err();
        assert_eq!(err.field, "spec.egress[0].icmps[0].fields[0].type");
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
    fn services_cidr_groups_and_labels_decode() {
        let p = cnp(r#"
  endpointSelector: {}
  labels: [{key: team, value: shop, source: k8s}, {key: audited}]
  egress:
  - toServices: [{k8sService: {serviceName: db}}, {k8sService: {serviceName: api, namespace: dev}}]
    toPorts: [{ports: [{port: "5432", protocol: TCP}]}]
  - toServices: [{k8sServiceSelector: {selector: {matchLabels: {tier: db}}}}]
  - toCIDRSet: [{cidrGroupRef: vpn, except: [10.48.0.0/28]}, {cidr: 192.0.2.0/24}, {cidrGroupSelector: {matchLabels: {role: vpn}}}]
  - toCIDRSet: [{cidrGroupRef: only-groups}]
"#)
        .unwrap();
        let r = &p.rules[0];
        let labels: Vec<String> = r.labels.iter().map(ToString::to_string).collect();
        assert_eq!(labels, ["k8s:team=shop", ":audited"]);
        assert_eq!(
            r.egress[0].services.as_ref().unwrap()[1],
            ServiceRef::Name {
                namespace: Some("dev".into()),
                name: "api".into()
            }
        );
        assert_eq!(r.egress[0].ports.as_ref().unwrap().len(), 1);
        assert!(matches!(
            &r.egress[1].services.as_ref().unwrap()[0],
            ServiceRef::Selector { namespace: None, selector } if selector.match_labels["tier"] == "db"
        ));
        let groups = r.egress[2].cidr_groups.as_ref().unwrap();
        assert_eq!(groups[0].groups, CidrGroupMatch::Name("vpn".into()));
        assert_eq!(groups[0].except[0].to_string(), "10.48.0.0/28");
        assert!(matches!(groups[1].groups, CidrGroupMatch::Selector(_)));
        assert_eq!(r.egress[2].cidr_sets.as_ref().unwrap().len(), 1);
        // Groups alone: no literal blocks, and the rule still names peers.
        assert!(r.egress[3].cidr_sets.is_none() && r.egress[3].has_peer_fields());
    }

    #[test]
    fn services_cidr_groups_and_labels_errors_name_their_field() {
        let cases = [
            (
                "{endpointSelector: {}, egress: [{toServices: [{}]}]}",
                "spec.egress[0].toServices[0]",
            ),
            (
                "{endpointSelector: {}, egress: [{toServices: [{k8sService: {namespace: a}}]}]}",
                "spec.egress[0].toServices[0].k8sService.serviceName",
            ),
            (
                "{endpointSelector: {}, egress: [{toServices: [{k8sServiceSelector: {namespace: a}}]}]}",
                "spec.egress[0].toServices[0].k8sServiceSelector.selector",
            ),
            (
                "{endpointSelector: {}, egress: [{toServices: [{k8sService: {serviceName: a}}], toEndpoints: [{}]}]}",
                "spec.egress[0]",
            ),
            (
                "{endpointSelector: {}, egress: [{toCIDRSet: [{cidr: 10.0.0.0/8, cidrGroupRef: a}]}]}",
                "spec.egress[0].toCIDRSet[0]",
            ),
            (
                "{endpointSelector: {}, ingress: [{fromCIDRSet: [{cidrGroupRef: a, except: [10.0.0.0/40]}]}]}",
                "spec.ingress[0].fromCIDRSet[0].except[0]",
            ),
            (
                "{endpointSelector: {}, ingress: [{fromCIDRSet: [{cidrGroupRef: Bad_Name}]}]}",
                "spec.ingress[0].fromCIDRSet[0].cidrGroupRef",
            ),
            (
                "{endpointSelector: {}, labels: [{value: x}]}",
                "spec.labels[0].key",
            ),
            (
                "{endpointSelector: {}, ingress: [{toServices: []}]}",
                "spec.ingress[0].toServices",
            ),
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

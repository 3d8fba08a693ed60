//! `cilium.io/v2 CiliumNetworkPolicy` and `CiliumClusterwideNetworkPolicy`: the L3/L4 part
//! of Cilium's policy language, as stored after decoding (see `cilium_decode` for the wire
//! shape and its checks).

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use ipnet::IpNet;

use crate::key::{Object, ObjectKey};
use crate::policy_port::{CidrBlock, PolicyPort};
use crate::selector::LabelSelector;

/// A Cilium entity: a class of peers known without their addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entity {
    /// Everything outside the cluster (`reserved:world` and CIDR identities).
    World,
    /// The IPv4 part of the world (`reserved:world-ipv4` and IPv4 CIDR identities), as
    /// Cilium splits it on a dual-stack node.
    WorldIpv4,
    /// The IPv6 part of the world (`reserved:world-ipv6` and IPv6 CIDR identities).
    WorldIpv6,
    /// Everything inside the cluster: every identity that is not world.
    Cluster,
    /// The local node.
    Host,
    /// Other nodes of the cluster.
    RemoteNode,
    /// The Kubernetes API server.
    KubeApiserver,
    /// Cilium's health endpoints.
    Health,
    /// Endpoints whose identity is not resolved yet.
    Init,
    /// Pods not managed by the CNI.
    Unmanaged,
    /// The ingress proxy.
    Ingress,
    /// Every peer.
    All,
    /// No peer.
    None,
}

impl Entity {
    /// Every entity with its name.
    pub const ALL: [(Entity, &'static str); 13] = [
        (Entity::World, "world"),
        (Entity::WorldIpv4, "world-ipv4"),
        (Entity::WorldIpv6, "world-ipv6"),
        (Entity::Cluster, "cluster"),
        (Entity::Host, "host"),
        (Entity::RemoteNode, "remote-node"),
        (Entity::KubeApiserver, "kube-apiserver"),
        (Entity::Health, "health"),
        (Entity::Init, "init"),
        (Entity::Unmanaged, "unmanaged"),
        (Entity::Ingress, "ingress"),
        (Entity::All, "all"),
        (Entity::None, "none"),
    ];

    /// The name policies use.
    pub fn name(self) -> &'static str {
        Entity::ALL
            .iter()
            .find(|(e, _)| *e == self)
            .map_or("none", |(_, n)| n)
    }
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Entity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Entity::ALL
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(e, _)| *e)
            .ok_or_else(|| {
                let names: Vec<&str> = Entity::ALL.iter().map(|(_, n)| *n).collect();
                format!(
                    "unknown entity {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// One ingress, egress or deny rule: its peers and ports.
///
/// Each peer field is `None` when absent; an empty list selects no peer. A rule without any
/// peer field selects every peer when it has ports, and none when it is entirely empty (so
/// that `ingress: [{}]` only switches default deny on, as Cilium documents).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CiliumPeerRule {
    /// `fromEndpoints` / `toEndpoints`, as written (namespace scoping is the repository's).
    pub endpoints: Option<Vec<LabelSelector>>,
    /// `fromCIDR` / `toCIDR`.
    pub cidrs: Option<Vec<IpNet>>,
    /// `fromCIDRSet` / `toCIDRSet` items with a `cidr`.
    pub cidr_sets: Option<Vec<CidrBlock>>,
    /// `fromCIDRSet` / `toCIDRSet` items naming CIDR groups (`cidrGroupRef`,
    /// `cidrGroupSelector`); `None` when the rule has none.
    pub cidr_groups: Option<Vec<CidrGroupRef>>,
    /// `fromEntities` / `toEntities`.
    pub entities: Option<Vec<Entity>>,
    /// `toServices` (egress only).
    pub services: Option<Vec<ServiceRef>>,
    /// The ports of every `toPorts` entry; `None` (or empty) = every port and protocol, unless
    /// `icmps` names types.
    pub ports: Option<Vec<PolicyPort>>,
    /// The ICMP and ICMPv6 types of every `icmps` entry: with them, the rule covers those
    /// types (and its `toPorts`), nothing else.
    pub icmps: Option<Vec<crate::IcmpType>>,
}

impl CiliumPeerRule {
    /// Whether the rule names peers in any way (even an empty list).
    pub fn has_peer_fields(&self) -> bool {
        self.endpoints.is_some()
            || self.cidrs.is_some()
            || self.cidr_sets.is_some()
            || self.cidr_groups.is_some()
            || self.entities.is_some()
            || self.services.is_some()
    }
}

/// A `fromCIDRSet` / `toCIDRSet` item naming CIDR groups: every prefix of the groups, less
/// the exceptions inside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CidrGroupRef {
    /// Which groups.
    pub groups: CidrGroupMatch,
    /// `except`: prefixes left out of every group prefix that contains them.
    pub except: Vec<IpNet>,
}

/// How a CIDR set item names its groups.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CidrGroupMatch {
    /// `cidrGroupRef`: one group by name.
    Name(String),
    /// `cidrGroupSelector`: the groups whose labels the selector matches.
    Selector(LabelSelector),
}

/// A `toServices` item: the services whose backends a rule selects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServiceRef {
    /// `k8sService`: services by name.
    Name {
        /// `namespace`; `None`: every namespace, as in Cilium (not the policy's own).
        namespace: Option<String>,
        /// `serviceName`.
        name: String,
    },
    /// `k8sServiceSelector`: the services whose labels the selector matches.
    Selector {
        /// `namespace`; `None`: every namespace, as in Cilium (not the policy's own).
        namespace: Option<String>,
        /// `selector`, on the services' own labels.
        selector: LabelSelector,
    },
}

/// A rule label (`spec.labels` item): names the rule, changes nothing it does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuleLabel {
    /// `source`; empty when not given (Cilium keeps it so, and prints `:key=value`).
    pub source: String,
    /// `key`.
    pub key: String,
    /// `value`; may be empty.
    pub value: String,
}

impl fmt::Display for RuleLabel {
    /// `source:key=value`, or `source:key` without a value, as Cilium prints labels.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.key)?;
        if !self.value.is_empty() {
            write!(f, "={}", self.value)?;
        }
        Ok(())
    }
}

/// One rule of a Cilium policy (`spec` or an item of `specs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CiliumRule {
    /// The endpoints the rule applies to, as written.
    pub endpoint_selector: LabelSelector,
    /// Allowed ingress.
    pub ingress: Vec<CiliumPeerRule>,
    /// Denied ingress (wins over any allow).
    pub ingress_deny: Vec<CiliumPeerRule>,
    /// Allowed egress.
    pub egress: Vec<CiliumPeerRule>,
    /// Denied egress (wins over any allow).
    pub egress_deny: Vec<CiliumPeerRule>,
    /// Whether selected endpoints go into default deny at ingress: `enableDefaultDeny.ingress`,
    /// defaulted as Cilium does (true when the rule has ingress or ingressDeny rules).
    pub default_deny_ingress: bool,
    /// The same for egress.
    pub default_deny_egress: bool,
    /// `log.value` (Cilium 1.18): put into the flows the rule decides (Hubble's `policy_log`).
    pub log: Option<String>,
    /// `description`.
    pub description: String,
    /// `labels`: what names the rule.
    pub labels: Vec<RuleLabel>,
}

/// The content shared by both Cilium kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumPolicy {
    /// The namespace; empty for the cluster-wide kind.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// `spec` followed by the items of `specs`.
    pub rules: Vec<CiliumRule>,
    /// In audit mode ([`crate::AUDIT_MODE_ANNOTATION`]).
    pub audit: bool,
}

/// A `CiliumNetworkPolicy`: rules scoped to its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumNetworkPolicy(pub CiliumPolicy);

/// A `CiliumClusterwideNetworkPolicy`: rules for the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumClusterwideNetworkPolicy(pub CiliumPolicy);

impl Deref for CiliumNetworkPolicy {
    type Target = CiliumPolicy;
    fn deref(&self) -> &CiliumPolicy {
        &self.0
    }
}

impl Deref for CiliumClusterwideNetworkPolicy {
    type Target = CiliumPolicy;
    fn deref(&self) -> &CiliumPolicy {
        &self.0
    }
}

impl Object for CiliumNetworkPolicy {
    const KIND: &'static str = "CiliumNetworkPolicy";
    fn key(&self) -> ObjectKey {
        ObjectKey::namespaced(&self.0.namespace, &self.0.name)
    }
}

impl Object for CiliumClusterwideNetworkPolicy {
    const KIND: &'static str = "CiliumClusterwideNetworkPolicy";
    fn key(&self) -> ObjectKey {
        ObjectKey::cluster(&self.0.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_round_trip_and_unknown_ones_are_listed() {
        for (e, name) in Entity::ALL {
            assert_eq!(name.parse::<Entity>().unwrap(), e);
            assert_eq!(e.to_string(), name);
        }
        let err = "everything".parse::<Entity>().unwrap_err();
        assert!(err.contains("remote-node"), "{err}");
    }
}

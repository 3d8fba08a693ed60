//! The rule model: what every source kind is translated into, independent of that kind.
//!
//! A [`RuleSet`] is everything one policy object says: which endpoints it puts into default
//! deny in which direction ([`Enforcement`]), and its allow and deny [`Rule`]s. Every rule
//! remembers its [`Origin`], so `cellium policy get` can say where it came from.

use std::fmt;
use std::sync::Arc;

use cellium_labels::{Operator, POD_NAMESPACE_LABEL, Selector, source};
use cellium_policy::{Direction, Protocol, Verdict};
use ipnet::IpNet;

/// The kind of object a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// `networking.k8s.io/v1 NetworkPolicy`.
    NetworkPolicy,
    /// `cilium.io/v2 CiliumNetworkPolicy`.
    CiliumNetworkPolicy,
    /// `cilium.io/v2 CiliumClusterwideNetworkPolicy`.
    CiliumClusterwideNetworkPolicy,
}

impl PolicyKind {
    /// The Kubernetes kind name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::NetworkPolicy => "NetworkPolicy",
            PolicyKind::CiliumNetworkPolicy => "CiliumNetworkPolicy",
            PolicyKind::CiliumClusterwideNetworkPolicy => "CiliumClusterwideNetworkPolicy",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The object a rule came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    /// Its kind.
    pub kind: PolicyKind,
    /// Its namespace (empty for the cluster-wide kind).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// In audit mode (`policy.cellium.io/audit-mode`): what only it would drop passes.
    pub audit: bool,
    /// The `log` value of the rule (a Cilium spec) this origin stands for: put into the flows
    /// it decides.
    pub log: Option<String>,
}

impl fmt::Display for Origin {
    /// `NetworkPolicy shop/db`, `CiliumClusterwideNetworkPolicy no-telnet`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// A peer of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// Every peer, known or not (the datapath's identity 0).
    All,
    /// The identities a selector matches (resolved by the selector cache).
    Selector(Selector),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::All => f.write_str("<any>"),
            Peer::Selector(s) => write!(f, "{s}"),
        }
    }
}

/// Which ports of a protocol a rule covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortMatch {
    /// Every port.
    All,
    /// An inclusive range (one port: both ends equal).
    Range(u16, u16),
    /// A container port by name: the subject's own for ingress rules, the peer's for egress
    /// rules; resolved per endpoint and peer.
    Named(String),
}

/// The L4 part of a rule: a protocol (`None` = TCP, UDP and SCTP, or every protocol when
/// the ports are [`PortMatch::All`]) and ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortSpec {
    /// The protocol.
    pub protocol: Option<Protocol>,
    /// The ports.
    pub ports: PortMatch,
}

impl fmt::Display for PortSpec {
    /// `80/tcp`, `8000-8080/udp`, `http/tcp`, `*/tcp`, `53/any`, `*` (everything).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.ports, self.protocol) {
            (PortMatch::All, None) => return f.write_str("*"),
            (PortMatch::All, Some(_)) => f.write_str("*")?,
            (PortMatch::Range(a, b), _) if a == b => write!(f, "{a}")?,
            (PortMatch::Range(a, b), _) => write!(f, "{a}-{b}")?,
            (PortMatch::Named(n), _) => f.write_str(n)?,
        }
        match self.protocol {
            Some(p) => write!(f, "/{p}"),
            None => f.write_str("/any"),
        }
    }
}

/// One allow or deny rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Where it came from.
    pub origin: Arc<Origin>,
    /// The endpoints it applies to.
    pub subject: Selector,
    /// The direction, relative to the subject.
    pub direction: Direction,
    /// Allow or deny.
    pub verdict: Verdict,
    /// The peers; empty = none (the rule allows or denies nothing).
    pub peers: Vec<Peer>,
    /// The ports; empty = every port and protocol.
    pub ports: Vec<PortSpec>,
    /// The labels that name the rule (a Cilium rule's `labels`, as `source:key=value`).
    pub labels: Vec<String>,
}

/// A subject put into default deny in one direction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Enforcement {
    /// The object that switched it on.
    pub origin: Arc<Origin>,
    /// The endpoints.
    pub subject: Selector,
    /// The direction.
    pub direction: Direction,
    /// The labels that name the rule that switched it on.
    pub labels: Vec<String>,
}

/// Everything one policy object says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    /// Default deny it switches on.
    pub enforce: Vec<Enforcement>,
    /// Its rules.
    pub rules: Vec<Rule>,
    /// The CIDR prefixes (blocks and exceptions) its rules name.
    pub prefixes: Vec<IpNet>,
    /// Whether pod identities inside those prefixes carry their `cidr:` labels (the
    /// NetworkPolicy `ipBlock` semantics; Cilium's own CIDR rules select external addresses
    /// only).
    pub prefixes_cover_pods: bool,
}

impl RuleSet {
    /// The one pod namespace every subject of the set requires (`k8s:io.kubernetes.pod.namespace
    /// = <ns>`), if there is one: the set can then select no identity outside that namespace,
    /// which lets the repository skip it for every other endpoint. `None` for a set whose
    /// subjects may select across namespaces (a cluster-wide policy, say), or that has none.
    pub fn namespace(&self) -> Option<&str> {
        let mut subjects = self
            .enforce
            .iter()
            .map(|e| &e.subject)
            .chain(self.rules.iter().map(|r| &r.subject));
        let first = namespace_of(subjects.next()?)?;
        subjects
            .all(|s| namespace_of(s) == Some(first))
            .then_some(first)
    }

    /// Whether a rule uses a named port of its peers (egress rules), whose numbers depend on
    /// the pods behind each peer identity.
    pub fn uses_peer_named_ports(&self) -> bool {
        self.rules.iter().any(|r| {
            r.direction == Direction::Egress
                && r.ports
                    .iter()
                    .any(|p| matches!(p.ports, PortMatch::Named(_)))
        })
    }
}

/// The namespace a selector requires of every label set it matches, if it requires exactly
/// one with a `k8s:` key (the only source a pod's namespace label has).
pub(crate) fn namespace_of(selector: &Selector) -> Option<&str> {
    selector.requirements().iter().find_map(|r| {
        let key = r.key();
        let one = (key.source() == source::K8S
            && key.name() == POD_NAMESPACE_LABEL
            && r.operator() == Operator::In
            && r.values().len() == 1)
            .then(|| r.values().first())?;
        one.map(String::as_str)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_origins_display() {
        let p = |protocol, ports| PortSpec { protocol, ports };
        assert_eq!(
            p(Some(Protocol::Tcp), PortMatch::Range(80, 80)).to_string(),
            "80/tcp"
        );
        assert_eq!(
            p(Some(Protocol::Udp), PortMatch::Range(8000, 8080)).to_string(),
            "8000-8080/udp"
        );
        assert_eq!(
            p(None, PortMatch::Named("dns".into())).to_string(),
            "dns/any"
        );
        assert_eq!(p(None, PortMatch::All).to_string(), "*");
        assert_eq!(
            p(Some(Protocol::Sctp), PortMatch::All).to_string(),
            "*/sctp"
        );
        let o = Origin {
            kind: PolicyKind::CiliumClusterwideNetworkPolicy,
            namespace: String::new(),
            name: "x".into(),
            audit: false,
            log: None,
        };
        assert_eq!(o.to_string(), "CiliumClusterwideNetworkPolicy x");
    }

    #[test]
    fn a_set_is_scoped_to_the_namespace_all_its_subjects_require() {
        let enforce = |subject: &str| Enforcement {
            origin: Arc::new(Origin {
                kind: PolicyKind::NetworkPolicy,
                namespace: "shop".into(),
                name: "db".into(),
                audit: false,
                log: None,
            }),
            subject: subject.parse().unwrap(),
            direction: Direction::Ingress,
            labels: Vec::new(),
        };
        let set = |subjects: &[&str]| RuleSet {
            enforce: subjects.iter().map(|s| enforce(s)).collect(),
            ..RuleSet::default()
        };
        let shop = "k8s:app=db,k8s:io.kubernetes.pod.namespace=shop";
        assert_eq!(set(&[shop, shop]).namespace(), Some("shop"));
        assert_eq!(
            set(&[shop, "k8s:io.kubernetes.pod.namespace=dev"]).namespace(),
            None
        );
        // Not a single namespace, or not certainly the pod's own label: not scoped.
        assert_eq!(set(&["k8s:app=db"]).namespace(), None);
        assert_eq!(
            set(&["k8s:io.kubernetes.pod.namespace in (dev,shop)"]).namespace(),
            None
        );
        assert_eq!(
            set(&["any:io.kubernetes.pod.namespace=shop"]).namespace(),
            None
        );
        assert_eq!(set(&[]).namespace(), None);
    }
}

//! Resolution: the rules that select one endpoint, turned into what the datapath enforces.
//!
//! The result's [`PolicyRule`]s are exactly what `cellium_policy::compile`
//! takes: one per (peer identity, protocol, port range, verdict), identity 0 standing for
//! every peer. Named ports are resolved here: an ingress rule's against the endpoint's own
//! container ports, an egress rule's against the ports of the pods behind each peer
//! identity ([`PeerPorts`]); an egress rule to every peer with a named port allows, to each
//! identity whose pods have a port of that name, the numbers they give it, and nothing to
//! anything else (an address outside every pod has no named ports).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cellium_identity::Reserved;
use cellium_labels::{Labels, Selector};
use cellium_policy::{Direction, PolicyRule, Protocol, Verdict};
use cellium_resources::NamedPort;

use crate::rule::{Peer, PortMatch, PortSpec, RuleSet};
use crate::selector_cache::SelectorCache;
use crate::translate::protocol;

/// The endpoint a policy is resolved for.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Its security identity.
    pub identity: u32,
    /// The labels of that identity.
    pub labels: &'a Labels,
    /// Its named container ports (what ingress rules' port names refer to).
    pub named_ports: &'a [NamedPort],
}

/// What one peer identity may or may not do, for `cellium endpoint get`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    /// The direction, relative to the endpoint.
    pub direction: Direction,
    /// Allowed or denied.
    pub verdict: Verdict,
    /// The peer identity; 0 = every peer.
    pub identity: u32,
    /// The ports (`80/tcp`, `8000-8080/any`, `*/udp`, `*` for everything).
    pub ports: Vec<String>,
}

/// An endpoint's resolved policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// The repository revision this was computed at.
    pub revision: u64,
    /// Whether ingress is default deny (only what `rules` allow passes).
    pub ingress_enforced: bool,
    /// Whether egress is default deny.
    pub egress_enforced: bool,
    /// The rules, for `cellium_policy::compile`.
    pub rules: Vec<PolicyRule>,
}

impl EndpointPolicy {
    /// The rules summarised per direction, verdict and peer, for display. Computed on
    /// demand: every endpoint is resolved at every revision, and shown far less often.
    pub fn peers(&self) -> Vec<PeerPolicy> {
        summarise(self.rules.iter().map(|r| {
            (
                r.identity,
                r.direction,
                r.protocol,
                r.ports.as_ref().map(|p| (*p.start(), *p.end())),
                r.verdict,
            )
        }))
    }
}

/// A protocol (`None`: every protocol, or TCP, UDP and SCTP with ports) and a port range.
type L4 = (Option<Protocol>, Option<(u16, u16)>);

/// A rule in a sortable form, to drop duplicates.
type RuleKey = (
    u32,
    Direction,
    Option<Protocol>,
    Option<(u16, u16)>,
    Verdict,
);

/// The named ports of the pods behind each peer identity (the ipcache's, see
/// `Ipcache::named_ports`): identities without any are absent.
pub type PeerPorts = BTreeMap<u32, Vec<NamedPort>>;

/// Resolves the policy of `subject` from every rule set. With `lockdown` (the subject is in the
/// scope of a policy, or of labels policy selects by, that is not in force), both directions
/// are enforced whatever the sets say, and nothing is allowed but what their allow rules allow
/// (and the node, for ingress).
pub fn resolve<'a>(
    subject: &Subject<'_>,
    sets: impl Iterator<Item = &'a RuleSet>,
    cache: &SelectorCache,
    peer_ports: &PeerPorts,
    revision: u64,
    lockdown: bool,
) -> EndpointPolicy {
    let mut matched: HashMap<&Selector, bool> = HashMap::new();
    let mut selects = |s: &'a Selector| {
        *matched
            .entry(s)
            .or_insert_with(|| s.matches(subject.labels))
    };
    let mut default_deny = [false; 2];
    let mut has_rules = [false; 2];
    let mut out: BTreeSet<RuleKey> = BTreeSet::new();
    for set in sets {
        for e in &set.enforce {
            if selects(&e.subject) {
                default_deny[dir_index(e.direction)] = true;
            }
        }
        for rule in &set.rules {
            if !selects(&rule.subject) {
                continue;
            }
            has_rules[dir_index(rule.direction)] = true;
            let mut ids: BTreeSet<u32> = BTreeSet::new();
            for peer in &rule.peers {
                match peer {
                    Peer::All => {
                        ids.insert(0);
                    }
                    Peer::Selector(s) => ids.extend(cache.identities(s).into_iter().flatten()),
                }
            }
            let all_ports = [PortSpec {
                protocol: None,
                ports: PortMatch::All,
            }];
            let specs = if rule.ports.is_empty() {
                &all_ports[..]
            } else {
                &rule.ports[..]
            };
            for spec in specs {
                let peer_named = rule.direction == Direction::Egress
                    && matches!(spec.ports, PortMatch::Named(_));
                if peer_named {
                    // The peer's own port of that name: per peer identity. Every peer (0)
                    // means every identity whose pods have ports.
                    let peers: Vec<(u32, &Vec<NamedPort>)> = if ids.contains(&0) {
                        peer_ports.iter().map(|(id, p)| (*id, p)).collect()
                    } else {
                        ids.iter()
                            .filter_map(|id| peer_ports.get(id).map(|p| (*id, p)))
                            .collect()
                    };
                    for (id, named) in peers {
                        for (proto, range) in l4(spec, named) {
                            out.insert((id, rule.direction, proto, range, rule.verdict));
                        }
                    }
                    continue;
                }
                for &id in &ids {
                    for (proto, range) in l4(spec, subject.named_ports) {
                        out.insert((id, rule.direction, proto, range, rule.verdict));
                    }
                }
            }
        }
    }
    let mut enforced = [false; 2];
    for d in Direction::ALL {
        let i = dir_index(d);
        enforced[i] = lockdown || default_deny[i] || has_rules[i];
        if has_rules[i] && !default_deny[i] && !lockdown {
            // Rules without default deny (Cilium's `enableDefaultDeny: false`): everything
            // the deny rules leave is allowed.
            out.insert((0, d, None, None, Verdict::Allow));
        }
    }
    if enforced[dir_index(Direction::Ingress)] {
        // Cilium's default `allow-localhost`: the node reaches its endpoints (kubelet
        // probes, health checks) whatever their ingress policy.
        out.insert((
            Reserved::Host.id(),
            Direction::Ingress,
            None,
            None,
            Verdict::Allow,
        ));
    }
    let rules: Vec<PolicyRule> = out
        .iter()
        .map(
            |(identity, direction, protocol, ports, verdict)| PolicyRule {
                identity: *identity,
                direction: *direction,
                protocol: *protocol,
                ports: ports.map(|(a, b)| a..=b),
                verdict: *verdict,
            },
        )
        .collect();
    EndpointPolicy {
        revision,
        ingress_enforced: enforced[dir_index(Direction::Ingress)],
        egress_enforced: enforced[dir_index(Direction::Egress)],
        rules,
    }
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Ingress => 0,
        Direction::Egress => 1,
    }
}

/// The protocol and port range(s) of one port entry; a named port may resolve to several
/// (one per protocol) or to none.
fn l4(spec: &PortSpec, named: &[NamedPort]) -> Vec<L4> {
    match &spec.ports {
        PortMatch::All => vec![(spec.protocol, None)],
        PortMatch::Range(a, b) => vec![(spec.protocol, Some((*a, *b)))],
        PortMatch::Named(name) => named
            .iter()
            .filter(|p| p.name == *name)
            .map(|p| (protocol(p.protocol), p.port))
            .filter(|(proto, _)| spec.protocol.is_none_or(|want| want == *proto))
            .map(|(proto, port)| (Some(proto), Some((port, port))))
            .collect(),
    }
}

/// `*` (everything), `*/udp`, `80/tcp`, `8000-8080/any`.
fn describe(proto: Option<Protocol>, range: Option<(u16, u16)>) -> String {
    let ports = match range {
        None if proto.is_none() => return "*".to_string(),
        None => "*".to_string(),
        Some((a, b)) if a == b => a.to_string(),
        Some((a, b)) => format!("{a}-{b}"),
    };
    match proto {
        Some(p) => format!("{ports}/{p}"),
        None => format!("{ports}/any"),
    }
}

fn summarise(rules: impl Iterator<Item = RuleKey>) -> Vec<PeerPolicy> {
    let mut by_peer: BTreeMap<(Direction, Verdict, u32), Vec<String>> = BTreeMap::new();
    for (id, d, proto, range, v) in rules {
        by_peer
            .entry((d, v, id))
            .or_default()
            .push(describe(proto, range));
    }
    by_peer
        .into_iter()
        .map(|((direction, verdict, identity), ports)| PeerPolicy {
            direction,
            verdict,
            identity,
            ports,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{Enforcement, Origin, PolicyKind, Rule};
    use std::sync::Arc;

    fn l(s: &str) -> Labels {
        s.parse().unwrap()
    }

    #[test]
    fn named_ports_enforcement_and_localhost() {
        let web = Selector::from_labels(&l("k8s:app=web"));
        let db = Selector::from_labels(&l("k8s:app=db"));
        let origin = Arc::new(Origin {
            kind: PolicyKind::NetworkPolicy,
            namespace: "shop".into(),
            name: "db".into(),
        });
        let set = RuleSet {
            enforce: vec![Enforcement {
                subject: db.clone(),
                direction: Direction::Ingress,
                labels: Vec::new(),
            }],
            rules: vec![Rule {
                origin,
                subject: db.clone(),
                direction: Direction::Ingress,
                verdict: Verdict::Allow,
                peers: vec![Peer::Selector(web.clone())],
                ports: vec![PortSpec {
                    protocol: Some(Protocol::Tcp),
                    ports: PortMatch::Named("sql".into()),
                }],
                labels: Vec::new(),
            }],
            ..RuleSet::default()
        };
        let mut cache = SelectorCache::default();
        cache.add_user(&web);
        cache.identity_added(300, &l("k8s:app=web"));
        let labels = l("k8s:app=db");
        let ports = [
            NamedPort {
                name: "sql".into(),
                port: 5432,
                protocol: cellium_resources::Protocol::Tcp,
            },
            NamedPort {
                name: "sql".into(),
                port: 5433,
                protocol: cellium_resources::Protocol::Udp,
            },
        ];
        let subject = Subject {
            identity: 301,
            labels: &labels,
            named_ports: &ports,
        };
        let p = resolve(
            &subject,
            [&set].into_iter(),
            &cache,
            &PeerPorts::new(),
            7,
            false,
        );
        assert!(p.ingress_enforced && !p.egress_enforced);
        assert_eq!(p.revision, 7);
        assert_eq!(
            p.rules,
            vec![
                PolicyRule {
                    identity: 1,
                    direction: Direction::Ingress,
                    protocol: None,
                    ports: None,
                    verdict: Verdict::Allow
                },
                PolicyRule {
                    identity: 300,
                    direction: Direction::Ingress,
                    protocol: Some(Protocol::Tcp),
                    ports: Some(5432..=5432),
                    verdict: Verdict::Allow
                },
            ]
        );
        assert_eq!(p.peers()[1].ports, vec!["5432/tcp"]);
        assert_eq!(p.peers()[0].ports, vec!["*"]);
        let other = l("k8s:app=web");
        let p = resolve(
            &Subject {
                identity: 300,
                labels: &other,
                named_ports: &[],
            },
            [&set].into_iter(),
            &cache,
            &PeerPorts::new(),
            7,
            false,
        );
        assert!(!p.ingress_enforced && p.rules.is_empty());
        // Locked down, a pod no policy selects allows nothing but the node's ingress.
        let p = resolve(
            &Subject {
                identity: 300,
                labels: &other,
                named_ports: &[],
            },
            [&set].into_iter(),
            &cache,
            &PeerPorts::new(),
            8,
            true,
        );
        assert!(p.ingress_enforced && p.egress_enforced);
        assert_eq!(
            p.rules,
            [PolicyRule {
                identity: Reserved::Host.id(),
                direction: Direction::Ingress,
                protocol: None,
                ports: None,
                verdict: Verdict::Allow
            }]
        );
    }
}

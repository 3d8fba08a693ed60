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
use std::sync::Arc;

use cellium_identity::Reserved;
use cellium_labels::{Labels, Selector};
use cellium_policy::{Direction, PolicyRule, Protocol, Verdict};
use cellium_resources::NamedPort;

use crate::rule::{Origin, Peer, PortMatch, PortSpec, RuleSet};
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
    /// Whether the ingress default deny is only audited: every object that switched it on
    /// is in audit mode (or the agent is, `policy-audit-mode`).
    pub ingress_audit: bool,
    /// The same for egress.
    pub egress_audit: bool,
    /// The rules, for `cellium_policy::compile`.
    pub rules: Vec<PolicyRule>,
    /// Which objects each rule and each direction's default deny came from.
    pub origins: Origins,
}

/// Which policy objects an endpoint's rules came from: what flows name as the policies that
/// allowed or denied a connection, as Hubble's `*_allowed_by` / `*_denied_by`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins {
    /// Per rule (in [`EndpointPolicy::rules`]' order), the objects whose rules gave it; empty
    /// for the rules the agent adds itself (allow-localhost, rules without default deny).
    rules: Vec<Vec<Arc<Origin>>>,
    /// Per direction (ingress, egress), the objects that put it into default deny.
    default_deny: [Vec<Arc<Origin>>; 2],
}

/// Why the datapath decided what it did about a connection, as its event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An allow rule matched.
    Allowed,
    /// A deny rule matched.
    Denied,
    /// No rule matched in a direction in default deny.
    DefaultDenied,
}

impl EndpointPolicy {
    /// The objects that decided `outcome` for a connection of a peer of `identity` in
    /// `direction`, by `protocol` to `port` (0 for protocols without ports): the rules of that
    /// verdict that match it, or, for a default deny, the objects that switched it on. An
    /// enforced drop names no object in audit mode (it did not cause it). Sorted, without
    /// duplicates.
    pub fn decided_by(
        &self,
        outcome: Outcome,
        direction: Direction,
        identity: u32,
        protocol: Protocol,
        port: u16,
    ) -> Vec<Arc<Origin>> {
        let audit_only = match direction {
            Direction::Ingress => self.ingress_audit,
            Direction::Egress => self.egress_audit,
        };
        let verdict = match outcome {
            Outcome::DefaultDenied => {
                let all = &self.origins.default_deny[dir_index(direction)];
                return all
                    .iter()
                    .filter(|o| audit_only || !o.audit)
                    .cloned()
                    .collect();
            }
            Outcome::Allowed => [Verdict::Allow; 2],
            Outcome::Denied => [Verdict::Deny, Verdict::AuditDeny],
        };
        let mut out: BTreeSet<Arc<Origin>> = BTreeSet::new();
        for (rule, origins) in self.rules.iter().zip(&self.origins.rules) {
            let matches = verdict.contains(&rule.verdict)
                && rule.direction == direction
                && (rule.identity == identity || rule.identity == 0)
                && covers(rule, protocol, port);
            if matches {
                let enforced = rule.verdict == Verdict::Deny;
                out.extend(origins.iter().filter(|o| !enforced || !o.audit).cloned());
            }
        }
        out.into_iter().collect()
    }

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

/// Whether `rule` covers a connection by `protocol` to `port`.
fn covers(rule: &PolicyRule, protocol: Protocol, port: u16) -> bool {
    let proto_ok = match rule.protocol {
        Some(p) => p == protocol,
        None => rule.ports.is_none() || protocol.has_ports(),
    };
    proto_ok && rule.ports.as_ref().is_none_or(|r| r.contains(&port))
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
/// (and the node, for ingress); nothing is audited then.
///
/// Audit mode (an object's, or every object's with `audit_all`): what only audited objects
/// would drop passes, reported as an audit. Their deny rules become audited denies, unless an
/// enforced object denies the same; a default deny that only audited objects switched on is
/// audited; their allow rules count only in a direction whose default deny is audited, as they
/// must not widen what an enforced object's default deny leaves.
pub fn resolve<'a>(
    subject: &Subject<'_>,
    sets: impl Iterator<Item = &'a RuleSet>,
    cache: &SelectorCache,
    peer_ports: &PeerPorts,
    revision: u64,
    lockdown: bool,
    audit_all: bool,
) -> EndpointPolicy {
    let mut matched: HashMap<&Selector, bool> = HashMap::new();
    let mut selects = |s: &'a Selector| {
        *matched
            .entry(s)
            .or_insert_with(|| s.matches(subject.labels))
    };
    let mut default_deny: [Vec<Arc<Origin>>; 2] = Default::default();
    let mut has_rules = [false; 2];
    let mut out: BTreeMap<RuleKey, Vec<Arc<Origin>>> = BTreeMap::new();
    let mut add = |key: RuleKey, origin: &Arc<Origin>| {
        let origins = out.entry(key).or_default();
        if !origins.contains(origin) {
            origins.push(origin.clone());
        }
    };
    for set in sets {
        for e in &set.enforce {
            if selects(&e.subject) {
                default_deny[dir_index(e.direction)].push(e.origin.clone());
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
                            add(
                                (id, rule.direction, proto, range, rule.verdict),
                                &rule.origin,
                            );
                        }
                    }
                    continue;
                }
                for &id in &ids {
                    for (proto, range) in l4(spec, subject.named_ports) {
                        add(
                            (id, rule.direction, proto, range, rule.verdict),
                            &rule.origin,
                        );
                    }
                }
            }
        }
    }
    let audited = |o: &Arc<Origin>| !lockdown && (audit_all || o.audit);
    let mut audit_default = [false; 2];
    for (i, origins) in default_deny.iter().enumerate() {
        audit_default[i] = !origins.is_empty() && origins.iter().all(audited);
    }
    out.retain(|(_, d, _, _, v), origins| {
        if *v == Verdict::Allow && !audit_default[dir_index(*d)] {
            origins.retain(|o| !audited(o));
            return !origins.is_empty();
        }
        true
    });
    let mut enforced = [false; 2];
    for d in Direction::ALL {
        let i = dir_index(d);
        let deny_all = !default_deny[i].is_empty();
        enforced[i] = lockdown || deny_all || has_rules[i];
        if has_rules[i] && !deny_all && !lockdown {
            // Rules without default deny (Cilium's `enableDefaultDeny: false`): everything
            // the deny rules leave is allowed.
            out.entry((0, d, None, None, Verdict::Allow)).or_default();
        }
    }
    if enforced[dir_index(Direction::Ingress)] {
        // Cilium's default `allow-localhost`: the node reaches its endpoints (kubelet
        // probes, health checks) whatever their ingress policy.
        out.entry((
            Reserved::Host.id(),
            Direction::Ingress,
            None,
            None,
            Verdict::Allow,
        ))
        .or_default();
    }
    let (rules, origins): (Vec<PolicyRule>, Vec<Vec<Arc<Origin>>>) = out
        .into_iter()
        .map(
            |((identity, direction, protocol, ports, verdict), origins)| {
                let audit =
                    verdict == Verdict::Deny && !origins.is_empty() && origins.iter().all(audited);
                let verdict = if audit { Verdict::AuditDeny } else { verdict };
                let rule = PolicyRule {
                    identity,
                    direction,
                    protocol,
                    ports: ports.map(|(a, b)| a..=b),
                    verdict,
                };
                (rule, origins)
            },
        )
        .unzip();
    for origins in &mut default_deny {
        origins.sort();
        origins.dedup();
    }
    EndpointPolicy {
        revision,
        ingress_enforced: enforced[dir_index(Direction::Ingress)],
        egress_enforced: enforced[dir_index(Direction::Egress)],
        ingress_audit: audit_default[dir_index(Direction::Ingress)],
        egress_audit: audit_default[dir_index(Direction::Egress)],
        rules,
        origins: Origins {
            rules: origins,
            default_deny,
        },
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
            audit: false,
            log: None,
        });
        let set = RuleSet {
            enforce: vec![Enforcement {
                origin: origin.clone(),
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
            false,
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

    #[test]
    fn each_outcome_names_the_objects_that_decided_it() {
        let p = db_policy(&[("a", false, 80, 83), ("b", false, 80, 81)], false, false);
        let by = |outcome, identity, port| -> Vec<String> {
            p.decided_by(outcome, Direction::Ingress, identity, Protocol::Tcp, port)
                .iter()
                .map(|o| o.name.clone())
                .collect()
        };
        assert_eq!(by(Outcome::Allowed, 300, 80), ["a", "b"]);
        assert_eq!(by(Outcome::Denied, 300, 81), ["b"]);
        assert_eq!(by(Outcome::DefaultDenied, 300, 82), ["a", "b"]);
        // Nothing of theirs allows another peer, or a port they do not name; the node is
        // allowed by the agent's own rule, which no object made.
        assert!(by(Outcome::Allowed, 302, 80).is_empty());
        assert!(by(Outcome::Allowed, 300, 82).is_empty());
        assert!(by(Outcome::Allowed, Reserved::Host.id(), 22).is_empty());
        let egress = p.decided_by(
            Outcome::DefaultDenied,
            Direction::Egress,
            300,
            Protocol::Tcp,
            80,
        );
        assert!(egress.is_empty());
    }

    /// `db`'s ingress by `objects`: (name, audited, allowed port, denied port) each, with a
    /// default deny each; web (identity 300) is the peer.
    fn db_policy(
        objects: &[(&str, bool, u16, u16)],
        lockdown: bool,
        audit_all: bool,
    ) -> EndpointPolicy {
        let db = Selector::from_labels(&l("k8s:app=db"));
        let web = Selector::from_labels(&l("k8s:app=web"));
        let sets: Vec<RuleSet> = objects
            .iter()
            .map(|&(name, audit, allow, deny)| {
                let origin = Arc::new(Origin {
                    kind: PolicyKind::CiliumNetworkPolicy,
                    namespace: "shop".into(),
                    name: name.into(),
                    audit,
                    log: None,
                });
                let rule = |verdict, port| Rule {
                    origin: origin.clone(),
                    subject: db.clone(),
                    direction: Direction::Ingress,
                    verdict,
                    peers: vec![Peer::Selector(web.clone())],
                    ports: vec![PortSpec {
                        protocol: Some(Protocol::Tcp),
                        ports: PortMatch::Range(port, port),
                    }],
                    labels: Vec::new(),
                };
                RuleSet {
                    enforce: vec![Enforcement {
                        origin: origin.clone(),
                        subject: db.clone(),
                        direction: Direction::Ingress,
                        labels: Vec::new(),
                    }],
                    rules: vec![rule(Verdict::Allow, allow), rule(Verdict::Deny, deny)],
                    ..RuleSet::default()
                }
            })
            .collect();
        let mut cache = SelectorCache::default();
        cache.add_user(&web);
        cache.identity_added(300, &l("k8s:app=web"));
        let labels = l("k8s:app=db");
        let subject = Subject {
            identity: 301,
            labels: &labels,
            named_ports: &[],
        };
        resolve(
            &subject,
            sets.iter(),
            &cache,
            &PeerPorts::new(),
            1,
            lockdown,
            audit_all,
        )
    }

    fn verdict_of(p: &EndpointPolicy, port: u16) -> Option<Verdict> {
        p.rules
            .iter()
            .find(|r| r.identity == 300 && r.ports == Some(port..=port))
            .map(|r| r.verdict)
    }

    #[test]
    fn audited_objects_let_through_only_what_they_alone_would_drop() {
        // Alone: its default deny and its deny are audited, its allow counts.
        let p = db_policy(&[("a", true, 80, 81)], false, false);
        assert!(p.ingress_enforced && p.ingress_audit && !p.egress_audit);
        assert_eq!(verdict_of(&p, 80), Some(Verdict::Allow));
        assert_eq!(verdict_of(&p, 81), Some(Verdict::AuditDeny));
        // Beside an enforced object: its allow must not widen what the other's default deny
        // leaves; its deny is still only audited; the default deny is the enforced one's.
        let p = db_policy(&[("a", true, 80, 81), ("b", false, 90, 91)], false, false);
        assert!(!p.ingress_audit);
        assert_eq!(verdict_of(&p, 80), None);
        assert_eq!(verdict_of(&p, 90), Some(Verdict::Allow));
        assert_eq!(verdict_of(&p, 81), Some(Verdict::AuditDeny));
        assert_eq!(verdict_of(&p, 91), Some(Verdict::Deny));
        let named = |outcome, port| {
            p.decided_by(outcome, Direction::Ingress, 300, Protocol::Tcp, port)
                .iter()
                .map(|o| o.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(named(Outcome::DefaultDenied, 99), ["b"]);
        assert_eq!(named(Outcome::Denied, 81), ["a"]);
        assert_eq!(named(Outcome::Denied, 91), ["b"]);
        // An enforced deny of the same port wins over the audited one.
        let p = db_policy(&[("a", true, 80, 81), ("b", false, 90, 81)], false, false);
        assert_eq!(verdict_of(&p, 81), Some(Verdict::Deny));
        // The agent's audit mode audits everything; a lockdown audits nothing.
        let p = db_policy(&[("b", false, 90, 91)], false, true);
        assert!(p.ingress_audit);
        assert_eq!(verdict_of(&p, 91), Some(Verdict::AuditDeny));
        let p = db_policy(&[("a", true, 80, 81)], true, true);
        assert!(!p.ingress_audit && !p.egress_audit);
        assert_eq!(verdict_of(&p, 81), Some(Verdict::Deny));
    }
}

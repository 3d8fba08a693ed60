//! CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy, as Cilium translates them.
//!
//! - `endpointSelector` of a namespaced policy only selects endpoints of its namespace.
//! - `fromEndpoints`/`toEndpoints` of a namespaced policy are restricted to its namespace
//!   unless the selector names `io.kubernetes.pod.namespace` (or namespace labels); those of
//!   the cluster-wide kind to pods (any namespace). Selectors on `reserved:` labels are
//!   taken as written.
//! - `fromCIDR`/`fromCIDRSet` select external addresses only (identities with
//!   `reserved:world`), never pods.
//! - Entities map to reserved identities; `world` selects the world of both families
//!   (`world-ipv4` and `world-ipv6` carry `reserved:world`), each of those its own half;
//!   `cluster` is every identity that is not world, `all` every peer.
//! - `cidrGroupRef` / `cidrGroupSelector` select the prefixes of the groups named, as
//!   `toCIDRSet` items with those prefixes would (each `except` takes its addresses out of
//!   every group prefix: a prefix inside an exception is left out whole); a group that does
//!   not exist selects nothing.
//! - `toServices` selects the backends of the services named: for a service with a selector,
//!   the pods of its namespace that the selector matches (as `toEndpoints` would); for one
//!   without, the addresses of its EndpointSlices (as `toCIDR` would, so external ones). An
//!   item without a namespace names services of every namespace, as in Cilium. A service that
//!   does not exist selects nothing.
//! - A rule with ports but no peer field selects every peer; an empty rule (`{}`) none; a
//!   direction with rules (or `enableDefaultDeny`) is default deny; deny rules win.

use std::sync::Arc;

use cellium_labels::Requirement;
use cellium_labels::{NAMESPACE_LABELS_PREFIX, POD_NAMESPACE_LABEL, Selector};
use cellium_policy::{Direction, Protocol, Verdict};
use cellium_resources::{
    CidrBlock, CiliumPeerRule, CiliumPolicy, Entity, IcmpFamily, LabelSelector,
};

use crate::rule::{Enforcement, Origin, Peer, PolicyKind, PortMatch, PortSpec, Rule, RuleSet};
use crate::translate::deps::{Backends, Deps};
use crate::translate::{absent, block_prefixes, cidr_block, ports, present, selector};

/// Translates one Cilium policy; `namespace` is empty for the cluster-wide kind. The CIDR
/// groups and services its rules name are read from `deps` (none without).
pub fn translate(
    kind: PolicyKind,
    policy: &CiliumPolicy,
    deps: Option<&Deps>,
) -> Result<RuleSet, String> {
    let origin = Arc::new(Origin {
        kind,
        namespace: policy.namespace.clone(),
        name: policy.name.clone(),
        audit: policy.audit,
        log: None,
    });
    let ns = policy.namespace.as_str();
    let mut set = RuleSet::default();
    for (i, rule) in policy.rules.iter().enumerate() {
        let field = if policy.rules.len() == 1 {
            "spec".to_string()
        } else {
            format!("rule {i}")
        };
        let mut subject = selector(&rule.endpoint_selector, str::to_string)
            .map_err(|e| format!("{field}.endpointSelector: {e}"))?;
        if !ns.is_empty() {
            subject = subject.and(Selector::namespace(ns));
        }
        let labels: Vec<String> = rule.labels.iter().map(ToString::to_string).collect();
        // A spec with a `log` value has an origin of its own, which names it in flows.
        let origin = match &rule.log {
            Some(log) => Arc::new(Origin {
                log: Some(log.clone()),
                ..(*origin).clone()
            }),
            None => origin.clone(),
        };
        for (direction, on) in [
            (Direction::Ingress, rule.default_deny_ingress),
            (Direction::Egress, rule.default_deny_egress),
        ] {
            if on {
                set.enforce.push(Enforcement {
                    origin: origin.clone(),
                    subject: subject.clone(),
                    direction,
                    labels: labels.clone(),
                });
            }
        }
        for (direction, verdict, rules, name) in [
            (Direction::Ingress, Verdict::Allow, &rule.ingress, "ingress"),
            (
                Direction::Ingress,
                Verdict::Deny,
                &rule.ingress_deny,
                "ingressDeny",
            ),
            (Direction::Egress, Verdict::Allow, &rule.egress, "egress"),
            (
                Direction::Egress,
                Verdict::Deny,
                &rule.egress_deny,
                "egressDeny",
            ),
        ] {
            for (j, r) in rules.iter().enumerate() {
                let peers = peers(ns, r, deps, &mut set)
                    .map_err(|e| format!("{field}.{name}[{j}]: {e}"))?;
                set.rules.push(Rule {
                    origin: origin.clone(),
                    subject: subject.clone(),
                    direction,
                    verdict,
                    peers,
                    ports: l4(r),
                    labels: labels.clone(),
                });
            }
        }
    }
    set.prefixes.sort();
    set.prefixes.dedup();
    Ok(set)
}

/// A rule's L4 part: its `toPorts` ports and its `icmps` types (empty: everything).
fn l4(r: &CiliumPeerRule) -> Vec<PortSpec> {
    let mut specs = ports(r.ports.as_deref().unwrap_or_default());
    specs.extend(r.icmps.iter().flatten().map(|t| {
        let protocol = match t.family {
            IcmpFamily::V4 => Protocol::Icmp,
            IcmpFamily::V6 => Protocol::Other(58),
        };
        let n = u16::from(t.icmp_type);
        PortSpec {
            protocol: Some(protocol),
            ports: PortMatch::Range(n, n),
        }
    }));
    specs
}

fn peers(
    ns: &str,
    r: &CiliumPeerRule,
    deps: Option<&Deps>,
    set: &mut RuleSet,
) -> Result<Vec<Peer>, String> {
    if !r.has_peer_fields() {
        // Ports alone apply to every peer; an empty rule only switches default deny on.
        let has_ports = !l4(r).is_empty();
        return Ok(if has_ports { vec![Peer::All] } else { vec![] });
    }
    let mut out = Vec::new();
    for sel in r.endpoints.iter().flatten() {
        out.push(Peer::Selector(endpoint_peer(ns, sel)?));
    }
    let world = Selector::reserved("world").map_err(|e| e.to_string())?;
    for cidr in r.cidrs.iter().flatten() {
        set.prefixes.push(*cidr);
        out.push(Peer::Selector(Selector::cidr(*cidr).and(world.clone())));
    }
    for block in r.cidr_sets.iter().flatten() {
        set.prefixes.extend(block_prefixes(block));
        out.push(Peer::Selector(cidr_block(block)?.and(world.clone())));
    }
    for e in r.entities.iter().flatten() {
        if let Some(p) = entity(*e)? {
            out.push(p);
        }
    }
    let Some(deps) = deps else { return Ok(out) };
    for g in r.cidr_groups.iter().flatten() {
        for cidr in deps.group_prefixes(&g.groups) {
            // Cilium excepts every prefix inside an `except` (`!cidr:<except>`): a group
            // prefix within one is left out whole, one around it loses that part.
            if g.except.iter().any(|e| e.contains(&cidr)) {
                continue;
            }
            let except = g.except.iter().filter(|e| cidr.contains(*e)).copied();
            let block = CidrBlock {
                cidr,
                except: except.collect(),
            };
            set.prefixes.extend(block_prefixes(&block));
            out.push(Peer::Selector(cidr_block(&block)?.and(world.clone())));
        }
    }
    for svc in r.services.iter().flatten() {
        for backends in deps.service_backends(svc) {
            match backends {
                Backends::Pods {
                    namespace,
                    selector,
                } => {
                    let mut reqs = Vec::new();
                    for (k, v) in &selector {
                        reqs.push(
                            Requirement::equals(&format!("k8s:{k}"), v)
                                .map_err(|e| e.to_string())?,
                        );
                    }
                    let pods = Selector::new(reqs).and(Selector::namespace(&namespace));
                    out.push(Peer::Selector(pods));
                }
                Backends::Addresses(addresses) => {
                    for a in addresses {
                        set.prefixes.push(a);
                        out.push(Peer::Selector(Selector::cidr(a).and(world.clone())));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// What an entity selects; `None` for `none`.
pub fn entity(e: Entity) -> Result<Option<Peer>, String> {
    let reserved = |name: &str| {
        Selector::reserved(name)
            .map(|s| Some(Peer::Selector(s)))
            .map_err(|e| e.to_string())
    };
    match e {
        Entity::All => Ok(Some(Peer::All)),
        Entity::None => Ok(None),
        Entity::Cluster => Ok(Some(Peer::Selector(Selector::new([absent(
            "reserved:world",
        )?])))),
        Entity::World => reserved("world"),
        // The halves of a dual-stack node's world: their reserved identities, and the CIDR
        // identities of their family (`Labels::for_cidr`).
        Entity::WorldIpv4 => reserved("world-ipv4"),
        Entity::WorldIpv6 => reserved("world-ipv6"),
        Entity::Host => reserved("host"),
        Entity::RemoteNode => reserved("remote-node"),
        Entity::KubeApiserver => reserved("kube-apiserver"),
        Entity::Health => reserved("health"),
        Entity::Init => reserved("init"),
        Entity::Unmanaged => reserved("unmanaged"),
        Entity::Ingress => reserved("ingress"),
    }
}

/// A `fromEndpoints`/`toEndpoints` selector with Cilium's namespace scoping.
fn endpoint_peer(ns: &str, sel: &LabelSelector) -> Result<Selector, String> {
    let out = selector(sel, str::to_string)?;
    let keys: Vec<&str> = sel
        .match_labels
        .keys()
        .map(String::as_str)
        .chain(sel.match_expressions.iter().map(|r| r.key.as_str()))
        .collect();
    if keys.iter().any(|k| k.starts_with("reserved:")) {
        return Ok(out);
    }
    let plain = |k: &str| -> String {
        k.strip_prefix("k8s:")
            .or_else(|| k.strip_prefix("any:"))
            .unwrap_or(k)
            .to_string()
    };
    let names_namespace = keys.iter().any(|k| plain(k) == POD_NAMESPACE_LABEL);
    if names_namespace {
        return Ok(out);
    }
    if ns.is_empty() {
        // Cluster-wide: endpoints of every namespace, but never the node or the world.
        return Ok(out.and(Selector::new([present(&format!(
            "k8s:{POD_NAMESPACE_LABEL}"
        ))?])));
    }
    let names_namespace_labels = keys
        .iter()
        .any(|k| plain(k).starts_with(NAMESPACE_LABELS_PREFIX));
    if names_namespace_labels {
        return Ok(out);
    }
    Ok(out.and(Selector::namespace(ns)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_labels::Labels;
    use cellium_resources::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy, Resources};

    fn policies(yaml: &str) -> Vec<RuleSet> {
        let r = Resources::new();
        r.apply(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
        )
        .unwrap();
        r.apply("p.yaml", yaml).unwrap();
        let mut out: Vec<RuleSet> = r
            .cilium_network_policies
            .list()
            .iter()
            .map(|p: &Arc<CiliumNetworkPolicy>| {
                translate(PolicyKind::CiliumNetworkPolicy, p, Some(&Deps::of(&r))).unwrap()
            })
            .collect();
        out.extend(r.cilium_clusterwide_network_policies.list().iter().map(
            |p: &Arc<CiliumClusterwideNetworkPolicy>| {
                translate(
                    PolicyKind::CiliumClusterwideNetworkPolicy,
                    p,
                    Some(&Deps::of(&r)),
                )
                .unwrap()
            },
        ));
        out
    }

    fn l(s: &str) -> Labels {
        s.parse().unwrap()
    }

    fn sel(p: &Peer) -> &Selector {
        match p {
            Peer::Selector(s) => s,
            Peer::All => panic!("a selector was expected"),
        }
    }

    #[test]
    fn namespaced_peers_stay_in_their_namespace_unless_they_say_otherwise() {
        let sets = policies(
            "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p, namespace: shop}\nspec:\n  endpointSelector: {matchLabels: {app: db}}\n  ingress:\n  - fromEndpoints: [{matchLabels: {app: web}}, {matchLabels: {'k8s:io.kubernetes.pod.namespace': dev}}, {matchLabels: {'reserved:host': ''}}]\n",
        );
        let rule = &sets[0].rules[0];
        let web_shop = l("k8s:app=web,k8s:io.kubernetes.pod.namespace=shop");
        let web_dev = l("k8s:app=web,k8s:io.kubernetes.pod.namespace=dev");
        assert!(sel(&rule.peers[0]).matches(&web_shop));
        assert!(!sel(&rule.peers[0]).matches(&web_dev));
        assert!(sel(&rule.peers[1]).matches(&web_dev));
        assert!(sel(&rule.peers[2]).matches(&l("reserved:host")));
        assert!(
            rule.subject
                .matches(&l("k8s:app=db,k8s:io.kubernetes.pod.namespace=shop"))
        );
        assert!(
            !rule
                .subject
                .matches(&l("k8s:app=db,k8s:io.kubernetes.pod.namespace=dev"))
        );
    }

    #[test]
    fn clusterwide_peers_are_pods_of_any_namespace_and_cidrs_are_external() {
        let sets = policies(
            "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: c}\nspec:\n  endpointSelector: {}\n  egress:\n  - toEndpoints: [{}]\n  - toCIDRSet: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16]}]\n  - toEntities: [cluster, all, none]\n  - toPorts: [{ports: [{port: '53', protocol: UDP}]}]\n  - {}\n",
        );
        let rules = &sets[0].rules;
        assert!(sel(&rules[0].peers[0]).matches(&l("k8s:io.kubernetes.pod.namespace=x")));
        assert!(!sel(&rules[0].peers[0]).matches(&l("reserved:host")));
        let cidr = sel(&rules[1].peers[0]);
        assert!(cidr.matches(&Labels::for_cidr("10.0.0.0/8".parse().unwrap())));
        assert!(!cidr.matches(&Labels::for_cidr("10.1.0.0/16".parse().unwrap())));
        let pod_in_block = l("k8s:io.kubernetes.pod.namespace=x,cidr:10.0.0.0/8");
        assert!(
            !cidr.matches(&pod_in_block),
            "Cilium CIDR rules never select pods"
        );
        assert_eq!(rules[2].peers.len(), 2);
        assert!(sel(&rules[2].peers[0]).matches(&l("reserved:host")));
        assert!(!sel(&rules[2].peers[0]).matches(&l("reserved:world")));
        assert_eq!(rules[2].peers[1], Peer::All);
        assert_eq!(rules[3].peers, vec![Peer::All]);
        assert!(rules[4].peers.is_empty());
        assert_eq!(sets[0].prefixes.len(), 2);
        assert!(!sets[0].prefixes_cover_pods);
    }

    #[test]
    fn the_world_splits_by_family_as_on_a_dual_stack_node() {
        let sets = policies(
            "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p, namespace: shop}\nspec:\n  endpointSelector: {}\n  egress: [{toEntities: [world, world-ipv4, world-ipv6, cluster]}]\n",
        );
        let peers = &sets[0].rules[0].peers;
        let (world, v4, v6, cluster) = (
            sel(&peers[0]),
            sel(&peers[1]),
            sel(&peers[2]),
            sel(&peers[3]),
        );
        let (w, w4, w6) = (
            l("reserved:world"),
            l("reserved:world,reserved:world-ipv4"),
            l("reserved:world,reserved:world-ipv6"),
        );
        let (c4, c6) = (
            Labels::for_cidr("192.0.2.0/24".parse().unwrap()),
            Labels::for_cidr("2001:db8::/32".parse().unwrap()),
        );
        for any in [&w, &w4, &w6, &c4, &c6] {
            assert!(world.matches(any), "world selects {any}");
            assert!(!cluster.matches(any), "cluster selects {any}");
        }
        assert!(v4.matches(&w4) && v4.matches(&c4) && !v4.matches(&w6) && !v4.matches(&c6));
        assert!(v6.matches(&w6) && v6.matches(&c6) && !v6.matches(&w4) && !v6.matches(&c4));
        assert!(!v6.matches(&w), "world (2) is no family's half");
    }

    #[test]
    fn services_and_cidr_groups_resolve_from_the_tables() {
        let r = Resources::new();
        r.apply(
            "objs.yaml",
            r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop, labels: {tier: data}}
spec: {selector: {app: db}, ports: [{port: 5432}]}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: shop, labels: {tier: data}}
spec: {ports: [{port: 443}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-1, namespace: shop, labels: {kubernetes.io/service-name: ext}}
addressType: IPv4
endpoints: [{addresses: [192.0.2.10]}, {addresses: [192.0.2.11]}, {addresses: [192.0.2.12], conditions: {ready: false}}]
ports: [{port: 443}]
---
apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata: {name: vpn, labels: {role: vpn}}
spec: {externalCIDRs: [10.48.0.0/24, 10.16.0.0/24]}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: shop}
spec:
  endpointSelector: {}
  labels: [{key: owner, value: shop}]
  egress:
  - toServices: [{k8sService: {serviceName: db}}]
    toPorts: [{ports: [{port: "5432", protocol: TCP}]}]
  - toServices: [{k8sService: {serviceName: ext}}]
  - toServices: [{k8sServiceSelector: {selector: {matchLabels: {tier: data}}}}]
  - toServices: [{k8sService: {serviceName: missing}}]
  - toCIDRSet: [{cidrGroupRef: vpn, except: [10.48.0.128/25]}]
  - toCIDRSet: [{cidrGroupSelector: {matchLabels: {role: vpn}}}, {cidrGroupRef: later}]
"#,
        )
        .unwrap();
        let p = r.cilium_network_policies.list();
        let deps = Deps::of(&r);
        let set = translate(PolicyKind::CiliumNetworkPolicy, &p[0], Some(&deps)).unwrap();
        let rules = &set.rules;
        assert_eq!(rules[0].labels, [":owner=shop"]);
        // A service with a selector: its pods, in its namespace.
        assert_eq!(rules[0].peers.len(), 1);
        let db = sel(&rules[0].peers[0]);
        assert!(db.matches(&l("k8s:app=db,k8s:io.kubernetes.pod.namespace=shop")));
        assert!(!db.matches(&l("k8s:app=db,k8s:io.kubernetes.pod.namespace=dev")));
        assert_eq!(rules[0].ports.len(), 1);
        // Without one: the addresses of its slices' ready endpoints, as external prefixes.
        assert_eq!(rules[1].peers.len(), 2);
        let ext = sel(&rules[1].peers[0]);
        assert!(ext.matches(&Labels::for_cidr("192.0.2.10/32".parse().unwrap())));
        assert!(!ext.matches(&l(
            "k8s:io.kubernetes.pod.namespace=shop,cidr:192.0.2.10/32"
        )));
        // By label: both services.
        assert_eq!(rules[2].peers.len(), 3);
        // A service that does not exist: nothing.
        assert!(rules[3].peers.is_empty());
        // A group: its prefixes less the exception inside one of them.
        assert_eq!(rules[4].peers.len(), 2);
        let in_group = |peers: &[Peer], prefix: &str| {
            let labels = Labels::for_cidr(prefix.parse().unwrap());
            let with_outer = {
                let mut l = labels.clone();
                for outer in ["10.48.0.0/24", "10.16.0.0/24"] {
                    let outer: ipnet::IpNet = outer.parse().unwrap();
                    if outer.contains(&prefix.parse::<ipnet::IpNet>().unwrap()) {
                        l.insert(cellium_labels::Label::cidr(outer));
                    }
                }
                l
            };
            peers.iter().any(|p| sel(p).matches(&with_outer))
        };
        assert!(in_group(&rules[4].peers, "10.48.0.0/24"));
        assert!(in_group(&rules[4].peers, "10.16.0.0/24"));
        assert!(!in_group(&rules[4].peers, "10.48.0.128/25"));
        // By label, and a group that does not exist yet (nothing).
        assert_eq!(rules[5].peers.len(), 2);
        for prefix in [
            "10.48.0.0/24",
            "10.16.0.0/24",
            "10.48.0.128/25",
            "192.0.2.10/32",
        ] {
            assert!(
                set.prefixes.contains(&prefix.parse().unwrap()),
                "{prefix}: {:?}",
                set.prefixes
            );
        }
        // Without the tables, groups and services select nothing.
        let set = translate(PolicyKind::CiliumNetworkPolicy, &p[0], None).unwrap();
        assert!(set.rules.iter().all(|r| r.peers.is_empty()));
    }

    /// Cilium 1.18's matching: a `toServices` item without a namespace names services of
    /// every namespace; an `except` around a group prefix leaves that prefix out whole.
    #[test]
    fn service_items_without_a_namespace_and_excepts_around_group_prefixes() {
        let sets = policies(
            r#"
apiVersion: v1
kind: Namespace
metadata: {name: dev}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: dev, labels: {tier: data}}
spec: {selector: {app: db}, ports: [{port: 5432}]}
---
apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata: {name: vpn}
spec: {externalCIDRs: [10.48.0.0/24, 10.16.0.0/24]}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p, namespace: shop}
spec:
  endpointSelector: {}
  egress:
  - toServices: [{k8sService: {serviceName: db}}]
  - toServices: [{k8sServiceSelector: {selector: {matchLabels: {tier: data}}}}]
  - toServices: [{k8sService: {serviceName: db, namespace: shop}}]
  - toCIDRSet: [{cidrGroupRef: vpn, except: [10.48.0.0/16]}]
"#,
        );
        let rules = &sets[0].rules;
        let db_in_dev = l("k8s:app=db,k8s:io.kubernetes.pod.namespace=dev");
        for r in &rules[..2] {
            assert_eq!(r.peers.len(), 1, "{:?}", r.peers);
            assert!(sel(&r.peers[0]).matches(&db_in_dev));
        }
        assert!(rules[2].peers.is_empty(), "no service db in shop");
        let peers = &rules[3].peers;
        assert_eq!(peers.len(), 1, "{peers:?}");
        let in_prefix = |p: &str| sel(&peers[0]).matches(&Labels::for_cidr(p.parse().unwrap()));
        assert!(in_prefix("10.16.0.0/24"));
        assert!(!in_prefix("10.48.0.0/24"), "inside the except");
    }

    #[test]
    fn default_deny_follows_the_rule() {
        let sets = policies(
            "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p, namespace: shop}\nspec:\n  endpointSelector: {}\n  ingressDeny: [{fromEntities: [world]}]\n  enableDefaultDeny: {ingress: false}\n",
        );
        assert!(sets[0].enforce.is_empty());
        assert_eq!(sets[0].rules[0].verdict, Verdict::Deny);
    }
}

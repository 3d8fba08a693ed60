//! Kubernetes NetworkPolicy, with the semantics the upstream network-policy e2e suite
//! expects.
//!
//! - `podSelector` selects pods of the policy's namespace; a selected pod is default-deny in
//!   each of the policy's `policyTypes`, even when the matching rule list is absent.
//! - Peers: `podSelector` alone = pods of the policy's namespace; `namespaceSelector` alone =
//!   every pod of the matching namespaces; both in one peer = pods matching both; `ipBlock` =
//!   addresses inside the block and outside its exceptions, pods included (their identities
//!   carry the `cidr:` labels of the blocks covering their address). An empty `from`/`to`
//!   is every peer.
//! - Ports: absent or empty = every port and protocol; by number, range (`endPort`) or name.
//! - Keys of Kubernetes selectors are `k8s:` labels; namespace labels are matched through
//!   the `io.cilium.k8s.namespace.labels.` labels every pod identity carries.

use std::sync::Arc;

use cellium_labels::{NAMESPACE_LABELS_PREFIX, POD_NAMESPACE_LABEL, Selector};
use cellium_policy::{Direction, Verdict};
use cellium_resources::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyRule, PolicyType};

use crate::rule::{Enforcement, Origin, Peer, PolicyKind, Rule, RuleSet};
use crate::translate::{block_prefixes, cidr_block, ports, present, selector};

/// Translates one NetworkPolicy.
pub fn translate(np: &NetworkPolicy) -> Result<RuleSet, String> {
    let origin = Arc::new(Origin {
        kind: PolicyKind::NetworkPolicy,
        namespace: np.namespace.clone(),
        name: np.name.clone(),
        audit: np.audit,
        log: None,
    });
    let subject = pod_selector(&np.pod_selector)
        .map_err(|e| format!("spec.podSelector: {e}"))?
        .and(Selector::namespace(&np.namespace));
    let mut set = RuleSet {
        prefixes_cover_pods: true,
        ..RuleSet::default()
    };
    for (t, direction, rules, field) in [
        (
            PolicyType::Ingress,
            Direction::Ingress,
            &np.ingress,
            "ingress",
        ),
        (PolicyType::Egress, Direction::Egress, &np.egress, "egress"),
    ] {
        if !np.restricts(t) {
            continue;
        }
        set.enforce.push(Enforcement {
            origin: origin.clone(),
            subject: subject.clone(),
            direction,
            labels: Vec::new(),
        });
        for (i, r) in rules.iter().enumerate() {
            let peers = peers(np, r, &mut set).map_err(|e| format!("spec.{field}[{i}]: {e}"))?;
            set.rules.push(Rule {
                origin: origin.clone(),
                subject: subject.clone(),
                direction,
                verdict: Verdict::Allow,
                peers,
                ports: ports(&r.ports),
                labels: Vec::new(),
            });
        }
    }
    set.prefixes.sort();
    set.prefixes.dedup();
    Ok(set)
}

fn peers(
    np: &NetworkPolicy,
    r: &NetworkPolicyRule,
    set: &mut RuleSet,
) -> Result<Vec<Peer>, String> {
    if r.peers.is_empty() {
        return Ok(vec![Peer::All]);
    }
    let mut out = Vec::new();
    for p in &r.peers {
        let sel = match p {
            NetworkPolicyPeer::Pods {
                pod_selector: pods,
                namespace_selector: None,
            } => {
                let pods = pods
                    .as_ref()
                    .map(pod_selector)
                    .transpose()?
                    .unwrap_or_default();
                pods.and(Selector::namespace(&np.namespace))
            }
            NetworkPolicyPeer::Pods {
                pod_selector: pods,
                namespace_selector: Some(ns),
            } => {
                let pods = pods
                    .as_ref()
                    .map(pod_selector)
                    .transpose()?
                    .unwrap_or_default();
                let ns = selector(ns, |k| format!("k8s:{NAMESPACE_LABELS_PREFIX}{k}"))?;
                // Only pods carry a namespace: without this, `namespaceSelector: {}` would
                // match the node and the world too.
                let is_pod = Selector::new([present(&format!("k8s:{POD_NAMESPACE_LABEL}"))?]);
                pods.and(ns).and(is_pod)
            }
            NetworkPolicyPeer::IpBlock(block) => {
                set.prefixes.extend(block_prefixes(block));
                cidr_block(block)?
            }
        };
        out.push(Peer::Selector(sel));
    }
    Ok(out)
}

fn pod_selector(sel: &cellium_resources::LabelSelector) -> Result<Selector, String> {
    selector(sel, |k| format!("k8s:{k}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_labels::Labels;
    use std::collections::BTreeMap;

    fn np(spec: &str) -> NetworkPolicy {
        let yaml = format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: np, namespace: shop}}\nspec: {spec}"
        );
        NetworkPolicy::from_k8s(serde_yaml::from_str(&yaml).unwrap()).unwrap()
    }

    fn pod(ns: &str, labels: &[(&str, &str)], ns_labels: &[(&str, &str)]) -> Labels {
        let m = |l: &[(&str, &str)]| -> BTreeMap<String, String> {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Labels::for_pod(ns, &m(labels), &m(ns_labels))
    }

    #[test]
    fn absent_rules_enforce_and_allow_nothing() {
        let set = translate(&np("{podSelector: {}, policyTypes: [Ingress, Egress]}")).unwrap();
        assert_eq!(set.enforce.len(), 2);
        assert!(set.rules.is_empty());
        assert!(set.enforce[0].subject.matches(&pod("shop", &[], &[])));
        assert!(!set.enforce[0].subject.matches(&pod("dev", &[], &[])));
    }

    #[test]
    fn peer_shapes() {
        let set = translate(&np(
            "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: web}}}, {namespaceSelector: {matchLabels: {team: a}}}, {podSelector: {matchLabels: {app: web}}, namespaceSelector: {matchLabels: {team: a}}}]}, {}]}",
        ))
        .unwrap();
        let sel = |i: usize| match &set.rules[0].peers[i] {
            Peer::Selector(s) => s.clone(),
            Peer::All => panic!("a selector was expected"),
        };
        let web_shop = pod("shop", &[("app", "web")], &[]);
        let web_dev_a = pod("dev", &[("app", "web")], &[("team", "a")]);
        let api_dev_a = pod("dev", &[("app", "api")], &[("team", "a")]);
        assert!(sel(0).matches(&web_shop) && !sel(0).matches(&web_dev_a));
        assert!(sel(1).matches(&web_dev_a) && sel(1).matches(&api_dev_a));
        assert!(!sel(1).matches(&web_shop));
        assert!(sel(2).matches(&web_dev_a) && !sel(2).matches(&api_dev_a));
        assert!(!sel(1).matches(&"reserved:host".parse().unwrap()));
        assert_eq!(set.rules[1].peers, vec![Peer::All]);
        assert!(
            set.rules[0]
                .subject
                .matches(&pod("shop", &[("app", "db")], &[]))
        );
    }

    #[test]
    fn ip_blocks_name_their_prefixes() {
        let set = translate(&np(
            "{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]}]}",
        ))
        .unwrap();
        let prefixes: Vec<String> = set.prefixes.iter().map(ToString::to_string).collect();
        assert_eq!(prefixes, vec!["10.0.0.0/8", "10.1.0.0/16"]);
        assert!(set.prefixes_cover_pods);
        assert_eq!(
            set.enforce.len(),
            2,
            "egress rules default policyTypes to both"
        );
    }
}

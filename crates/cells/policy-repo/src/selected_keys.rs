//! The pod label keys policies select on, so that the label filter keeps them.
//!
//! The label filter drops keys that differ from pod to pod (`statefulset.kubernetes.io/pod-name`,
//! `pod-template-hash`, `controller-uid`, ...), so that pods of one workload share an
//! identity. A selector on such a key would then match nothing, silently (a default deny on
//! `statefulset.kubernetes.io/pod-name: db-0` would never apply). The repository keeps
//! the keys its rules' selectors read (subjects, default-deny subjects and peers), with the
//! namespaces they can matter in and the policies that read them; the endpoint manager keeps
//! a pod label whose key is selected in its pod's namespace although the filter drops it.

use std::collections::{BTreeMap, BTreeSet};

use cellium_labels::{Labels, POD_NAMESPACE_LABEL, Selector, is_relevant_pod_label, source};

use crate::rule::{Origin, Peer, RuleSet, namespace_of};

/// Who reads one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUse {
    /// The pod namespaces the key matters in: those every selector reading it requires
    /// (a namespaced policy's `podSelector`); `None` when some selector may match pods of
    /// any namespace (a `namespaceSelector` peer, a cluster-wide policy).
    pub namespaces: Option<BTreeSet<String>>,
    /// The policies whose selectors read it.
    pub policies: BTreeSet<Origin>,
}

/// The `k8s:` label keys the repository's selectors read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectedKeys(BTreeMap<String, KeyUse>);

impl SelectedKeys {
    /// The keys the selectors of `sets` read.
    pub(crate) fn of<'a>(sets: impl IntoIterator<Item = (Origin, &'a RuleSet)>) -> SelectedKeys {
        let mut keys = SelectedKeys::default();
        for (origin, set) in sets {
            let subjects = set
                .enforce
                .iter()
                .map(|e| &e.subject)
                .chain(set.rules.iter().map(|r| &r.subject));
            let peers = set.rules.iter().flat_map(|r| {
                r.peers.iter().filter_map(|p| match p {
                    Peer::Selector(s) => Some(s),
                    Peer::All => None,
                })
            });
            for selector in subjects.chain(peers) {
                keys.add(&origin, selector);
            }
        }
        keys
    }

    fn add(&mut self, origin: &Origin, selector: &Selector) {
        let namespace = namespace_of(selector);
        for key in selector.k8s_keys() {
            let used = self.0.entry(key.to_string()).or_insert_with(|| KeyUse {
                namespaces: Some(BTreeSet::new()),
                policies: BTreeSet::new(),
            });
            used.policies.insert(origin.clone());
            match (namespace, &mut used.namespaces) {
                (Some(ns), Some(namespaces)) => {
                    namespaces.insert(ns.to_string());
                }
                (None, namespaces) => *namespaces = None,
                (Some(_), None) => {}
            }
        }
    }

    /// Whether some selector reads the pod label `key` of a pod in `namespace`.
    pub fn selects(&self, key: &str, namespace: &str) -> bool {
        self.0.get(key).is_some_and(|u| match &u.namespaces {
            None => true,
            Some(namespaces) => namespaces.contains(namespace),
        })
    }

    /// Every key with who reads it, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &KeyUse)> {
        self.0.iter().map(|(k, u)| (k.as_str(), u))
    }
}

/// A `k8s:` label key as `cellium identity list --keys` shows it: why identities keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelKeyInfo {
    /// The key, without its source.
    pub key: String,
    /// `derived`, `filter`, `policy` or `-` (see [`kept_by`]).
    pub kept_by: &'static str,
    /// Who reads it, when a selector does.
    pub used: Option<KeyUse>,
    /// How many identities hold a label with it.
    pub identities: usize,
}

/// Why identities keep a `k8s:` label key: `derived` for the labels the agent derives (the
/// pod's namespace, its namespace's labels, its ServiceAccount and cluster, all under
/// `io.cilium.k8s.` which pods may not set), `filter` when the label filter keeps it,
/// `policy` when the filter drops it but a selector reads it, `-` when neither (identities
/// holding it then are about to change, or were allocated elsewhere).
pub fn kept_by(key: &str, selected: bool) -> &'static str {
    if key == POD_NAMESPACE_LABEL || key.starts_with("io.cilium.k8s.") {
        "derived"
    } else if is_relevant_pod_label(key) {
        "filter"
    } else if selected {
        "policy"
    } else {
        "-"
    }
}

/// The keys of the `k8s:` labels of `identities` and those `selected`, sorted, each with why
/// it is kept.
pub(crate) fn label_keys<'a>(
    identities: impl IntoIterator<Item = &'a Labels>,
    selected: &SelectedKeys,
) -> Vec<LabelKeyInfo> {
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for labels in identities {
        for label in labels.iter().filter(|l| l.source == source::K8S) {
            *held.entry(label.key.as_str()).or_default() += 1;
        }
    }
    for key in selected.0.keys() {
        held.entry(key.as_str()).or_default();
    }
    held.into_iter()
        .map(|(key, identities)| {
            let used = selected.0.get(key).cloned();
            LabelKeyInfo {
                key: key.to_string(),
                kept_by: kept_by(key, used.is_some()),
                used,
                identities,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use cellium_policy::Direction;

    use super::*;
    use crate::rule::Enforcement;

    fn origin(namespace: &str, name: &str) -> Origin {
        Origin {
            kind: crate::rule::PolicyKind::NetworkPolicy,
            namespace: namespace.into(),
            name: name.into(),
            audit: false,
            log: None,
        }
    }

    fn deny_all(subject: &str) -> RuleSet {
        RuleSet {
            enforce: vec![Enforcement {
                origin: std::sync::Arc::new(origin("shop", "deny-all")),
                subject: subject.parse().unwrap(),
                direction: Direction::Ingress,
                labels: Vec::new(),
            }],
            ..RuleSet::default()
        }
    }

    #[test]
    fn a_namespaced_subject_selects_its_keys_in_its_namespace_only() {
        let set = deny_all(
            "k8s:io.kubernetes.pod.namespace=shop,k8s:statefulset.kubernetes.io/pod-name=db-0",
        );
        let keys = SelectedKeys::of([(origin("shop", "db"), &set)]);
        assert!(keys.selects("statefulset.kubernetes.io/pod-name", "shop"));
        assert!(!keys.selects("statefulset.kubernetes.io/pod-name", "dev"));
        assert!(!keys.selects("pod-template-hash", "shop"));
        let (_, used) = keys
            .iter()
            .find(|(k, _)| *k == "statefulset.kubernetes.io/pod-name")
            .unwrap();
        assert_eq!(
            used.policies
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>(),
            ["NetworkPolicy shop/db"]
        );
    }

    #[test]
    fn a_selector_of_any_namespace_selects_its_keys_everywhere() {
        let scoped = deny_all("k8s:io.kubernetes.pod.namespace=shop,any:controller-uid=x");
        let global = deny_all("k8s:controller-uid=x");
        let keys = SelectedKeys::of([(origin("shop", "a"), &scoped), (origin("", "b"), &global)]);
        assert!(keys.selects("controller-uid", "dev"));
        let (_, used) = keys.iter().find(|(k, _)| *k == "controller-uid").unwrap();
        assert_eq!(used.namespaces, None);
        assert_eq!(used.policies.len(), 2);
        // No selector, no key.
        assert_eq!(SelectedKeys::of([]), SelectedKeys::default());
    }

    #[test]
    fn each_key_says_why_it_is_kept() {
        let set = deny_all(
            "k8s:io.kubernetes.pod.namespace=shop,k8s:statefulset.kubernetes.io/pod-name=db-0,k8s:app=db",
        );
        let keys = SelectedKeys::of([(origin("shop", "db"), &set)]);
        let held: Labels = "k8s:app=db,k8s:io.kubernetes.pod.namespace=shop,k8s:io.cilium.k8s.policy.cluster=c1,k8s:pod-template-hash=1,reserved:host"
            .parse()
            .unwrap();
        let got: Vec<(String, &str, usize)> = label_keys([&held], &keys)
            .into_iter()
            .map(|k| (k.key, k.kept_by, k.identities))
            .collect();
        let want = [
            ("app", "filter", 1),
            ("io.cilium.k8s.policy.cluster", "derived", 1),
            ("io.kubernetes.pod.namespace", "derived", 1),
            ("pod-template-hash", "-", 1),
            ("statefulset.kubernetes.io/pod-name", "policy", 0),
        ];
        assert_eq!(
            got,
            want.map(|(k, why, n)| (k.to_string(), why, n)).to_vec()
        );
    }
}

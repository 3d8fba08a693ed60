//! A set of labels: what a security identity is made of.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::btree_set;
use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};
use crate::filter;
use crate::label::{Label, source};

/// The key of the label that carries a pod's namespace (`k8s:io.kubernetes.pod.namespace`).
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";

/// The prefix under which a namespace's own labels are copied into its pods' labels
/// (`k8s:io.cilium.k8s.namespace.labels.team=a`).
pub const NAMESPACE_LABELS_PREFIX: &str = "io.cilium.k8s.namespace.labels.";

/// The key of the label that carries a pod's ServiceAccount
/// (`k8s:io.cilium.k8s.policy.serviceaccount=<name>`), as Cilium derives it from
/// `spec.serviceAccountName`.
pub const POLICY_SERVICE_ACCOUNT_LABEL: &str = "io.cilium.k8s.policy.serviceaccount";

/// The key of the label that carries a pod's cluster (`k8s:io.cilium.k8s.policy.cluster=<name>`,
/// the agent's `cluster-name`), as Cilium derives it.
pub const POLICY_CLUSTER_LABEL: &str = "io.cilium.k8s.policy.cluster";

/// Pod label keys under Cilium's own prefix: a pod may not set them, or it could claim
/// another namespace's labels or a policy's and be selected as if it had them.
const POD_FORBIDDEN_PREFIX: &str = "io.cilium.k8s.";

/// A canonical set of labels: sorted, at most one value per source and key.
///
/// Two sets with the same labels are equal and hash alike whatever order they were built
/// in, so a `Labels` is a map key (the identity allocator's). Displayed and parsed as the
/// sorted labels joined by commas (`k8s:app=web,k8s:io.kubernetes.pod.namespace=shop`);
/// serialized as a list of label strings.
///
/// ```
/// use std::collections::BTreeMap;
/// use cellium_labels::Labels;
///
/// let pod = BTreeMap::from([
///     ("app".to_string(), "web".to_string()),
///     ("pod-template-hash".to_string(), "5d8f7".to_string()),
/// ]);
/// let ns = BTreeMap::from([("team".to_string(), "a".to_string())]);
/// let labels = Labels::for_pod("shop", &pod, &ns);
/// assert_eq!(
///     labels.to_string(),
///     "k8s:app=web,k8s:io.cilium.k8s.namespace.labels.team=a,k8s:io.kubernetes.pod.namespace=shop"
/// );
/// assert_eq!(labels, labels.to_string().parse()?);
/// # Ok::<(), cellium_labels::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(BTreeSet<Label>);

impl Labels {
    /// The empty set.
    pub fn new() -> Labels {
        Labels::default()
    }

    /// The security-relevant labels of a pod in `namespace`, as Cilium derives them: each
    /// pod label as `k8s:<key>=<value>` except those Cilium's default filter ignores
    /// (`pod-template-hash`, `controller-revision-hash`, `statefulset.kubernetes.io/pod-name`,
    /// `controller-uid`, `kubernetes.io/...`, ...), `k8s:io.kubernetes.pod.namespace=<namespace>`,
    /// and each namespace label as `k8s:io.cilium.k8s.namespace.labels.<key>=<value>`.
    ///
    /// Pod labels under `io.cilium.k8s.` are dropped: they would let a pod pose as a member
    /// of another namespace.
    pub fn for_pod(
        namespace: &str,
        pod_labels: &BTreeMap<String, String>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Labels {
        Labels::for_pod_keeping(namespace, pod_labels, namespace_labels, |_| false)
    }

    /// [`Labels::for_pod`], also keeping each pod label whose key the label filter ignores but
    /// `selected` names: the keys some policy selects on, which would otherwise select
    /// nothing. Labels under `io.cilium.k8s.` stay dropped whatever `selected` says.
    pub fn for_pod_keeping(
        namespace: &str,
        pod_labels: &BTreeMap<String, String>,
        namespace_labels: &BTreeMap<String, String>,
        selected: impl Fn(&str) -> bool,
    ) -> Labels {
        let mut labels = Labels::new();
        for (key, value) in pod_labels {
            if (filter::is_relevant(key) || selected(key))
                && key != POD_NAMESPACE_LABEL
                && !key.starts_with(POD_FORBIDDEN_PREFIX)
            {
                labels.insert(Label::k8s(key, value));
            }
        }
        labels.insert(Label::k8s(POD_NAMESPACE_LABEL, namespace));
        for (key, value) in namespace_labels {
            labels.insert(Label::k8s(format!("{NAMESPACE_LABELS_PREFIX}{key}"), value));
        }
        labels
    }

    /// The labels of a prefix's identity: `cidr:<prefix>`, `reserved:world` and
    /// `reserved:world-ipv4` (or `-ipv6`), so that selecting the world, or the world of one
    /// family, also selects every CIDR identity of it.
    pub fn for_cidr(net: IpNet) -> Labels {
        let family = match net {
            IpNet::V4(_) => "world-ipv4",
            IpNet::V6(_) => "world-ipv6",
        };
        [
            Label::cidr(net),
            Label::reserved("world"),
            Label::reserved(family),
        ]
        .into_iter()
        .collect()
    }

    /// Adds `label`, replacing the label of the same source and key if there is one (which
    /// is returned).
    pub fn insert(&mut self, label: Label) -> Option<Label> {
        let old = self.remove(&label.source, &label.key);
        self.0.insert(label);
        old
    }

    /// Removes the label of `source` and `key`.
    pub fn remove(&mut self, source: &str, key: &str) -> Option<Label> {
        let found = self.get(source, key)?.clone();
        self.0.take(&found)
    }

    /// The label of `source` and `key`.
    pub fn get(&self, source: &str, key: &str) -> Option<&Label> {
        // A scan of the sorted set, not a range from a probe label: sets are small (a pod's
        // labels and its namespace's), and building the probe cost three allocations on every
        // selector match.
        self.0
            .iter()
            .find(|l| (l.source.as_str(), l.key.as_str()) >= (source, key))
            .filter(|l| l.source == source && l.key == key)
    }

    /// Whether the set holds exactly `label`.
    pub fn contains(&self, label: &Label) -> bool {
        self.0.contains(label)
    }

    /// Whether some label has `source`.
    pub fn has_source(&self, source: &str) -> bool {
        self.0.iter().any(|l| l.source == source)
    }

    /// Whether the set holds a `cidr:` label: such sets get node-local identities.
    pub fn has_cidr(&self) -> bool {
        self.has_source(source::CIDR)
    }

    /// The set without its `cidr:` labels: a pod's labels as the cluster knows them, whatever
    /// ipBlocks of one node's policies cover its address.
    pub fn without_cidr(&self) -> Labels {
        Labels(
            self.0
                .iter()
                .filter(|l| l.source != source::CIDR)
                .cloned()
                .collect(),
        )
    }

    /// The labels, sorted.
    pub fn iter(&self) -> btree_set::Iter<'_, Label> {
        self.0.iter()
    }

    /// How many labels there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each label as text, sorted.
    pub fn to_strings(&self) -> Vec<String> {
        self.0.iter().map(Label::to_string).collect()
    }
}

impl FromIterator<Label> for Labels {
    /// Collects labels; a later label replaces an earlier one of the same source and key.
    fn from_iter<I: IntoIterator<Item = Label>>(iter: I) -> Labels {
        let mut labels = Labels::new();
        labels.extend(iter);
        labels
    }
}

impl Extend<Label> for Labels {
    fn extend<I: IntoIterator<Item = Label>>(&mut self, iter: I) {
        for label in iter {
            self.insert(label);
        }
    }
}

impl IntoIterator for Labels {
    type Item = Label;
    type IntoIter = btree_set::IntoIter<Label>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = &'a Label;
    type IntoIter = btree_set::Iter<'a, Label>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, label) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{label}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Labels({self})")
    }
}

impl FromStr for Labels {
    type Err = Error;

    /// Reads labels joined by commas (spaces around them are ignored; the empty text is the
    /// empty set). The same source and key twice with different values is an error.
    fn from_str(text: &str) -> Result<Labels> {
        let mut labels = Labels::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let label: Label = part.parse()?;
            if let Some(old) = labels.insert(label.clone())
                && old != label
            {
                return Err(Error::DuplicateKey {
                    key: format!("{}:{}", label.source, label.key),
                    text: text.to_string(),
                });
            }
        }
        Ok(labels)
    }
}

impl Serialize for Labels {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Labels, D::Error> {
        let list = Vec::<Label>::deserialize(d)?;
        Ok(list.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_key_the_filter_ignores_is_kept_while_selected() {
        let pod = map(&[
            ("app", "db"),
            ("statefulset.kubernetes.io/pod-name", "db-0"),
            ("pod-template-hash", "5d8f7"),
            ("io.cilium.k8s.namespace.labels.team", "forged"),
        ]);
        let ns = map(&[("team", "a")]);
        let plain = Labels::for_pod("shop", &pod, &ns);
        assert_eq!(plain, Labels::for_pod_keeping("shop", &pod, &ns, |_| false));
        assert!(
            plain
                .get(source::K8S, "statefulset.kubernetes.io/pod-name")
                .is_none()
        );
        let kept = Labels::for_pod_keeping("shop", &pod, &ns, |k| {
            k == "statefulset.kubernetes.io/pod-name" || k.starts_with("io.cilium.k8s.")
        });
        assert_eq!(
            kept.to_string(),
            "k8s:app=db,k8s:io.cilium.k8s.namespace.labels.team=a,\
k8s:io.kubernetes.pod.namespace=shop,k8s:statefulset.kubernetes.io/pod-name=db-0",
            "the selected key is kept, the unselected hash is not, Cilium's prefix never is"
        );
    }

    #[test]
    fn order_of_construction_does_not_matter() {
        let a: Labels = "k8s:b=2,k8s:a=1".parse().unwrap();
        let b: Labels = [Label::k8s("a", "1"), Label::k8s("b", "2")]
            .into_iter()
            .collect();
        assert_eq!(a, b);
        let hash = |l: &Labels| {
            use std::hash::{BuildHasher, RandomState};
            let s = RandomState::new();
            (s.hash_one(l), s.hash_one(l.clone()))
        };
        let (ha, hb) = hash(&a);
        assert_eq!(ha, hb);
        assert_eq!(a.to_string(), "k8s:a=1,k8s:b=2");
    }

    #[test]
    fn get_finds_a_key_under_its_source_only() {
        let l: Labels = "cidr:10.0.0.0/8,k8s:app=web,k8s:apps=x,k8s:b=,reserved:world,unspec:app=u"
            .parse()
            .unwrap();
        assert_eq!(l.get("k8s", "app").map(|l| l.value.as_str()), Some("web"));
        assert_eq!(l.get("unspec", "app").map(|l| l.value.as_str()), Some("u"));
        assert_eq!(l.get("k8s", "b").map(|l| l.value.as_str()), Some(""));
        assert!(l.get("reserved", "world").is_some());
        assert!(l.get("k8s", "ap").is_none());
        assert!(l.get("k8s", "c").is_none());
        assert!(l.get("any", "app").is_none());
        assert!(Labels::new().get("k8s", "app").is_none());
    }

    #[test]
    fn one_value_per_source_and_key() {
        let mut l: Labels = "k8s:app=a".parse().unwrap();
        assert_eq!(
            l.insert(Label::k8s("app", "b")),
            Some(Label::k8s("app", "a"))
        );
        assert_eq!(l.insert(Label::new("unspec", "app", "c")), None);
        assert_eq!(l.len(), 2);
        assert_eq!(l.get("k8s", "app").map(|l| l.value.as_str()), Some("b"));
        let err = "k8s:app=a, k8s:app=b".parse::<Labels>().unwrap_err();
        assert!(matches!(err, Error::DuplicateKey { .. }), "{err}");
        assert_eq!("k8s:app=a,k8s:app=a".parse::<Labels>().unwrap().len(), 1);
    }

    #[test]
    fn text_and_serde_round_trip() {
        let l: Labels = " reserved:host , k8s:app=web ".parse().unwrap();
        assert_eq!(l.to_string(), "k8s:app=web,reserved:host");
        assert_eq!(l.to_string().parse::<Labels>().unwrap(), l);
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, r#"["k8s:app=web","reserved:host"]"#);
        assert_eq!(serde_json::from_str::<Labels>(&json).unwrap(), l);
        assert!("".parse::<Labels>().unwrap().is_empty());
        assert!("k8s:app=web,=x".parse::<Labels>().is_err());
    }

    #[test]
    fn pod_labels_follow_cilium() {
        let pod = map(&[
            ("app", "web"),
            ("pod-template-hash", "abc"),
            ("controller-revision-hash", "x"),
            ("statefulset.kubernetes.io/pod-name", "web-0"),
            ("app.kubernetes.io/name", "web"),
        ]);
        let ns = map(&[("kubernetes.io/metadata.name", "shop"), ("team", "a")]);
        let l = Labels::for_pod("shop", &pod, &ns);
        assert_eq!(
            l.to_strings(),
            vec![
                "k8s:app=web",
                "k8s:app.kubernetes.io/name=web",
                "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop",
                "k8s:io.cilium.k8s.namespace.labels.team=a",
                "k8s:io.kubernetes.pod.namespace=shop",
            ]
        );
    }

    #[test]
    fn a_pod_cannot_claim_another_namespace() {
        let pod = map(&[
            ("io.kubernetes.pod.namespace", "kube-system"),
            ("io.cilium.k8s.namespace.labels.team", "admins"),
            ("io.cilium.k8s.policy.serviceaccount", "root"),
        ]);
        let l = Labels::for_pod("shop", &pod, &BTreeMap::new());
        assert_eq!(l.to_string(), "k8s:io.kubernetes.pod.namespace=shop");
    }

    #[test]
    fn cidr_sets_carry_the_world_of_their_family() {
        let l = Labels::for_cidr("10.0.0.0/8".parse().unwrap());
        assert_eq!(
            l.to_string(),
            "cidr:10.0.0.0/8,reserved:world,reserved:world-ipv4"
        );
        assert!(l.has_cidr());
        let l6 = Labels::for_cidr("fd00::/64".parse().unwrap());
        assert!(l6.contains(&Label::reserved("world-ipv6")));
        assert!(!Labels::for_pod("a", &BTreeMap::new(), &BTreeMap::new()).has_cidr());
    }
}

//! Label selectors: which label sets (identities) a policy applies to.

mod k8s;
mod requirement;
mod text;

use std::fmt;

use ipnet::IpNet;

use crate::error::Result;
use crate::label::{Label, source};
use crate::labels::{Labels, POD_NAMESPACE_LABEL};

pub use requirement::{Key, Operator, Requirement};

/// A label selector: requirements that must all hold.
///
/// Deserializes from the Kubernetes/Cilium shape (`matchLabels` and `matchExpressions` with
/// `In`, `NotIn`, `Exists`, `DoesNotExist`), checked as the API server checks it; serializes
/// back to that shape. Keys follow Cilium: `k8s:app` matches only `k8s:` labels, `app` (or
/// `any:app`) matches `app` under every source, `reserved:host` the host, and a `cidr:` key
/// every prefix inside its own (see [`Key`]). The empty selector matches everything.
///
/// Requirements are kept sorted and without duplicates, so two selectors that say the same
/// thing the same way are equal, and [`Display`](fmt::Display) is a canonical text fit for a
/// cache key (`any:app=web,k8s:io.kubernetes.pod.namespace=shop`; `<all>` for the empty
/// selector). [`FromStr`](std::str::FromStr) reads that text back, and the Kubernetes
/// selector syntax (`app in (a,b)`, `!app`, `app!=a`).
///
/// Trap: a `matchLabels` and a `matchExpressions` entry that mean the same are the same
/// requirement (`app In (web)` is `app=web`), but `reserved:host: ""` (`In ("")`) and the
/// `Exists` of [`Selector::reserved`] are two requirements with two texts, though they
/// select the same identities.
///
/// ```
/// use cellium_labels::{Labels, Selector};
///
/// let sel: Selector = serde_yaml::from_str("
/// matchLabels: { app: web }
/// matchExpressions: [ { key: tier, operator: NotIn, values: [db] } ]
/// ").unwrap();
/// let sel = sel.and(Selector::namespace("shop"));
/// assert_eq!(sel.to_string(), "any:app=web,any:tier!=db,k8s:io.kubernetes.pod.namespace=shop");
/// let web: Labels = "k8s:app=web,k8s:io.kubernetes.pod.namespace=shop".parse()?;
/// assert!(sel.matches(&web));
/// assert_eq!(sel, sel.to_string().parse()?);
/// # Ok::<(), cellium_labels::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// A selector of all `requirements` (sorted, duplicates dropped).
    pub fn new(requirements: impl IntoIterator<Item = Requirement>) -> Selector {
        let mut requirements: Vec<Requirement> = requirements.into_iter().collect();
        requirements.sort();
        requirements.dedup();
        Selector { requirements }
    }

    /// The selector that matches every label set.
    pub fn all() -> Selector {
        Selector::default()
    }

    /// The pods of `namespace`: `k8s:io.kubernetes.pod.namespace=<namespace>`.
    pub fn namespace(namespace: &str) -> Selector {
        Selector::from_labels(&Labels::from_iter([Label::k8s(
            POD_NAMESPACE_LABEL,
            namespace,
        )]))
    }

    /// The identities of `net` and of every prefix inside it: `cidr:<net>` exists.
    ///
    /// It does not select the `world` identity of addresses outside every known prefix;
    /// a policy for `0.0.0.0/0` adds [`Selector::reserved`]`("world")` for that, as Cilium
    /// does.
    pub fn cidr(net: IpNet) -> Selector {
        Selector {
            requirements: vec![Requirement::cidr_exists(net)],
        }
    }

    /// The identities carrying `reserved:<name>` (`host`, `world`, `kube-apiserver`, ...).
    pub fn reserved(name: &str) -> Result<Selector> {
        Ok(Selector::new([Requirement::exists(&format!(
            "reserved:{name}"
        ))?]))
    }

    /// The label sets holding every label of `labels` (each as `source:key In (value)`).
    pub fn from_labels(labels: &Labels) -> Selector {
        Selector::new(labels.iter().map(Requirement::from_label))
    }

    /// The requirements of both selectors: what both select. Takes both, so that their
    /// requirements move rather than being copied (a policy builds one for every peer).
    pub fn and(mut self, other: Selector) -> Selector {
        self.requirements.extend(other.requirements);
        Selector::new(self.requirements)
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this is the empty selector, which matches everything.
    pub fn is_all(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// The keys of `k8s:` labels the selector reads (those of its `k8s:` and `any:`
    /// requirements, whatever the operator): a pod label with such a key must be in the
    /// pod's identity for the selector to see it.
    pub fn k8s_keys(&self) -> impl Iterator<Item = &str> {
        self.requirements
            .iter()
            .map(Requirement::key)
            .filter(|k| k.source() == source::K8S || k.source() == source::ANY)
            .map(Key::name)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str(text::ALL);
        }
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Selector({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &str) -> Labels {
        s.parse().unwrap()
    }

    #[test]
    fn k8s_keys_are_those_of_k8s_and_any_requirements_whatever_the_operator() {
        let sel: Selector = "k8s:statefulset.kubernetes.io/pod-name=db-0,app!=web,!tier,reserved:host,cidr:10.0.0.0/8"
            .parse()
            .unwrap();
        let keys: Vec<&str> = sel.k8s_keys().collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
        for key in ["statefulset.kubernetes.io/pod-name", "app", "tier"] {
            assert!(keys.contains(&key), "{key} in {keys:?}");
        }
        assert_eq!(Selector::all().k8s_keys().count(), 0);
    }

    #[test]
    fn the_empty_selector_matches_everything() {
        assert!(Selector::all().matches(&Labels::new()));
        assert!(Selector::all().matches(&labels("reserved:host")));
        assert!(Selector::all().is_all());
        assert_eq!(Selector::all().to_string(), "<all>");
    }

    #[test]
    fn and_requires_both_and_is_canonical() {
        let a = Selector::from_labels(&labels("k8s:app=web"));
        let ns = Selector::namespace("shop");
        let both = a.clone().and(ns.clone());
        assert_eq!(both, ns.and(a.clone()));
        assert_eq!(both, both.clone().and(a));
        assert!(both.matches(&labels("k8s:app=web,k8s:io.kubernetes.pod.namespace=shop")));
        assert!(!both.matches(&labels("k8s:app=web,k8s:io.kubernetes.pod.namespace=dev")));
        assert!(!both.matches(&labels("k8s:io.kubernetes.pod.namespace=shop")));
    }

    #[test]
    fn namespace_selects_by_the_pod_namespace_label() {
        let sel = Selector::namespace("shop");
        assert_eq!(sel.to_string(), "k8s:io.kubernetes.pod.namespace=shop");
        let pod = Labels::for_pod("shop", &Default::default(), &Default::default());
        assert!(sel.matches(&pod));
    }

    #[test]
    fn cidr_and_reserved_constructors() {
        let sel = Selector::cidr("10.0.0.0/8".parse().unwrap());
        assert_eq!(sel.to_string(), "cidr:10.0.0.0/8");
        assert!(sel.matches(&Labels::for_cidr("10.2.0.0/16".parse().unwrap())));
        assert!(!sel.matches(&Labels::for_cidr("0.0.0.0/0".parse().unwrap())));
        let world = Selector::reserved("world").unwrap();
        assert!(world.matches(&Labels::for_cidr("10.2.0.0/16".parse().unwrap())));
        assert!(world.matches(&labels("reserved:world")));
        assert!(!world.matches(&labels("reserved:host")));
        assert!(Selector::reserved("no such").is_err());
    }

    #[test]
    fn from_labels_selects_supersets() {
        let sel = Selector::from_labels(&labels("k8s:app=web,reserved:host"));
        assert!(sel.matches(&labels("k8s:app=web,reserved:host,k8s:x=y")));
        assert!(!sel.matches(&labels("k8s:app=web")));
    }
}

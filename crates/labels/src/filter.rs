//! Which pod labels are security-relevant, after Cilium's default label filter.
//!
//! Cilium (pkg/labelsfilter, and its "Limiting Identity-Relevant Labels" documentation)
//! ignores labels that differ from pod to pod of the same workload (hashes, indexes, pod
//! names, controller uids) or that Kubernetes itself manages; keeping them would give every
//! pod an identity of its own. Its patterns are regular expressions anchored at the start of
//! the key; the defaults are all plain prefixes but one, which is written here as a
//! substring test. An include pattern that matches a longer part of the key wins over an
//! ignore pattern (`io.kubernetes.pod.namespace` is kept although `io.kubernetes` is
//! ignored).
//!
//! `job-name` is kept, as in Cilium: it names the Job, so all pods of one Job share it, and
//! policies may select on it.
//!
//! Unlike Cilium, whose users add include patterns by hand and restart the agent, a key the
//! filter ignores is kept after all while some policy selects on it (see
//! [`Labels::for_pod_keeping`](crate::Labels::for_pod_keeping) and
//! [`Selector::k8s_keys`](crate::Selector::k8s_keys)): a `podSelector` on
//! `statefulset.kubernetes.io/pod-name` then selects the pod it names rather than nothing.

/// Key prefixes that are ignored.
const IGNORED_PREFIXES: &[&str] = &[
    "io.kubernetes",
    "kubernetes.io",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "batch.kubernetes.io/job-completion-index",
    "batch.kubernetes.io/controller-uid",
    "k8s.io",
    "pod-template-generation",
    "pod-template-hash",
    "controller-revision-hash",
    "annotation",
    "controller-uid",
    "etcd_node",
];

/// Ignored wherever it appears in the key (Cilium's `.*beta\.kubernetes\.io`).
const IGNORED_ANYWHERE: &str = "beta.kubernetes.io";

/// Key prefixes that are kept even when an ignore pattern matches a shorter part.
const INCLUDED_PREFIXES: &[&str] = &[
    "io.kubernetes.pod.namespace",
    "io.cilium.k8s.namespace.labels",
    "app.kubernetes.io",
];

/// Whether the label filter keeps the pod label `key` in the pod's security identity (a
/// key it drops may still be kept because a policy selects on it).
pub fn is_relevant(key: &str) -> bool {
    let included = INCLUDED_PREFIXES
        .iter()
        .filter(|p| key.starts_with(*p))
        .map(|p| p.len())
        .max()
        .unwrap_or(0);
    let prefix_ignored = IGNORED_PREFIXES
        .iter()
        .filter(|p| key.starts_with(*p))
        .map(|p| p.len())
        .min();
    // The substring pattern matches from the key's start up to the end of its first hit.
    let anywhere_ignored = key
        .find(IGNORED_ANYWHERE)
        .map(|at| at + IGNORED_ANYWHERE.len());
    let ignored = match (prefix_ignored, anywhere_ignored) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => match a.or(b) {
            Some(len) => len,
            None => return true,
        },
    };
    included > ignored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_labels_are_kept() {
        for key in [
            "app",
            "tier",
            "k8s-app",
            "app.kubernetes.io/name",
            "job-name",
            "batch.kubernetes.io/job-name",
            "example.com/team",
        ] {
            assert!(is_relevant(key), "{key}");
        }
    }

    #[test]
    fn per_pod_and_kubernetes_managed_labels_are_ignored() {
        for key in [
            "pod-template-hash",
            "controller-revision-hash",
            "pod-template-generation",
            "statefulset.kubernetes.io/pod-name",
            "apps.kubernetes.io/pod-index",
            "batch.kubernetes.io/job-completion-index",
            "batch.kubernetes.io/controller-uid",
            "controller-uid",
            "io.kubernetes.container.name",
            "kubernetes.io/hostname",
            "beta.kubernetes.io/arch",
            "failure-domain.beta.kubernetes.io/zone",
            "k8s.io/x",
            "annotation.foo",
            "etcd_node",
        ] {
            assert!(!is_relevant(key), "{key}");
        }
    }

    #[test]
    fn a_longer_include_wins_over_a_shorter_ignore() {
        assert!(is_relevant("io.kubernetes.pod.namespace"));
        assert!(is_relevant("io.cilium.k8s.namespace.labels.team"));
        assert!(!is_relevant("io.kubernetes.pod.name"));
    }
}

//! An endpoint's security-relevant labels.

use std::collections::BTreeMap;

use cellium_labels::{
    Label, Labels, NAMESPACE_LABELS_PREFIX, POD_NAMESPACE_LABEL, POLICY_CLUSTER_LABEL,
    POLICY_SERVICE_ACCOUNT_LABEL, source,
};
use cellium_policy_repo::PolicyRepository;
use cellium_resources::{NamedPort, ObjectKey, Resources};

use crate::endpoint::Endpoint;

/// The labels an endpoint's identity derives from: its pod's labels and its namespace's (in
/// Cilium's form, see [`Labels::for_pod`], plus the pod labels the filter drops but a policy
/// of `repo` selects on), its ServiceAccount's and `cluster`'s
/// (`io.cilium.k8s.policy.serviceaccount` and `io.cilium.k8s.policy.cluster`, as Cilium), and the `cidr:` labels of the NetworkPolicy ipBlocks
/// covering its addresses, so that ipBlock peers select pods inside them as upstream
/// Kubernetes does. An endpoint the runtime did not name a pod for is `reserved:init`, as
/// Cilium's endpoints are until their pod is known.
///
/// Without `resources` (an agent without the cell) the pod's and namespace's labels are
/// unknown: the endpoint has only what the runtime named, its namespace. Without `repo` there
/// are no ipBlocks, so no `cidr:` labels.
pub fn of(
    ep: &Endpoint,
    resources: Option<&Resources>,
    repo: Option<&PolicyRepository>,
    cluster: &str,
) -> Labels {
    let Some(pod) = &ep.pod else {
        let mut init = Labels::new();
        init.insert(Label::reserved("init"));
        return init;
    };
    let empty = BTreeMap::new();
    let pod_obj = resources.and_then(|r| {
        r.pods
            .get(&ObjectKey::namespaced(&pod.namespace, &pod.name))
    });
    // A Pod object that is gone while its endpoint lives (a force delete: the container runs
    // until the runtime's DEL) keeps the labels it last had: dropped to its namespace's, the
    // endpoint would leave the policies that select it, and the denies that name it, until
    // DEL. A pod never seen has none to keep.
    let kept = pod_obj.is_none().then(|| pod_part(&ep.labels));
    let ns_obj = resources.and_then(|r| r.namespaces.get(&ObjectKey::cluster(&pod.namespace)));
    // The keys policies select on are kept although the label filter drops them (see
    // `cellium_policy_repo::SelectedKeys`); the pod's raw labels are read from its Pod object
    // at every derivation, so a policy that starts or stops selecting on a key changes the
    // labels (and identity) of exactly the endpoints whose pods carry it.
    let selected = repo.map(PolicyRepository::selected_keys);
    let mut labels = Labels::for_pod_keeping(
        &pod.namespace,
        pod_obj
            .as_ref()
            .map(|p| &p.labels)
            .or(kept.as_ref())
            .unwrap_or(&empty),
        ns_obj.as_ref().map_or(&empty, |n| &n.labels),
        |key| {
            selected
                .as_ref()
                .is_some_and(|s| s.selects(key, &pod.namespace))
        },
    );
    // A gone Pod keeps its ServiceAccount as it keeps its labels.
    let service_account = match &pod_obj {
        Some(p) => Some(p.service_account.clone()),
        None => ep
            .labels
            .iter()
            .find(|l| l.source == source::K8S && l.key == POLICY_SERVICE_ACCOUNT_LABEL)
            .map(|l| l.value.clone()),
    };
    if let Some(sa) = service_account {
        labels.insert(Label::k8s(POLICY_SERVICE_ACCOUNT_LABEL, sa));
    }
    labels.insert(Label::k8s(POLICY_CLUSTER_LABEL, cluster));
    if let Some(repo) = repo {
        for addr in &ep.addresses {
            for label in repo.cidr_labels_for(addr.ip) {
                labels.insert(label);
            }
        }
    }
    labels
}

/// The pod's own labels among an endpoint's labels (those [`Labels::for_pod`] took from the Pod
/// object), as the Pod spelled them.
fn pod_part(labels: &Labels) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|l| {
            l.source == source::K8S
                && l.key != POD_NAMESPACE_LABEL
                && !l.key.starts_with(NAMESPACE_LABELS_PREFIX)
        })
        .map(|l| (l.key.clone(), l.value.clone()))
        .collect()
}

/// The named container ports of the endpoint's pod (ingress rules name them); none without
/// `resources` or a pod. `None` when its Pod object is gone while the endpoint lives: the
/// caller keeps the ports it last had, as [`of`] keeps its labels.
pub fn named_ports(ep: &Endpoint, resources: Option<&Resources>) -> Option<Vec<NamedPort>> {
    let (Some(pod), Some(resources)) = (&ep.pod, resources) else {
        return Some(Vec::new());
    };
    resources
        .pods
        .get(&ObjectKey::namespaced(&pod.namespace, &pod.name))
        .map(|p| p.ports.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::PodRef;

    const SHOP: &str =
        "apiVersion: v1\nkind: Namespace\nmetadata: { name: shop, labels: { team: a } }\n";
    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata: { name: web, namespace: shop, labels: { app: web } }\n\
spec: { containers: [ { name: c, image: web } ] }\n";

    #[test]
    fn a_pod_deleted_while_its_endpoint_lives_keeps_its_last_labels() {
        let resources = Resources::new();
        resources.apply("test", SHOP).unwrap();
        let mut ep = crate::testing::endpoint(3, "c3");
        ep.pod = Some(PodRef {
            namespace: "shop".into(),
            name: "web".into(),
        });
        // Never seen: the namespace's labels only.
        let unseen = of(&ep, Some(&resources), None, "c1");
        assert!(unseen.get(source::K8S, "app").is_none(), "{unseen}");
        resources.apply("test", WEB).unwrap();
        ep.labels = of(&ep, Some(&resources), None, "c1");
        assert!(ep.labels.get(source::K8S, "app").is_some(), "{}", ep.labels);
        // Force-deleted: the pod's labels stay; its namespace's still follow the Namespace.
        resources.delete("test", WEB).unwrap();
        let kept = of(&ep, Some(&resources), None, "c1");
        assert_eq!(kept, ep.labels);
        resources
            .apply("test", &SHOP.replace("team: a", "team: b"))
            .unwrap();
        let relabelled = of(&ep, Some(&resources), None, "c1");
        assert!(relabelled.get(source::K8S, "app").is_some(), "{relabelled}");
        assert_eq!(
            relabelled
                .get(source::K8S, &format!("{NAMESPACE_LABELS_PREFIX}team"))
                .map(|l| l.value.as_str()),
            Some("b")
        );
    }

    #[test]
    fn a_pod_label_the_filter_drops_is_kept_while_a_policy_of_its_namespace_selects_on_it() {
        const NP: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
metadata: { name: db, namespace: shop }\n\
spec: { podSelector: { matchLabels: { statefulset.kubernetes.io/pod-name: web-0 } } }\n";
        let resources = Resources::new();
        resources.apply("test", SHOP).unwrap();
        resources
            .apply(
                "test",
                &WEB.replace(
                    "app: web",
                    "app: web, statefulset.kubernetes.io/pod-name: web-0",
                ),
            )
            .unwrap();
        let repo =
            PolicyRepository::with_parts(cellium_identity::Identities::in_memory(), None, None);
        let mut ep = crate::testing::endpoint(3, "c3");
        ep.pod = Some(PodRef {
            namespace: "shop".into(),
            name: "web".into(),
        });
        let key = "statefulset.kubernetes.io/pod-name";
        let has_key = |repo: &PolicyRepository| {
            of(&ep, Some(&resources), Some(repo), "c1")
                .get(source::K8S, key)
                .is_some()
        };
        assert!(!has_key(&repo), "the filter drops it");
        resources.apply("test", NP).unwrap();
        repo.sync_resources(&resources);
        assert!(has_key(&repo), "a policy selects on it");
        // A policy of another namespace does not make it relevant here.
        resources.delete("test", NP).unwrap();
        resources
            .apply(
                "test",
                &format!(
                    "{}---\n{}",
                    SHOP.replace("shop", "dev"),
                    NP.replace("namespace: shop", "namespace: dev")
                ),
            )
            .unwrap();
        repo.sync_resources(&resources);
        assert!(!has_key(&repo), "selected in dev only");
    }

    #[test]
    fn service_account_and_cluster_are_labels() {
        let resources = Resources::new();
        resources.apply("test", SHOP).unwrap();
        resources
            .apply(
                "test",
                &WEB.replace("spec: {", "spec: { serviceAccountName: builder,"),
            )
            .unwrap();
        let mut ep = crate::testing::endpoint(3, "c3");
        ep.pod = Some(PodRef {
            namespace: "shop".into(),
            name: "web".into(),
        });
        ep.labels = of(&ep, Some(&resources), None, "east");
        let value = |l: &Labels, key| l.get(source::K8S, key).map(|l| l.value.clone());
        assert_eq!(
            value(&ep.labels, POLICY_SERVICE_ACCOUNT_LABEL).as_deref(),
            Some("builder")
        );
        assert_eq!(
            value(&ep.labels, POLICY_CLUSTER_LABEL).as_deref(),
            Some("east")
        );
        // A force-deleted Pod keeps its ServiceAccount with its other labels.
        resources.delete("test", WEB).unwrap();
        assert_eq!(of(&ep, Some(&resources), None, "east"), ep.labels);
    }
}

//! An endpoint's labels, from its pod and the pod's namespace in the resources tables.

use std::collections::BTreeMap;

use cellium_resources::{ObjectKey, Resources};

use crate::endpoint::PodRef;

/// The pod's labels as `k8s:<key>`, the namespace name as `k8s:io.kubernetes.pod.namespace`,
/// and the namespace's labels as `k8s:io.cilium.k8s.namespace.labels.<key>`, the form Cilium
/// uses, so selectors written for Cilium read the same here. Empty when the pod is unknown.
pub fn of_pod(resources: &Resources, pod: &PodRef) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let Some(p) = resources
        .pods
        .get(&ObjectKey::namespaced(&pod.namespace, &pod.name))
    else {
        return labels;
    };
    for (k, v) in &p.labels {
        labels.insert(format!("k8s:{k}"), v.clone());
    }
    labels.insert(
        "k8s:io.kubernetes.pod.namespace".into(),
        pod.namespace.clone(),
    );
    if let Some(ns) = resources
        .namespaces
        .get(&ObjectKey::cluster(&pod.namespace))
    {
        for (k, v) in &ns.labels {
            labels.insert(format!("k8s:io.cilium.k8s.namespace.labels.{k}"), v.clone());
        }
    }
    labels
}

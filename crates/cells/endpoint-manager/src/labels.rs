//! An endpoint's security-relevant labels.

use std::collections::BTreeMap;

use cellium_labels::{Label, Labels};
use cellium_policy_repo::PolicyRepository;
use cellium_resources::{NamedPort, ObjectKey, Resources};

use crate::endpoint::Endpoint;

/// The labels an endpoint's identity derives from: its pod's labels and its namespace's (in
/// Cilium's form, see [`Labels::for_pod`]) and the `cidr:` labels of the NetworkPolicy ipBlocks
/// covering its addresses, so that ipBlock peers select pods inside them as upstream
/// Kubernetes does. An endpoint the runtime did not name a pod for is `reserved:init`, as
/// Cilium's endpoints are until their pod is known.
pub fn of(ep: &Endpoint, resources: &Resources, repo: &PolicyRepository) -> Labels {
    let Some(pod) = &ep.pod else {
        let mut init = Labels::new();
        init.insert(Label::reserved("init"));
        return init;
    };
    let empty = BTreeMap::new();
    let pod_obj = resources
        .pods
        .get(&ObjectKey::namespaced(&pod.namespace, &pod.name));
    let ns_obj = resources
        .namespaces
        .get(&ObjectKey::cluster(&pod.namespace));
    let mut labels = Labels::for_pod(
        &pod.namespace,
        pod_obj.as_ref().map_or(&empty, |p| &p.labels),
        ns_obj.as_ref().map_or(&empty, |n| &n.labels),
    );
    for addr in &ep.addresses {
        for label in repo.cidr_labels_for(addr.ip) {
            labels.insert(label);
        }
    }
    labels
}

/// The named container ports of the endpoint's pod (ingress rules name them).
pub fn named_ports(ep: &Endpoint, resources: &Resources) -> Vec<NamedPort> {
    ep.pod
        .as_ref()
        .and_then(|p| {
            resources
                .pods
                .get(&ObjectKey::namespaced(&p.namespace, &p.name))
        })
        .map(|p| p.ports.clone())
        .unwrap_or_default()
}

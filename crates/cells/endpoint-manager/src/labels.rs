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
///
/// Without `resources` (an agent without the cell) the pod's and namespace's labels are
/// unknown: the endpoint has only what the runtime named, its namespace. Without `repo` there
/// are no ipBlocks, so no `cidr:` labels.
pub fn of(ep: &Endpoint, resources: Option<&Resources>, repo: Option<&PolicyRepository>) -> Labels {
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
    let ns_obj = resources.and_then(|r| r.namespaces.get(&ObjectKey::cluster(&pod.namespace)));
    let mut labels = Labels::for_pod(
        &pod.namespace,
        pod_obj.as_ref().map_or(&empty, |p| &p.labels),
        ns_obj.as_ref().map_or(&empty, |n| &n.labels),
    );
    if let Some(repo) = repo {
        for addr in &ep.addresses {
            for label in repo.cidr_labels_for(addr.ip) {
                labels.insert(label);
            }
        }
    }
    labels
}

/// The named container ports of the endpoint's pod (ingress rules name them); none without
/// `resources`.
pub fn named_ports(ep: &Endpoint, resources: Option<&Resources>) -> Vec<NamedPort> {
    ep.pod
        .as_ref()
        .zip(resources)
        .and_then(|(p, resources)| {
            resources
                .pods
                .get(&ObjectKey::namespaced(&p.namespace, &p.name))
        })
        .map(|p| p.ports.clone())
        .unwrap_or_default()
}

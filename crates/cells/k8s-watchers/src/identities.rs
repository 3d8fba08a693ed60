//! CiliumIdentity objects as the cluster's numbering of label sets
//! (`identity-allocation-mode: crd`).
//!
//! An identity is a cluster-scoped `CiliumIdentity` named by its number, holding its labels in
//! `security-labels` (`{"k8s:app": "web", ...}`), created by whichever agent needs it first.
//! A label set's number is found in three steps: an existing CiliumIdentity with exactly these
//! labels; else the first free number of a probe sequence that starts at a hash of the labels,
//! created there (the API server's create is the arbiter: of two agents creating the same name
//! at once, one gets `409 AlreadyExists`, reads the winner and, finding the same labels, takes
//! its number; finding others, it probes on). Every agent walks the same sequence for the same
//! labels, so they agree even when they race on a label set nobody had.

use std::collections::BTreeMap;
use std::sync::Arc;

use cellium_identity::{AllocationMode, CLUSTER_IDENTITIES, ClusterNumbering};
use cellium_labels::Labels;
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use crate::watchers::K8sWatchers;

/// How many numbers are tried before giving up: a cluster with this many collisions on one
/// label set's sequence has run out of numbers in practice.
const MAX_PROBES: u32 = 4096;

/// The numbering over CiliumIdentity objects.
#[derive(Debug)]
pub struct CrdNumbering {
    watchers: Arc<K8sWatchers>,
}

impl CrdNumbering {
    /// As the identity cell takes it.
    pub fn provide(watchers: Arc<K8sWatchers>) -> Arc<dyn ClusterNumbering> {
        Arc::new(CrdNumbering { watchers })
    }
}

impl ClusterNumbering for CrdNumbering {
    fn mode(&self) -> AllocationMode {
        AllocationMode::Crd
    }

    fn store(&self) -> Option<String> {
        self.watchers
            .server_url()
            .map(|s| format!("CiliumIdentity objects at {s}"))
    }

    fn number(&self, labels: &Labels) -> BoxFuture<'static, Result<u32, String>> {
        let (watchers, labels) = (self.watchers.clone(), labels.clone());
        async move {
            let client = watchers.api_client().await.map_err(|e| e.to_string())?;
            let api: Api<DynamicObject> = Api::all_with(client, &resource());
            number(&api, &labels).await
        }
        .boxed()
    }
}

async fn number(api: &Api<DynamicObject>, labels: &Labels) -> Result<u32, String> {
    let wanted = security_labels(labels);
    let existing = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing CiliumIdentities: {e}"))?;
    if let Some(id) = existing
        .items
        .iter()
        .find(|o| o.data.get("security-labels") == Some(&wanted))
        .and_then(|o| o.metadata.name.as_deref()?.parse().ok())
    {
        return Ok(id);
    }
    for id in probe_sequence(labels).take(MAX_PROBES as usize) {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumIdentity",
            "metadata": { "name": id.to_string() },
            "security-labels": wanted,
        }))
        .map_err(|e| e.to_string())?;
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {
                tracing::info!(id, %labels, "CiliumIdentity created");
                return Ok(id);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let holder = api
                    .get_opt(&id.to_string())
                    .await
                    .map_err(|e| format!("reading CiliumIdentity {id}: {e}"))?;
                // Deleted in between: the next round of the caller tries again from the start.
                if holder.is_some_and(|h| h.data.get("security-labels") == Some(&wanted)) {
                    return Ok(id);
                }
            }
            Err(e) => return Err(format!("creating CiliumIdentity {id}: {e}")),
        }
    }
    Err(format!(
        "no free identity number for {labels} within {MAX_PROBES} tries"
    ))
}

/// The labels as CiliumIdentity's `security-labels`: `source:key` to value.
fn security_labels(labels: &Labels) -> Value {
    let map: BTreeMap<String, String> = labels
        .iter()
        .map(|l| (format!("{}:{}", l.source, l.key), l.value.clone()))
        .collect();
    json!(map)
}

/// The numbers to try for `labels`, every cluster number once, starting at a hash of the
/// labels (FNV-1a: stable across versions and machines, unlike std's hasher).
fn probe_sequence(labels: &Labels) -> impl Iterator<Item = u32> {
    let first = *CLUSTER_IDENTITIES.start();
    let size = CLUSTER_IDENTITIES.end() - first + 1;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in labels.to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let start = (hash % u64::from(size)) as u32;
    (0..size).map(move |i| first + (start + i) % size)
}

fn resource() -> ApiResource {
    ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumIdentity".into(),
        plural: "ciliumidentities".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_stable_covers_every_number_once_and_depends_on_the_labels() {
        let web: Labels = "k8s:app=web,k8s:io.kubernetes.pod.namespace=shop"
            .parse()
            .unwrap();
        let db: Labels = "k8s:app=db,k8s:io.kubernetes.pod.namespace=shop"
            .parse()
            .unwrap();
        let a: Vec<u32> = probe_sequence(&web).take(3).collect();
        assert_eq!(a, probe_sequence(&web).take(3).collect::<Vec<_>>());
        assert_ne!(a[0], probe_sequence(&db).next().unwrap());
        let all: std::collections::BTreeSet<u32> = probe_sequence(&web).collect();
        assert_eq!(
            all.len() as u32,
            CLUSTER_IDENTITIES.end() - CLUSTER_IDENTITIES.start() + 1
        );
        assert!(all.iter().all(|id| CLUSTER_IDENTITIES.contains(id)));
        assert_eq!(
            security_labels(&web),
            json!({"k8s:app": "web", "k8s:io.kubernetes.pod.namespace": "shop"})
        );
    }
}

//! This node's CiliumNode: created by the agent with its name and addresses, so that the
//! operator's cluster-pool IPAM gives it pod CIDRs (`spec.ipam.podCIDRs`, which the agent
//! never writes) and other nodes learn its addresses.
//!
//! Kept up from the moment the watchers run (the resources cell's start hook), not from a job
//! of this module: `ipam: cluster-pool` waits in its own start hook for the CIDRs the operator
//! writes into this object, so the object must exist before that hook runs.

use std::net::IpAddr;
use std::time::Duration;

use cellium_resources::{Feed, ObjectKey};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::watchers::chain;

/// How often the object is checked when nothing changed: put back within this when someone
/// deleted it.
const RESYNC: Duration = Duration::from_secs(30);

/// How long to wait after a failed pass.
const RETRY: Duration = Duration::from_secs(2);

/// Keeps the CiliumNode `node` existing with this node's addresses (its Node's, from the
/// tables) until `cancel`.
pub(crate) async fn upkeep(
    client: kube::Client,
    node: String,
    feed: Feed,
    cancel: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    // Not before the Nodes are listed: until then this node's addresses are unknown, and an
    // object published without them tells other nodes and the operator nothing.
    let mut synced = feed.tables().nodes.synced();
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = synced.wait_for(|s| *s) => {}
    }
    let mut nodes = feed.tables().nodes.revision();
    loop {
        let addresses = feed
            .tables()
            .nodes
            .get(&ObjectKey::cluster(&node))
            .map(|n| n.addresses.clone())
            .unwrap_or_default();
        let wait = match ensure(&api, &node, &addresses).await {
            Ok(()) => RESYNC,
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot write this node's CiliumNode; retrying");
                RETRY
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = nodes.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Creates the object, or sets its `spec.addresses` when they differ; nothing else of it is
/// touched (the operator owns `spec.ipam`).
async fn ensure(api: &Api<DynamicObject>, node: &str, addresses: &[IpAddr]) -> Result<(), String> {
    let wanted = spec_addresses(addresses);
    let current = api.get_opt(node).await.map_err(|e| chain(&e))?;
    match current {
        None => {
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumNode",
                "metadata": { "name": node },
                "spec": { "addresses": wanted },
            }))
            .map_err(|e| e.to_string())?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => tracing::info!(node, "CiliumNode created"),
                // Created meanwhile (by a previous run still stopping): the next pass updates it.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(chain(&e)),
            }
        }
        Some(obj) if obj.data.pointer("/spec/addresses") != Some(&wanted) => {
            let patch = json!({ "spec": { "addresses": wanted } });
            api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| chain(&e))?;
            tracing::info!(node, "CiliumNode addresses updated");
        }
        Some(_) => {}
    }
    Ok(())
}

/// `spec.addresses` as Cilium writes it.
fn spec_addresses(addresses: &[IpAddr]) -> Value {
    Value::Array(
        addresses
            .iter()
            .map(|ip| json!({ "type": "InternalIP", "ip": ip.to_string() }))
            .collect(),
    )
}

fn resource() -> ApiResource {
    ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumNode".into(),
        plural: "ciliumnodes".into(),
    }
}

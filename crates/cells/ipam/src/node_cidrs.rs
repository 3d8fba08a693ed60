//! `ipam: kubernetes`: the pools are this node's Node `spec.podCIDRs` (Cilium's "Kubernetes
//! host scope"), assigned by the controller manager.

use std::time::Duration;

use cellium_hive::{BoxError, HookContext, Reporter};
use cellium_resources::{ObjectKey, Resources};

use crate::ipam::Ipam;

/// How often the wait says what it waits for.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Waits until the Node `node` has pod CIDRs, then adds each as a pool. Runs in the start hook,
/// before the endpoints are restored (their addresses need their pools) and before the API
/// serves CNI calls; the resources cell has synced the Nodes by then, so a Node without CIDRs
/// is one the controller manager has not given any yet. Degraded with the reason while it
/// waits; fails at the hook's timeout (`start-timeout`) naming the node.
pub(crate) async fn wait_and_add(
    ipam: &Ipam,
    resources: &Resources,
    node: &str,
    reporter: &Reporter,
    ctx: &HookContext,
) -> Result<(), BoxError> {
    let key = ObjectKey::cluster(node);
    let mut changes = resources.nodes.revision();
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    loop {
        let cidrs = resources
            .nodes
            .get(&key)
            .map(|n| n.pod_cidrs.clone())
            .unwrap_or_default();
        if !cidrs.is_empty() {
            for cidr in cidrs {
                ipam.add_pool(cidr, &format!("Node {node} spec.podCIDRs"))?;
            }
            return Ok(());
        }
        let why = match resources.nodes.get(&key) {
            None => format!(
                "waiting for Node {node} (ipam: kubernetes): the API server has no such node"
            ),
            Some(_) => {
                format!("waiting for Node {node} to be given spec.podCIDRs (ipam: kubernetes)")
            }
        };
        reporter.degraded(&why);
        tokio::select! {
            _ = changes.changed() => {}
            _ = progress.tick() => tracing::info!("{why}"),
            _ = ctx.cancelled() => return Err(format!("{why}; gave up at start-timeout").into()),
        }
    }
}

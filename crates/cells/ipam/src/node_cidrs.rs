//! `ipam: kubernetes` and `ipam: cluster-pool`: the pools are this node's pod CIDRs as the
//! cluster assigns them: the Node's `spec.podCIDRs` (Cilium's "Kubernetes host scope", from the
//! controller manager) or the CiliumNode's `spec.ipam.podCIDRs` (from `cellium-operator`'s
//! cluster pools).

use std::time::Duration;

use cellium_hive::{BoxError, HookContext, Reporter};
use cellium_resources::{ObjectKey, Resources};
use ipnet::IpNet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;

use crate::config::IpamMode;
use crate::ipam::Ipam;

/// How often the wait says what it waits for.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Waits until the node's pod CIDRs of `mode` exist, then adds each as a pool. Runs in the
/// start hook, before the endpoints are restored (their addresses need their pools) and before
/// the API serves CNI calls; the resources cell has synced the tables by then, so an object
/// without CIDRs is one nobody has given any yet. Degraded with the reason while it waits;
/// fails at the hook's timeout (`start-timeout`) naming the node.
pub(crate) async fn wait_and_add(
    ipam: &Ipam,
    resources: &Resources,
    node: &str,
    mode: IpamMode,
    reporter: &Reporter,
    ctx: &HookContext,
) -> Result<(), BoxError> {
    let mut changes = futures::stream::select(
        WatchStream::new(resources.nodes.revision()),
        WatchStream::new(resources.cilium_nodes.revision()),
    );
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    loop {
        let (cidrs, why) = assigned(resources, node, mode);
        if !cidrs.is_empty() {
            for cidr in cidrs {
                ipam.add_pool(cidr, &source(node, mode))?;
            }
            return Ok(());
        }
        reporter.degraded(&why);
        tokio::select! {
            _ = changes.next() => {}
            _ = progress.tick() => tracing::info!("{why}"),
            _ = ctx.cancelled() => return Err(format!("{why}; gave up at start-timeout").into()),
        }
    }
}

fn source(node: &str, mode: IpamMode) -> String {
    match mode {
        IpamMode::ClusterPool => format!("CiliumNode {node} spec.ipam.podCIDRs"),
        _ => format!("Node {node} spec.podCIDRs"),
    }
}

/// The CIDRs assigned so far, and what is awaited when there are none.
fn assigned(resources: &Resources, node: &str, mode: IpamMode) -> (Vec<IpNet>, String) {
    let key = ObjectKey::cluster(node);
    match mode {
        IpamMode::ClusterPool => match resources.cilium_nodes.get(&key) {
            None => (
                Vec::new(),
                format!("waiting for CiliumNode {node} (ipam: cluster-pool): not created yet"),
            ),
            Some(n) => (
                n.pod_cidrs.clone(),
                match &n.operator_error {
                    Some(e) => format!(
                        "waiting for CiliumNode {node} to be given spec.ipam.podCIDRs (ipam: cluster-pool): the operator says: {e}"
                    ),
                    None => format!(
                        "waiting for CiliumNode {node} to be given spec.ipam.podCIDRs by cellium-operator (ipam: cluster-pool)"
                    ),
                },
            ),
        },
        _ => match resources.nodes.get(&key) {
            None => (
                Vec::new(),
                format!(
                    "waiting for Node {node} (ipam: kubernetes): the API server has no such node"
                ),
            ),
            Some(n) => (
                n.pod_cidrs.clone(),
                format!("waiting for Node {node} to be given spec.podCIDRs (ipam: kubernetes)"),
            ),
        },
    }
}

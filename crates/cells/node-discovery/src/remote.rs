//! Other nodes and their pods learnt from elsewhere than the API server's CiliumNodes and
//! CiliumEndpoints (the kvstore's `cilium/state/nodes/v1/` and `cilium/state/ip/v1/` entries):
//! merged with them into the routes and the ipcache's remote entries.

use cellium_resources::{CiliumEndpoint, CiliumNode};

use crate::desired::Refused;
use tokio::sync::watch;

/// A source of other nodes and their pods: each pod as a CiliumEndpoint would say it
/// (addresses, identity, and `node_ip`, the hosting node's address), each node as a CiliumNode
/// would (addresses, pod CIDRs).
pub trait RemoteEndpoints: Send + Sync + 'static {
    /// The pods now, those of this node left out; and the claims refused before they are
    /// pods (a kvstore entry under another address's key).
    fn endpoints(&self) -> (Vec<CiliumEndpoint>, Vec<Refused>);
    /// The other nodes now.
    fn nodes(&self) -> Vec<CiliumNode>;
    /// Counters that move when they change.
    fn changes(&self) -> Vec<watch::Receiver<u64>>;
}

impl std::fmt::Debug for dyn RemoteEndpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteEndpoints")
    }
}

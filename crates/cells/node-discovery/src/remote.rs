//! Other nodes' pods learnt from elsewhere than the API server's CiliumEndpoints (the kvstore's
//! `cilium/state/ip/v1/` entries): merged with them into the ipcache's remote entries.

use cellium_resources::CiliumEndpoint;
use tokio::sync::watch;

/// A source of other nodes' pods, each as a CiliumEndpoint would say it (addresses, identity,
/// and `node_ip`, the hosting node's address).
pub trait RemoteEndpoints: Send + Sync + 'static {
    /// The pods now; those of this node left out.
    fn endpoints(&self) -> Vec<CiliumEndpoint>;
    /// A counter that moves when they change.
    fn changes(&self) -> watch::Receiver<u64>;
}

impl std::fmt::Debug for dyn RemoteEndpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteEndpoints")
    }
}

//! Identities numbered for the whole cluster (`identity-allocation-mode: crd`): a label set's
//! number comes from a shared store, so every node gives the same labels the same number.

use std::fmt;

use cellium_labels::Labels;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Where pod identities get their numbers (key `identity-allocation-mode`, Cilium's values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationMode {
    /// This node numbers them (standalone): numbers mean nothing on another node.
    #[default]
    Local,
    /// The API server's `CiliumIdentity` objects number them (Kubernetes mode).
    Crd,
    /// etcd numbers them.
    Kvstore,
}

/// The `identity` configuration section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct IdentityConfig {
    /// `local` (the default), `crd` (CiliumIdentity objects; needs Kubernetes mode) or
    /// `kvstore` (not available in this version).
    pub identity_allocation_mode: AllocationMode,
}

/// The cluster's numbering of label sets; the `k8s-watchers` cell provides one over
/// CiliumIdentity objects.
pub trait ClusterNumbering: Send + Sync + 'static {
    /// Where the numbers live, as logs and status name it; `None` when this agent has no
    /// such store (standalone).
    fn store(&self) -> Option<String>;

    /// The cluster-wide number of `labels` (pod labels: cluster scope): the one already
    /// given, or a new one, created so that any other node asking for the same labels gets
    /// the same. Fails when the store cannot be reached; the caller retries.
    fn number(&self, labels: &Labels) -> BoxFuture<'static, Result<u32, String>>;
}

impl fmt::Debug for dyn ClusterNumbering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterNumbering")
            .field("store", &self.store())
            .finish()
    }
}

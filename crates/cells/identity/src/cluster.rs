//! Identities numbered for the whole cluster (`identity-allocation-mode: crd` or `kvstore`): a
//! label set's number comes from a shared store, so every node gives the same labels the same
//! number.

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
    /// `kvstore` (etcd; needs `kvstore: etcd`).
    pub identity_allocation_mode: AllocationMode,
}

/// The cluster's numbering of label sets; the `k8s-watchers` cell contributes one over
/// CiliumIdentity objects (`crd`), the `kvstore` cell one over etcd (`kvstore`). The identity
/// cell takes the one of its configured mode.
pub trait ClusterNumbering: Send + Sync + 'static {
    /// The allocation mode this numbering serves.
    fn mode(&self) -> AllocationMode;

    /// Where the numbers live, as logs and status name it; `None` when this agent has no
    /// such store (standalone).
    fn store(&self) -> Option<String>;

    /// The cluster-wide number of `labels` (pod labels: cluster scope): the one already
    /// given, or a new one, created so that any other node asking for the same labels gets
    /// the same. Fails when the store cannot be reached; the caller retries.
    fn number(&self, labels: &Labels) -> BoxFuture<'static, Result<u32, String>>;

    /// This node uses `labels`, numbered `id`, from now on (its first reference was taken): a
    /// store that counts users per node records this node's. Must not block; the default
    /// does nothing.
    fn used(&self, _labels: &Labels, _id: u32) {}

    /// This node no longer uses `labels` numbered `id` (the number's last reference was
    /// released): a store that counts users per node drops this node's, unless the labels
    /// moved to another number meanwhile (`Identities::retire`). Must not block; the default
    /// does nothing.
    fn release(&self, _labels: &Labels, _id: u32) {}
}

impl fmt::Debug for dyn ClusterNumbering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterNumbering")
            .field("mode", &self.mode())
            .field("store", &self.store())
            .finish()
    }
}

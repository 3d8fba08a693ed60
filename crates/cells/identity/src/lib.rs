//! The `identity` cell: numeric security identities from labels.
//!
//! - **Owns** the node's identities: the reserved ones (host 1, world 2, unmanaged 3,
//!   health 4, init 5, remote-node 6, kube-apiserver 7, ingress 8, world-ipv4 9,
//!   world-ipv6 10, as in Cilium), one reference-counted identity per label set in use
//!   (pods from 256 to 65535, label sets with a `cidr:` label node-local from `1 << 24`),
//!   and their table on disk, `identities.json` in the state directory.
//! - **Provides** `Arc<Identities>`: allocate / release / get / lookup / list, and
//!   [`Identities::snapshot_and_subscribe`] for the policy repository's selector cache; and
//!   the `cellium.v1.Identity` gRPC service (`cellium identity list|get`).
//! - **Depends on** `Arc<StateDir>` (the `statedir` cell).
//! - **Config keys:** `identity-allocation-mode`: `local` (the default: this node numbers
//!   label sets, numbers mean nothing elsewhere) or `crd` (Kubernetes mode: pod label sets
//!   are numbered by CiliumIdentity objects through the `ClusterNumbering` the `k8s-watchers`
//!   cell provides, so every node gives the same labels the same number; `cidr:` label sets
//!   stay node-local) or `kvstore` (the same through etcd, with the numbering the `kvstore`
//!   cell contributes when `kvstore: etcd`; see `docs/kvstore.md`).
//! - **Degraded** when the table cannot be written (the `persist` job retries every 30 s), and
//!   when the restore could not restore everything, naming the file and each reason: a table
//!   that cannot be read is left as it is and never written over by this run (identities get
//!   new numbers); a table that cannot be decoded, or holds records that cannot be restored,
//!   is kept as read in `identities.json.corrupt` and the rest loads. OK once restored.
//!
//! The restore contract: the start hook loads the table before any cell that depends on
//! identities starts; the endpoint manager re-allocates the labels of every restored
//! endpoint (getting the same numbers back) and then calls
//! [`Identities::release_unclaimed`]. A cluster numbering hears of every label set this node
//! stops using ([`ClusterNumbering::release`]), per number: a number the cluster gave to other
//! labels is retired ([`Identities::retire`]), its labels move to a new number while its
//! holders (endpoints) still reference the old one.

mod cluster;
mod error;
mod grpc;
mod identities;
mod identity;
mod persist;
mod reserved;
mod restore;
mod table;

#[cfg(test)]
mod cell_tests;

use cellium_hive::Module;

pub use cluster::{AllocationMode, ClusterNumbering, IdentityConfig};
pub use error::{Error, Result};
pub use grpc::IdentityService;
pub use identities::{Identities, IdentityEvent, IdentityInfo};
pub use identity::{CLUSTER_IDENTITIES, Identity, LOCAL_IDENTITIES, LOCAL_IDENTITY_FLAG, Scope};
pub use reserved::Reserved;

/// The `identity` module.
pub fn cell() -> Module {
    Module::new(
        "identity",
        "Allocates numeric security identities to label sets and keeps them across restarts",
    )
    .config::<IdentityConfig>()
    .provide(Identities::new)
    .contribute(IdentityService::api)
}

//! The `kvstore` cell: identities, ip -> identity entries, nodes and the node's session shared
//! through etcd, in Cilium's key layout (`docs/kvstore.md`). The only crate that talks to etcd.
//!
//! - **Owns** the etcd client, the node's session lease (kept alive every third of its TTL,
//!   granted again when it expired), the keys this node keeps on it (its `value/` identity
//!   references, its pods' `ip/v1/default/<IP>` entries and its own
//!   `nodes/v1/default/<node>` entry: written again on a new lease, and when someone else
//!   deletes or changes one), and the mirrors of `cilium/state/identities/v1/`,
//!   `cilium/state/ip/v1/default/` and `cilium/state/nodes/v1/` (listed, then watched; listed
//!   again after a failure).
//! - **Provides** `Arc<Kvstore>`; contributed to the identity cell, as
//!   `Arc<dyn ClusterNumbering>`, the numbering of `identity-allocation-mode: kvstore`
//!   ([`KvNumbering`]); to node-discovery, as `Arc<dyn RemoteEndpoints>`, the other nodes and
//!   their ip entries ([`KvRemote`]); and a status note for `cellium status` (connection,
//!   endpoints, lease, counts, last error).
//! - **Counts** in `cellium_kvstore_identities_restored_total` the `id/` keys of numbers this
//!   node holds that someone rewrote with other labels: not believed, put back; in
//!   `cellium_kvstore_identity_reallocated_total` the label sets numbered again because
//!   another node took their number while this node's references were gone (a partition
//!   longer than the lease): the identity cell retires the number (`Identities::retire`) and
//!   the endpoints move.
//! - **Depends on** its configuration, the metrics (optional), resources (the node's name and
//!   address, pods' named ports), identity (learns every `id/` key), the endpoint manager (this node's pods) and
//!   IPAM (this node's pod CIDRs).
//! - **Config keys:** `kvstore` (`etcd`, or empty: off), `kvstore-endpoints`
//!   (comma-separated URLs) or `kvstore-opt` (`etcd.config=FILE`: Cilium's etcd configuration
//!   file, with TLS: [`etcd_config`]), `kvstore-lease-ttl` (default 15m),
//!   `kvstore-allocation-timeout` (default 30s).
//! - **Degraded** (`kvstore.session`, `kvstore.identities`, `kvstore.ip-entries`) never for
//!   etcd being away: the agent keeps enforcing what it knows, and the status note says
//!   `unreachable` with the last error; allocations of new label sets fail after
//!   `kvstore-allocation-timeout`. `kvstore.session` is Degraded, with the reason, while the
//!   TLS handshake with etcd is refused (a certificate one side does not accept), which
//!   waiting does not mend.

mod cell;
mod config;
mod error;
pub mod etcd_config;
mod first_try;
mod gc;
mod ips;
pub mod keys;
pub mod mirror;
mod nodes;
mod numbering;
mod store;

use cellium_hive::Module;

pub use config::{
    DEFAULT_ALLOCATION_TIMEOUT, DEFAULT_LEASE_TTL, KvstoreConfig, KvstoreKind, KvstoreOpt,
};
pub use error::{Error, Result};
pub use etcd_config::{Credentials, EtcdAccess};
pub use gc::{GcRound, IdentityGc};
pub use ips::{KvRemote, desired as desired_ips};
pub use nodes::own_entry as own_node_entry;
pub use numbering::KvNumbering;
pub use store::{Kvstore, Refusal, RefusalKind};

/// The `kvstore` module.
pub fn cell() -> Module {
    Module::new(
        "kvstore",
        "Shares identities, ip -> identity entries and nodes with the other nodes through etcd",
    )
    .config::<KvstoreConfig>()
    .provide(cell::provide)
    .contribute(KvNumbering::provide)
    .provide(KvRemote::provide)
    .contribute(cell::start)
}

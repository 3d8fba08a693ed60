//! `cellium-operator`: the cluster-wide cells of Cellium, composed on the hive. Deployed
//! twice for availability; one leads, the others wait.
//!
//! The cells, each a module of this crate (they are the operator's alone; one becomes a
//! crate of its own when a second binary needs it):
//! - `k8s-client` ([`client`]): the API server's client, from the k8s-watchers keys
//!   `k8s-api-server`, `k8s-kubeconfig-path` or the in-cluster service account. Without
//!   any of them the operator refuses to start.
//! - `leader-election` ([`leader`]): a `coordination.k8s.io/v1` Lease; provides
//!   [`Leadership`], whose [`Leadership::is_leader`] watch every writing cell waits on.
//! - `cluster-pool` ([`ipam`]): pod CIDRs for every CiliumNode, cut from the configured
//!   pools.
//! - `gc` ([`gc`]): unused CiliumIdentities, CiliumEndpoints whose Pod is gone, CiliumNodes
//!   whose Node is gone.
//! - `kvstore-gc` ([`kvstore_gc`]): with `kvstore: etcd`, identities in etcd no node uses.
//!
//! # Config keys
//! Defaults < `--config` file < `--config-dir` keys < `CELLIUM_*` environment < flags, as the
//! agent's.
//! - `k8s-api-server`, `k8s-kubeconfig-path`: where the API server is (`node-name` is
//!   accepted and unused).
//! - `leader-election-lease-name` (`cellium-operator`), `leader-election-namespace`
//!   (`kube-system`), `operator-id` (host name and process id),
//!   `leader-election-lease-duration` (15s), `leader-election-renew-deadline` (10s),
//!   `leader-election-retry-period` (2s).
//! - `cluster-pool-ipv4-cidr` (list, none), `cluster-pool-ipv4-mask-size` (24),
//!   `cluster-pool-ipv6-cidr` (list, none), `cluster-pool-ipv6-mask-size` (112).
//! - `identity-gc-interval` (15m), `endpoint-gc-interval` (5m), `nodes-gc-interval` (5m).
//! - `kvstore` (`etcd` or empty), `kvstore-endpoints` or `kvstore-opt` (`etcd.config=FILE`,
//!   with TLS): the agents' etcd, for `kvstore-gc`
//!   (the agent-side keys `kvstore-lease-ttl` and `kvstore-allocation-timeout` are accepted
//!   and unused).
//!
//! `docs/operator.md` tells what each cell does when the API server is away, when the
//! leader is lost in the middle of a write, and with two operators.

pub mod client;
mod config;
mod error;
pub mod gc;
pub mod ipam;
pub mod kvstore_gc;
pub mod leader;

use cellium_hive::{Cell, group};

pub use config::{ClusterPoolConfig, GcConfig, LeaderElectionConfig};
pub use error::{Error, Result};
pub use leader::Leadership;

/// Every cell of the operator: the client, the election, then what the leader does.
pub fn cells() -> Vec<Cell> {
    vec![
        group([client::cell().into(), leader::cell().into()]).into(),
        group([
            ipam::cell().into(),
            gc::cell().into(),
            kvstore_gc::cell().into(),
        ])
        .into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_hive::{ConfigSources, Hive};

    /// A broken wiring (a missing provider, a cycle, a clash of config keys) fails here.
    #[test]
    fn the_operator_graph_populates() {
        let sources = ConfigSources::new().flag("k8s-api-server", "http://127.0.0.1:1");
        let mut hive = Hive::new(cells()).with_config(sources);
        if let Err(e) = hive.populate() {
            panic!("the operator's graph does not populate:\n{e}");
        }
        let text = hive.describe();
        for module in ["k8s-client", "leader-election", "cluster-pool", "gc"] {
            assert!(text.contains(module), "{module} missing from:\n{text}");
        }
    }

    #[test]
    fn without_an_api_server_the_operator_does_not_start() {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            return;
        }
        let mut hive = Hive::new(cells());
        let err = hive.populate().unwrap_err();
        let msg = error::chain(&err);
        assert!(msg.contains("k8s-api-server"), "{msg}");
    }
}

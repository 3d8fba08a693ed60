//! The `kvstore` configuration section, with Cilium's key names where Cilium has them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which key-value store the agent shares state through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvstoreKind {
    /// None (the default): nothing is shared through a key-value store.
    #[default]
    #[serde(rename = "")]
    None,
    /// etcd (v3 API; 3.4 or later).
    Etcd,
}

/// The default of `kvstore-lease-ttl`, Cilium's: how long a node's keys outlive it.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15 * 60);

/// The default of `kvstore-allocation-timeout`: how long a pod with labels no node numbered
/// yet waits for etcd before its CNI ADD fails.
pub const DEFAULT_ALLOCATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The `kvstore` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct KvstoreConfig {
    /// `etcd`, or empty (the default): no kvstore.
    pub kvstore: KvstoreKind,
    /// The etcd members' client URLs, comma-separated (`http://10.0.0.1:2379,...`).
    pub kvstore_endpoints: String,
    /// The TTL of the node's session lease, which every key the node writes for itself is
    /// attached to (default 15 minutes): a node that dies is forgotten by the others this long
    /// after its last keep-alive. Kept alive every third of it.
    #[serde(with = "humantime_serde")]
    pub kvstore_lease_ttl: Duration,
    /// How long an identity allocation waits for etcd before it fails (default 30 s): a pod
    /// with new labels while etcd is unreachable fails its CNI ADD after this, naming etcd.
    #[serde(with = "humantime_serde")]
    pub kvstore_allocation_timeout: Duration,
}

impl Default for KvstoreConfig {
    fn default() -> Self {
        KvstoreConfig {
            kvstore: KvstoreKind::None,
            kvstore_endpoints: String::new(),
            kvstore_lease_ttl: DEFAULT_LEASE_TTL,
            kvstore_allocation_timeout: DEFAULT_ALLOCATION_TIMEOUT,
        }
    }
}

impl KvstoreConfig {
    /// The endpoints, trimmed, empty entries dropped.
    pub fn endpoints(&self) -> Vec<String> {
        self.kvstore_endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect()
    }
}

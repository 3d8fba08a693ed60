//! The `kvstore` configuration section, with Cilium's key names where Cilium has them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

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
    /// Cilium's options of the kvstore: `etcd.config`, the path of an etcd configuration file
    /// (endpoints, CA, client certificate and key: see `etcd_config`).
    pub kvstore_opt: KvstoreOpt,
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
            kvstore_opt: KvstoreOpt::default(),
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

/// `kvstore-opt`: option names to values, as Cilium's flag. Taken as a map in a file
/// (`kvstore-opt: {etcd.config: /var/lib/etcd-config/etcd.config}`), or as a string in any
/// source: Cilium's flag form `etcd.config=/path[,name=value]`, or its ConfigMap's JSON
/// object `{"etcd.config": "/path"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct KvstoreOpt(pub BTreeMap<String, String>);

impl KvstoreOpt {
    /// The value of option `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Cilium's flag form, or a JSON object.
    fn parse(text: &str) -> Result<KvstoreOpt, String> {
        let text = text.trim();
        if text.starts_with('{') {
            return serde_json::from_str(text)
                .map(KvstoreOpt)
                .map_err(|e| format!("not a JSON object of strings: {e}"));
        }
        let mut opts = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(format!("{pair:?} is not name=value"));
            };
            opts.insert(name.trim().to_string(), value.trim().to_string());
        }
        Ok(KvstoreOpt(opts))
    }
}

impl<'de> Deserialize<'de> for KvstoreOpt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = KvstoreOpt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of option names to values, or `name=value[,name=value]`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<KvstoreOpt, E> {
                KvstoreOpt::parse(v).map_err(E::custom)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<KvstoreOpt, A::Error> {
                BTreeMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(KvstoreOpt)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvstore_opt_reads_cilium_s_forms() {
        let path = "/var/lib/etcd-config/etcd.config";
        let want = KvstoreOpt(BTreeMap::from([("etcd.config".into(), path.into())]));
        let flag: KvstoreOpt = serde_json::from_str(&format!("\"etcd.config={path}\"")).unwrap();
        assert_eq!(flag, want);
        let json = format!("{{\"etcd.config\": \"{path}\"}}");
        let configmap: KvstoreOpt = serde_json::from_value(json.into()).unwrap();
        assert_eq!(configmap, want);
        let map: KvstoreOpt =
            serde_json::from_str(&format!("{{\"etcd.config\": \"{path}\"}}")).unwrap();
        assert_eq!(map, want);
        assert!(serde_json::from_str::<KvstoreOpt>("\"etcd.config\"").is_err());
        assert_eq!(
            serde_json::from_str::<KvstoreOpt>("\"\"").unwrap(),
            KvstoreOpt::default()
        );
    }
}

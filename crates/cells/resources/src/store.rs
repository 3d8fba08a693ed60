//! Applied objects kept in the state directory, as a cluster keeps them in etcd: in standalone
//! mode they are the only record of the node's policies, and an agent that forgot them at a
//! restart would open what they close.

use std::sync::Arc;

use cellium_statedir::StateDir;

use crate::key::ObjectKey;

const DIR: &str = "resources";

/// The objects' documents, one YAML file each: `resources/<Kind>~<namespace>~<name>.yaml`
/// (`~` appears in no Kubernetes name).
#[derive(Debug, Clone)]
pub(crate) struct Store(pub(crate) Arc<StateDir>);

impl Store {
    /// Records the document of an applied object.
    pub(crate) fn save(&self, kind: &str, key: &ObjectKey, doc: &serde_yaml::Value) {
        let text = serde_yaml::to_string(doc).unwrap_or_default();
        if let Err(e) = self.0.write(path(kind, key), text.as_bytes()) {
            // The object is applied in memory; only a restart would lose it.
            tracing::error!(kind, object = %key, error = %e, "cannot record the object; it will not survive a restart");
        }
    }

    /// Forgets a deleted object.
    pub(crate) fn remove(&self, kind: &str, key: &ObjectKey) {
        if let Err(e) = self.0.remove(path(kind, key)) {
            tracing::error!(kind, object = %key, error = %e, "cannot forget the deleted object; it would come back at a restart");
        }
    }

    /// Every recorded object as (file name, YAML text), namespaces first (the others need
    /// theirs to exist), then by name.
    pub(crate) fn load(&self) -> Vec<(String, String)> {
        let mut names = self.0.list(DIR).unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot list the recorded objects");
            Vec::new()
        });
        names.sort_by_key(|n| (!n.starts_with("Namespace~"), n.clone()));
        names
            .into_iter()
            .filter(|n| n.ends_with(".yaml"))
            .filter_map(|n| {
                let rel = format!("{DIR}/{n}");
                match self.0.read(&rel) {
                    Ok(Some(bytes)) => Some((rel, String::from_utf8_lossy(&bytes).into_owned())),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::error!(file = %rel, error = %e, "cannot read a recorded object");
                        None
                    }
                }
            })
            .collect()
    }
}

fn path(kind: &str, key: &ObjectKey) -> String {
    format!("{DIR}/{kind}~{}~{}.yaml", key.namespace, key.name)
}

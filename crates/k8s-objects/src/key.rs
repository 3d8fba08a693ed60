//! How objects are named and what every stored kind has in common.

use std::fmt;

/// An object's name: its namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A namespaced key.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// A cluster-scoped key.
    pub fn cluster(name: impl Into<String>) -> ObjectKey {
        ObjectKey::namespaced("", name)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// A kind stored in a table (`cellium_resources::Table`).
pub trait Object: fmt::Debug + Clone + PartialEq + Send + Sync + 'static {
    /// The Kubernetes kind, e.g. `Pod`.
    const KIND: &'static str;
    /// The object's key.
    fn key(&self) -> ObjectKey;
}

//! Namespaces.

use std::collections::BTreeMap;

use crate::key::{Object, ObjectKey};
use crate::validate::{self, FieldError};

/// The label the API server sets on every namespace to its own name, so that policies can
/// select a namespace by name.
pub const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The namespaces that exist in every cluster and cannot be deleted.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// A namespace and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// The name.
    pub name: String,
    /// Its labels, [`NAME_LABEL`] included.
    pub labels: BTreeMap<String, String>,
}

impl Namespace {
    /// A namespace as the API server stores it: labels checked, the name label set.
    pub fn new(name: &str, mut labels: BTreeMap<String, String>) -> Result<Namespace, FieldError> {
        validate::dns1123_label("metadata.name", name)?;
        validate::labels("metadata.labels", &labels)?;
        labels.insert(NAME_LABEL.to_string(), name.to_string());
        Ok(Namespace {
            name: name.to_string(),
            labels,
        })
    }

    /// From the Kubernetes object.
    pub fn from_k8s(ns: k8s_openapi::api::core::v1::Namespace) -> Result<Namespace, FieldError> {
        let name = ns
            .metadata
            .name
            .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
        Namespace::new(&name, ns.metadata.labels.unwrap_or_default())
    }
}

impl Object for Namespace {
    const KIND: &'static str = "Namespace";
    fn key(&self) -> ObjectKey {
        ObjectKey::cluster(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_label_is_always_set() {
        let ns = Namespace::new("prod", BTreeMap::from([(NAME_LABEL.into(), "x".into())])).unwrap();
        assert_eq!(ns.labels[NAME_LABEL], "prod");
    }

    #[test]
    fn bad_names_name_the_field() {
        let err = Namespace::new("Prod", BTreeMap::new()).unwrap_err();
        assert_eq!(err.field, "metadata.name");
    }
}

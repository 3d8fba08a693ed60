//! The kinds `apply` accepts, and how each document becomes a typed object.

use crate::document::{Document, decode};
use crate::objects::{Namespace, Pod};
use crate::validate::FieldError;

/// A decoded, checked object of a supported kind.
#[derive(Debug, Clone)]
pub enum Parsed {
    /// `v1/Namespace`.
    Namespace(Namespace),
    /// `v1/Pod`.
    Pod(Pod),
}

/// The kinds accepted, as `apiVersion/kind`.
pub const SUPPORTED: &[&str] = &["v1/Namespace", "v1/Pod"];

/// Decodes and checks one document.
pub fn parse(doc: &Document) -> Result<Parsed, FieldError> {
    match (doc.api_version.as_str(), doc.kind.as_str()) {
        ("v1", "Namespace") => {
            Namespace::from_k8s(decode(doc.value.clone())?).map(Parsed::Namespace)
        }
        ("v1", "Pod") => Pod::from_k8s(decode(doc.value.clone())?).map(Parsed::Pod),
        _ => Err(unsupported(doc)),
    }
}

/// Checks that a document names an object of a supported kind (for delete, which needs
/// no more than the kind and the name).
pub fn check_kind(doc: &Document) -> Result<(), FieldError> {
    let key = format!("{}/{}", doc.api_version, doc.kind);
    if SUPPORTED.contains(&key.as_str()) {
        Ok(())
    } else {
        Err(unsupported(doc))
    }
}

/// Whether objects of the document's kind live in a namespace.
pub fn namespaced(doc: &Document) -> bool {
    doc.kind != "Namespace"
}

fn unsupported(doc: &Document) -> FieldError {
    FieldError::new(
        "kind",
        format!(
            "unsupported kind {}/{} (supported: {})",
            doc.api_version,
            doc.kind,
            SUPPORTED.join(", ")
        ),
    )
}

//! The checks the Kubernetes API server makes on names and labels.

use std::collections::BTreeMap;

use crate::gap::GapScope;

/// A failed check: the field (a dotted path) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, e.g. `metadata.labels`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
    /// For a policy rejected whole, the endpoints it could have restricted, when more of it
    /// could be read than its name ([`crate::gap`]); `None`: as its name tells.
    pub scope: Option<GapScope>,
}

impl FieldError {
    /// A failed check of `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            reason: reason.into(),
            scope: None,
        }
    }

    /// The same error, naming what the rejected object could have restricted.
    pub fn scoped(self, scope: Option<GapScope>) -> FieldError {
        FieldError { scope, ..self }
    }
}

/// A DNS-1123 label: at most 63 lower-case alphanumerics or '-', alphanumeric at both ends
/// (namespace names, port names' cousins).
pub fn dns1123_label(field: &str, value: &str) -> Result<(), FieldError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && alnum_ends(value, |b| b.is_ascii_lowercase() || b.is_ascii_digit());
    ok.then_some(()).ok_or_else(|| {
        FieldError::new(
            field,
            format!("{value:?} is not a DNS-1123 label (at most 63 characters: a-z, 0-9 and '-', starting and ending with a letter or digit)"),
        )
    })
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels (object names).
pub fn dns1123_subdomain(field: &str, value: &str) -> Result<(), FieldError> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|l| dns1123_label(field, l).is_ok());
    ok.then_some(()).ok_or_else(|| {
        FieldError::new(
            field,
            format!("{value:?} is not a DNS-1123 subdomain (at most 253 characters: a-z, 0-9, '-' and '.', starting and ending with a letter or digit)"),
        )
    })
}

/// Label keys and values as Kubernetes accepts them.
pub fn labels(field: &str, labels: &BTreeMap<String, String>) -> Result<(), FieldError> {
    for (key, value) in labels {
        label_key(&format!("{field}[{key}]"), key)?;
        label_value(&format!("{field}[{key}]"), value)?;
    }
    Ok(())
}

/// A label key: an optional DNS subdomain prefix and '/', then a name of at most 63
/// alphanumerics, '-', '_' or '.', alphanumeric at both ends.
pub fn label_key(field: &str, key: &str) -> Result<(), FieldError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        dns1123_subdomain(field, prefix).map_err(|_| {
            FieldError::new(
                field,
                format!("label key {key:?} has an invalid prefix (it must be a DNS subdomain)"),
            )
        })?;
    }
    if !qualified_name(name) {
        return Err(FieldError::new(
            field,
            format!(
                "label key {key:?} is invalid (a name of at most 63 characters: alphanumerics, '-', '_' or '.', alphanumeric at both ends)"
            ),
        ));
    }
    Ok(())
}

/// A label value: empty, or like a key's name part.
pub fn label_value(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() || qualified_name(value) {
        return Ok(());
    }
    Err(FieldError::new(
        field,
        format!(
            "label value {value:?} is invalid (at most 63 characters: alphanumerics, '-', '_' or '.', alphanumeric at both ends)"
        ),
    ))
}

fn qualified_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && alnum_ends(s, |b| b.is_ascii_alphanumeric())
}

fn alnum_ends(s: &str, ok: impl Fn(u8) -> bool) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(a), Some(b)) => ok(*a) && ok(*b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_label("f", "kube-system").is_ok());
        assert!(dns1123_label("f", "Kube").is_err());
        assert!(dns1123_label("f", "-a").is_err());
        assert!(dns1123_label("f", &"a".repeat(64)).is_err());
        assert!(dns1123_subdomain("f", "web-0.example").is_ok());
        assert!(dns1123_subdomain("f", "web..0").is_err());
    }

    #[test]
    fn label_keys_and_values() {
        assert!(label_key("f", "app").is_ok());
        assert!(label_key("f", "app.kubernetes.io/name").is_ok());
        assert!(label_key("f", "k8s:io.kubernetes.pod.namespace").is_err());
        assert!(label_key("f", "Bad/x").is_err());
        assert!(label_value("f", "").is_ok());
        assert!(label_value("f", "v1.2_b-c").is_ok());
        let err = label_value("metadata.labels[app]", "no spaces").unwrap_err();
        assert_eq!(err.field, "metadata.labels[app]");
        assert!(err.reason.contains("\"no spaces\""), "{}", err.reason);
    }
}

//! Multi-document YAML: splitting, identifying and strictly decoding each document.

use std::fmt;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

use crate::validate::FieldError;

/// One YAML document of an applied text.
#[derive(Debug, Clone)]
pub struct Document {
    /// Its position in the text, from 1 (items of a `List` share their list's position).
    pub index: usize,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name`, if set.
    pub name: Option<String>,
    /// `metadata.namespace`, if set.
    pub namespace: Option<String>,
    /// The whole document.
    pub value: Value,
}

impl Document {
    /// `Pod default/web`, as messages name the object.
    pub fn describe(&self) -> String {
        let name = self.name.as_deref().unwrap_or("<unnamed>");
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{name}", self.kind),
            None => format!("{} {name}", self.kind),
        }
    }
}

/// A document that cannot be applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// Where the text came from.
    pub source: String,
    /// The document's position, from 1.
    pub index: usize,
    /// The object (`Pod default/web`), if it got that far.
    pub object: Option<String>,
    /// The field at fault (a dotted path), or empty for the document as a whole.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.source, self.index)?;
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Splits `text` into its documents; empty documents are skipped, `List`s are unrolled.
pub fn split(source: &str, text: &str) -> Result<Vec<Document>, DocumentError> {
    let mut docs = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let fail = |field: &str, reason: String| DocumentError {
            source: source.to_string(),
            index,
            object: None,
            field: field.to_string(),
            reason,
        };
        let value = Value::deserialize(de).map_err(|e| fail("", format!("invalid YAML: {e}")))?;
        if value.is_null() {
            continue;
        }
        let header = header_of(&value).map_err(|e| fail(&e.field, e.reason))?;
        if header.1 == "List" {
            let items = value
                .get("items")
                .and_then(Value::as_sequence)
                .cloned()
                .unwrap_or_default();
            for (j, item) in items.into_iter().enumerate() {
                let (api_version, kind, name, namespace) = header_of(&item)
                    .map_err(|e| fail(&format!("items[{j}].{}", e.field), e.reason))?;
                docs.push(Document {
                    index,
                    api_version,
                    kind,
                    name,
                    namespace,
                    value: item,
                });
            }
            continue;
        }
        let (api_version, kind, name, namespace) = header;
        docs.push(Document {
            index,
            api_version,
            kind,
            name,
            namespace,
            value,
        });
    }
    Ok(docs)
}

type Header = (String, String, Option<String>, Option<String>);

fn header_of(value: &Value) -> Result<Header, FieldError> {
    if !value.is_mapping() {
        return Err(FieldError::new(
            "",
            "a document must be a mapping (an object)",
        ));
    }
    let text = |v: Option<&Value>, field: &str| -> Result<Option<String>, FieldError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(FieldError::new(field, "must be a string")),
        }
    };
    let api_version = text(value.get("apiVersion"), "apiVersion")?
        .ok_or_else(|| FieldError::new("apiVersion", "is required"))?;
    let kind =
        text(value.get("kind"), "kind")?.ok_or_else(|| FieldError::new("kind", "is required"))?;
    let meta = value.get("metadata");
    let name = text(meta.and_then(|m| m.get("name")), "metadata.name")?;
    let namespace = text(meta.and_then(|m| m.get("namespace")), "metadata.namespace")?;
    Ok((api_version, kind, name, namespace))
}

/// Decodes `value` as `T`, strictly: a type error names the field's path, and a field `T`
/// does not know is an error too, as `kubectl apply --validate=strict` makes it (a misspelt
/// field in a policy would otherwise silently widen or narrow what it allows).
pub fn decode<T: DeserializeOwned>(value: Value) -> Result<T, FieldError> {
    let (decoded, unknown) = decode_noting(value)?;
    match unknown.into_iter().next() {
        Some(field) => Err(FieldError::new(field, "unknown field")),
        None => Ok(decoded),
    }
}

/// Decodes as `T` from `de`: a type error names the field's path; the fields `T` does not
/// know are skipped and returned (as `spec.ports[0].newField`), for the caller to judge.
pub fn decode_noting<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<(T, Vec<String>), FieldError> {
    let mut unknown = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(render(&path));
    let de = serde_ignored::Deserializer::new(de, &mut record);
    let decoded: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." { String::new() } else { field };
        FieldError::new(field, e.into_inner().to_string())
    })?;
    Ok((decoded, unknown))
}

/// A path as `spec.containers[0].name`: the form serde_path_to_error uses, without the
/// markers serde_ignored puts for `Option` and newtype layers.
fn render(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", render(parent)),
        Path::Map { parent, key } => match render(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => render(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lists_and_empty_ones() {
        let text = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\n\
                    apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: a}}\n";
        let docs = split("f.yaml", text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].describe(), "Namespace a");
        assert_eq!((docs[1].index, docs[1].describe()), (3, "Pod a/p".into()));
    }

    #[test]
    fn broken_documents_are_located() {
        let err = split("f.yaml", "apiVersion: v1\nkind: Pod\n---\nkind: Pod\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.yaml: document 2: apiVersion: is required"
        );
        let err = split("f.yaml", "a: [\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f.yaml: document 1: invalid YAML"),
            "{err}"
        );
    }

    #[test]
    fn decoding_names_bad_and_unknown_fields() {
        let value: Value = serde_yaml::from_str(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: x}]}]}",
        )
        .unwrap();
        let err = decode::<k8s_openapi::api::core::v1::Pod>(value).unwrap_err();
        assert_eq!(err.field, "spec.containers[0].ports[0].containerPort");
        let value: Value = serde_yaml::from_str(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, lables: {a: b}}\nspec: {containers: [{name: c}]}",
        )
        .unwrap();
        let err = decode::<k8s_openapi::api::core::v1::Pod>(value).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.reason.as_str()),
            ("metadata.lables", "unknown field")
        );
    }
}

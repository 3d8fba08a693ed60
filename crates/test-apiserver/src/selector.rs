//! Label and field selectors, parsed from the `labelSelector` / `fieldSelector` query parameters.

use crate::error::{Error, Result};
use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    /// `a=b`, `a==b`
    Eq(String, String),
    /// `a!=b` (also true when the label is absent, as in Kubernetes)
    NotEq(String, String),
    /// `a in (x,y)`
    In(String, Vec<String>),
    /// `a notin (x)` (true when absent)
    NotIn(String, Vec<String>),
    /// `a`
    Exists(String),
    /// `!a`
    NotExists(String),
}

/// A parsed `labelSelector`: every requirement must hold (comma = AND).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

impl LabelSelector {
    /// Parses the Kubernetes label selector syntax.
    pub fn parse(text: &str) -> Result<LabelSelector> {
        let mut reqs = Vec::new();
        for term in split_top_level(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_label_term(term)?);
        }
        Ok(LabelSelector { reqs })
    }

    /// Whether an object (its `metadata.labels`) matches.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Splits on commas that are not inside `( … )`.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_label_term(term: &str) -> Result<LabelReq> {
    let bad = || Error::BadRequest(format!("unable to parse requirement: {term:?}"));
    if let Some(key) = term.strip_prefix('!') {
        return Ok(LabelReq::NotExists(valid_key(key.trim()).ok_or_else(bad)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(LabelReq::NotEq(
            valid_key(k.trim()).ok_or_else(bad)?,
            v.trim().into(),
        ));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelReq::Eq(
            valid_key(k.trim()).ok_or_else(bad)?,
            v.trim().into(),
        ));
    }
    if let Some(open) = term.find('(') {
        let close = term.rfind(')').filter(|c| *c > open).ok_or_else(bad)?;
        let values: Vec<String> = term[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        let head: Vec<&str> = term[..open].split_whitespace().collect();
        return match head.as_slice() {
            [k, "in"] => Ok(LabelReq::In(valid_key(k).ok_or_else(bad)?, values)),
            [k, "notin"] => Ok(LabelReq::NotIn(valid_key(k).ok_or_else(bad)?, values)),
            _ => Err(bad()),
        };
    }
    Ok(LabelReq::Exists(valid_key(term).ok_or_else(bad)?))
}

fn valid_key(key: &str) -> Option<String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| key.to_string())
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`, comma = AND.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    reqs: Vec<(Vec<String>, bool, String)>,
}

impl FieldSelector {
    /// Parses a field selector; any dotted path is accepted (`spec.nodeName`).
    pub fn parse(text: &str) -> Result<FieldSelector> {
        let mut reqs = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, eq, value) = if let Some((p, v)) = term.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, true, v)
            } else {
                return Err(Error::BadRequest(format!(
                    "invalid field selector: {term:?}"
                )));
            };
            let path: Vec<String> = path.trim().split('.').map(str::to_string).collect();
            reqs.push((path, eq, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    /// Whether an object matches; an absent field compares as the empty string.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, eq, want)| {
            let mut cur = Some(obj);
            for part in path {
                cur = cur.and_then(|v| v.get(part));
            }
            let have = match cur {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (have == *want) == *eq
        })
    }
}

/// A label and a field selector together, as a LIST or WATCH carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// `labelSelector`
    pub labels: LabelSelector,
    /// `fieldSelector`
    pub fields: FieldSelector,
}

impl Selector {
    /// Whether the object passes both.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns1", "labels": labels}, "spec": {"nodeName": "n1", "priority": 5}})
    }

    #[test]
    fn equality_and_inequality() {
        let p = pod(json!({"app": "web", "tier": "fe"}));
        assert!(LabelSelector::parse("app=web").unwrap().matches(&p));
        assert!(LabelSelector::parse("app==web").unwrap().matches(&p));
        assert!(!LabelSelector::parse("app!=web").unwrap().matches(&p));
        assert!(LabelSelector::parse("app!=db").unwrap().matches(&p));
        assert!(LabelSelector::parse("missing!=x").unwrap().matches(&p));
        assert!(LabelSelector::parse("app=web,tier=fe").unwrap().matches(&p));
        assert!(!LabelSelector::parse("app=web,tier=be").unwrap().matches(&p));
    }

    #[test]
    fn set_based() {
        let p = pod(json!({"app": "web"}));
        assert!(
            LabelSelector::parse("app in (db, web)")
                .unwrap()
                .matches(&p)
        );
        assert!(!LabelSelector::parse("app in (db)").unwrap().matches(&p));
        assert!(LabelSelector::parse("app notin (db)").unwrap().matches(&p));
        assert!(
            !LabelSelector::parse("app notin (db,web)")
                .unwrap()
                .matches(&p)
        );
        assert!(LabelSelector::parse("other notin (x)").unwrap().matches(&p));
        assert!(LabelSelector::parse("app").unwrap().matches(&p));
        assert!(!LabelSelector::parse("!app").unwrap().matches(&p));
        assert!(
            LabelSelector::parse("!other,app in (web,x),app")
                .unwrap()
                .matches(&p)
        );
        assert!(
            !LabelSelector::parse("other")
                .unwrap()
                .matches(&pod(Value::Null))
        );
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b c").is_err());
        assert!(FieldSelector::parse("spec.nodeName").is_err());
    }

    #[test]
    fn field_paths() {
        let p = pod(json!({}));
        assert!(
            FieldSelector::parse("spec.nodeName=n1")
                .unwrap()
                .matches(&p)
        );
        assert!(
            FieldSelector::parse("spec.nodeName==n1,metadata.namespace=ns1")
                .unwrap()
                .matches(&p)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName!=n1")
                .unwrap()
                .matches(&p)
        );
        assert!(FieldSelector::parse("metadata.name=p").unwrap().matches(&p));
        assert!(FieldSelector::parse("spec.priority=5").unwrap().matches(&p));
        assert!(
            FieldSelector::parse("spec.hostNetwork=")
                .unwrap()
                .matches(&p)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=n2")
                .unwrap()
                .matches(&p)
        );
    }
}

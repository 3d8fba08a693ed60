//! One requirement of a selector: a key, an operator and values.

use std::collections::BTreeSet;
use std::fmt;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::cidr;
use crate::error::{Error, Result};
use crate::label::{Label, check_source, forbidden, source, split_source};
use crate::labels::Labels;

/// How a requirement compares a key's values, as in Kubernetes label selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Operator {
    /// Some label with the key has one of the values.
    In,
    /// No label with the key has any of the values (so a missing key matches).
    NotIn,
    /// Some label has the key.
    Exists,
    /// No label has the key.
    DoesNotExist,
}

/// The key of a requirement, with Cilium's source semantics.
///
/// `k8s:app` matches the key `app` of `k8s:` labels only; `any:app`, or plain `app`,
/// matches the key `app` under every source. A `cidr:` key matches every `cidr:` label
/// whose prefix lies inside its own (`cidr:10.0.0.0/8` matches `cidr:10.1.0.0/16`), so a
/// selector on a prefix selects the identities of the prefixes it contains.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    source: String,
    key: String,
    cidr: Option<IpNet>,
}

impl Key {
    /// Parses `source:key` or `key` (source `any`), checking the key as Kubernetes checks a
    /// label key (a `cidr:` key must be a prefix instead).
    pub fn parse(text: &str) -> Result<Key> {
        let bad = |reason: String| Error::InvalidRequirement {
            key: text.to_string(),
            reason,
        };
        let (source, key) = split_source(text).unwrap_or((source::ANY, text));
        check_source(source).map_err(bad)?;
        if source == source::CIDR {
            let net =
                cidr::decode(key).ok_or_else(|| bad(format!("{key:?} is not an IP prefix")))?;
            return Ok(Key {
                source: source.to_string(),
                key: cidr::encode(net),
                cidr: Some(net),
            });
        }
        qualified_name(key).map_err(bad)?;
        Ok(Key {
            source: source.to_string(),
            key: key.to_string(),
            cidr: None,
        })
    }

    /// The source (`any` when the key matches under every source).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The key without its source.
    pub fn name(&self) -> &str {
        &self.key
    }

    /// Whether `label` has this key.
    pub fn matches(&self, label: &Label) -> bool {
        if self.source != source::ANY && self.source != label.source {
            return false;
        }
        match self.cidr {
            Some(net) => label.cidr_prefix().is_some_and(|p| net.contains(&p)),
            None => self.key == label.key,
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.key)
    }
}

/// One requirement: `key In (values)`, `key NotIn (values)`, `key Exists`,
/// `key DoesNotExist`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    key: Key,
    operator: Operator,
    values: BTreeSet<String>,
}

impl Requirement {
    /// A requirement, checked as the Kubernetes API server checks one: `In` and `NotIn`
    /// need at least one value, `Exists` and `DoesNotExist` none, and every value must be a
    /// valid label value.
    pub fn new<V: Into<String>>(
        key: &str,
        operator: Operator,
        values: impl IntoIterator<Item = V>,
    ) -> Result<Requirement> {
        let parsed = Key::parse(key)?;
        let values: BTreeSet<String> = values.into_iter().map(Into::into).collect();
        let bad = |reason: String| Error::InvalidRequirement {
            key: key.to_string(),
            reason,
        };
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(bad(format!("{operator:?} needs at least one value")));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(bad(format!("{operator:?} takes no values")));
            }
            _ => {}
        }
        for value in &values {
            label_value(value).map_err(bad)?;
        }
        Ok(Requirement {
            key: parsed,
            operator,
            values,
        })
    }

    /// `key In (value)`.
    pub fn equals(key: &str, value: &str) -> Result<Requirement> {
        Requirement::new(key, Operator::In, [value])
    }

    /// `key Exists`.
    pub fn exists(key: &str) -> Result<Requirement> {
        Requirement::new(key, Operator::Exists, None::<String>)
    }

    /// `source:key In (value)` for one label, taken as it is (not checked), so that a
    /// selector can be built from any label set.
    pub fn from_label(label: &Label) -> Requirement {
        let cidr = label.cidr_prefix();
        Requirement {
            key: Key {
                source: label.source.clone(),
                key: cidr.map(cidr::encode).unwrap_or_else(|| label.key.clone()),
                cidr,
            },
            operator: Operator::In,
            values: BTreeSet::from([label.value.clone()]),
        }
    }

    /// `cidr:<net> Exists`.
    pub(crate) fn cidr_exists(net: IpNet) -> Requirement {
        let net = net.trunc();
        Requirement {
            key: Key {
                source: source::CIDR.to_string(),
                key: cidr::encode(net),
                cidr: Some(net),
            },
            operator: Operator::Exists,
            values: BTreeSet::new(),
        }
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, sorted.
    pub fn values(&self) -> &BTreeSet<String> {
        &self.values
    }

    /// Whether `labels` satisfy the requirement.
    pub fn matches(&self, labels: &Labels) -> bool {
        match self.operator {
            Operator::In => self.any_value_in(labels),
            Operator::NotIn => !self.any_value_in(labels),
            Operator::Exists => self.has_key(labels),
            Operator::DoesNotExist => !self.has_key(labels),
        }
    }

    fn has_key(&self, labels: &Labels) -> bool {
        if self.key.cidr.is_none() && self.key.source != source::ANY {
            return labels.get(&self.key.source, &self.key.key).is_some();
        }
        labels.iter().any(|l| self.key.matches(l))
    }

    fn any_value_in(&self, labels: &Labels) -> bool {
        if self.key.cidr.is_none() && self.key.source != source::ANY {
            return labels
                .get(&self.key.source, &self.key.key)
                .is_some_and(|l| self.values.contains(&l.value));
        }
        labels
            .iter()
            .any(|l| self.key.matches(l) && self.values.contains(&l.value))
    }
}

impl fmt::Display for Requirement {
    /// `key=v`, `key in (a,b)`, `key!=v`, `key notin (a,b)`, `key`, `!key`: the Kubernetes
    /// selector syntax, with the key's source always written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = || self.values.iter().cloned().collect::<Vec<_>>().join(",");
        match self.operator {
            Operator::In if self.values.len() == 1 => write!(f, "{}={}", self.key, values()),
            Operator::In => write!(f, "{} in ({})", self.key, values()),
            Operator::NotIn if self.values.len() == 1 => {
                write!(f, "{}!={}", self.key, values())
            }
            Operator::NotIn => write!(f, "{} notin ({})", self.key, values()),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

/// A Kubernetes label key: an optional DNS subdomain prefix and `/`, then a name of at most
/// 63 characters, alphanumeric at both ends, with `-`, `_` and `.` inside.
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "the key's prefix {prefix:?} must be a lowercase DNS subdomain"
            ));
        }
    }
    if name.is_empty() {
        return Err("the key's name is empty".into());
    }
    name_like(name).map_err(|r| format!("the key's name {name:?} {r}"))
}

/// A label value: empty, or a name as in [`qualified_name`].
fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    name_like(value).map_err(|r| format!("the value {value:?} {r}"))
}

fn name_like(text: &str) -> Result<(), String> {
    if text.len() > 63 {
        return Err("is longer than 63 characters".into());
    }
    if let Some(c) = text.chars().find(|c| forbidden(*c)) {
        return Err(format!("may not contain {c:?}"));
    }
    let inner_ok = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ends_ok = text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric());
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err("must be alphanumeric at both ends, with only '-', '_' and '.' inside".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &str) -> Labels {
        s.parse().unwrap()
    }

    #[test]
    fn a_key_without_source_matches_every_source() {
        let r = Requirement::equals("app", "web").unwrap();
        assert_eq!(r.key().source(), "any");
        assert!(r.matches(&labels("k8s:app=web")));
        assert!(r.matches(&labels("unspec:app=web")));
        assert!(!r.matches(&labels("k8s:app=db")));
        let same = Requirement::equals("any:app", "web").unwrap();
        assert_eq!(r, same);
    }

    #[test]
    fn a_key_with_source_matches_that_source_only() {
        let r = Requirement::equals("k8s:app", "web").unwrap();
        assert!(r.matches(&labels("k8s:app=web")));
        assert!(!r.matches(&labels("unspec:app=web")));
        let host = Requirement::exists("reserved:host").unwrap();
        assert!(host.matches(&labels("reserved:host")));
        assert!(!host.matches(&labels("k8s:host=x")));
    }

    #[test]
    fn operators_follow_kubernetes() {
        let l = labels("k8s:tier=db,k8s:app=a");
        let r = |op, vals: &[&str]| Requirement::new("tier", op, vals.iter().copied()).unwrap();
        assert!(r(Operator::In, &["web", "db"]).matches(&l));
        assert!(!r(Operator::In, &["web"]).matches(&l));
        assert!(r(Operator::NotIn, &["web"]).matches(&l));
        assert!(!r(Operator::NotIn, &["db"]).matches(&l));
        // A missing key satisfies NotIn and DoesNotExist, as in Kubernetes.
        assert!(r(Operator::NotIn, &["x"]).matches(&labels("k8s:app=a")));
        assert!(r(Operator::Exists, &[]).matches(&l));
        assert!(!r(Operator::DoesNotExist, &[]).matches(&l));
        assert!(r(Operator::DoesNotExist, &[]).matches(&labels("k8s:app=a")));
    }

    #[test]
    fn cidr_keys_select_the_prefixes_they_contain() {
        let r = Requirement::exists("cidr:10.0.0.0/8").unwrap();
        assert!(r.matches(&labels("cidr:10.1.0.0/16")));
        assert!(r.matches(&labels("cidr:10.0.0.0/8")));
        assert!(!r.matches(&labels("cidr:0.0.0.0/0")));
        assert!(!r.matches(&labels("cidr:11.0.0.0/16")));
        assert!(!r.matches(&labels("cidr:fd00--0/64")));
        let v6 = Requirement::exists("cidr:fd00::/16").unwrap();
        assert_eq!(v6.to_string(), "cidr:fd00--0/16");
        assert!(v6.matches(&labels("cidr:fd00-1--0/64")));
    }

    #[test]
    fn bad_requirements_are_refused() {
        for (key, op, values, reason) in [
            ("app", Operator::In, vec![], "In needs at least one value"),
            ("app", Operator::Exists, vec!["x"], "Exists takes no values"),
            ("app", Operator::In, vec!["a b"], "may not contain ' '"),
            ("app", Operator::In, vec!["-a"], "alphanumeric at both ends"),
            ("", Operator::Exists, vec![], "the key's name is empty"),
            ("Example.com/app", Operator::Exists, vec![], "DNS subdomain"),
            (
                "cidr:10.0.0.1",
                Operator::Exists,
                vec![],
                "not an IP prefix",
            ),
            (
                "K8S:app",
                Operator::Exists,
                vec![],
                "may hold only lowercase",
            ),
        ] {
            let err = Requirement::new(key, op, values).unwrap_err().to_string();
            assert!(err.contains(reason), "{key}: {err}");
        }
        let long = "a".repeat(64);
        assert!(Requirement::equals("app", &long).is_err());
        assert!(Requirement::equals("example.com/app", "").is_ok());
    }

    #[test]
    fn display_is_the_kubernetes_syntax_with_sources() {
        let r = |k, op, v: &[&str]| {
            Requirement::new(k, op, v.iter().copied())
                .unwrap()
                .to_string()
        };
        assert_eq!(r("app", Operator::In, &["web"]), "any:app=web");
        assert_eq!(r("app", Operator::In, &["b", "a"]), "any:app in (a,b)");
        assert_eq!(r("k8s:app", Operator::NotIn, &["a"]), "k8s:app!=a");
        assert_eq!(
            r("k8s:app", Operator::NotIn, &["a", "b"]),
            "k8s:app notin (a,b)"
        );
        assert_eq!(r("reserved:host", Operator::Exists, &[]), "reserved:host");
        assert_eq!(r("app", Operator::DoesNotExist, &[]), "!any:app");
    }
}

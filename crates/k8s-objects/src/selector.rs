//! Label selectors as policies write them: `matchLabels` and `matchExpressions`.
//!
//! Two flavours are checked: Kubernetes selectors (NetworkPolicy's `podSelector` and
//! `namespaceSelector`), whose keys are plain label keys, and Cilium selectors
//! (`endpointSelector`, `fromEndpoints`, ...), whose keys may carry a label source prefix
//! (`k8s:app`, `reserved:host`, `any:app`).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::validate::{self, FieldError};

/// A selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SelectorOperator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl fmt::Display for SelectorOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SelectorOperator::In => "In",
            SelectorOperator::NotIn => "NotIn",
            SelectorOperator::Exists => "Exists",
            SelectorOperator::DoesNotExist => "DoesNotExist",
        })
    }
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LabelRequirement {
    /// The label key (with its source prefix, if the selector had one).
    pub key: String,
    /// The operator.
    pub operator: SelectorOperator,
    /// The values (only for `In` and `NotIn`).
    pub values: Vec<String>,
}

/// A label selector. The empty selector selects everything it is applied to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements, all of which must hold.
    pub match_expressions: Vec<LabelRequirement>,
}

/// Which key syntax a selector accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorFlavor {
    /// Plain Kubernetes label keys.
    Kubernetes,
    /// Kubernetes label keys with an optional Cilium source prefix.
    Cilium,
}

/// The label sources a Cilium selector key may name.
pub const SELECTOR_SOURCES: [&str; 4] = ["k8s", "any", "reserved", "unspec"];

/// The wire shape of a selector, shared by the Kubernetes and Cilium kinds.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawSelector {
    /// `matchLabels`.
    #[serde(default)]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// `matchExpressions`.
    #[serde(default)]
    pub match_expressions: Option<Vec<RawRequirement>>,
}

/// The wire shape of one requirement.
#[derive(Debug, Clone, Deserialize)]
pub struct RawRequirement {
    /// `key`.
    pub key: String,
    /// `operator`.
    pub operator: String,
    /// `values`.
    #[serde(default)]
    pub values: Option<Vec<String>>,
}

impl LabelSelector {
    /// Whether the selector has no requirement at all.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Checks and converts the Kubernetes type.
    pub fn from_k8s(
        field: &str,
        sel: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
        flavor: SelectorFlavor,
    ) -> Result<LabelSelector, FieldError> {
        let raw = RawSelector {
            match_labels: sel.match_labels,
            match_expressions: sel.match_expressions.map(|exprs| {
                exprs
                    .into_iter()
                    .map(|e| RawRequirement {
                        key: e.key,
                        operator: e.operator,
                        values: e.values,
                    })
                    .collect()
            }),
        };
        LabelSelector::from_raw(field, raw, flavor)
    }

    /// Checks a selector as the API server (or Cilium's CRD validation) would.
    pub fn from_raw(
        field: &str,
        raw: RawSelector,
        flavor: SelectorFlavor,
    ) -> Result<LabelSelector, FieldError> {
        let match_labels = raw.match_labels.unwrap_or_default();
        for (key, value) in &match_labels {
            let f = format!("{field}.matchLabels[{key}]");
            selector_key(&f, key, flavor)?;
            validate::label_value(&f, value)?;
        }
        let mut match_expressions = Vec::new();
        for (i, req) in raw
            .match_expressions
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let f = format!("{field}.matchExpressions[{i}]");
            selector_key(&format!("{f}.key"), &req.key, flavor)?;
            let operator = match req.operator.as_str() {
                "In" => SelectorOperator::In,
                "NotIn" => SelectorOperator::NotIn,
                "Exists" => SelectorOperator::Exists,
                "DoesNotExist" => SelectorOperator::DoesNotExist,
                other => {
                    return Err(FieldError::new(
                        format!("{f}.operator"),
                        format!(
                            "unsupported operator {other:?} (expected In, NotIn, Exists or DoesNotExist)"
                        ),
                    ));
                }
            };
            let values = req.values.unwrap_or_default();
            match operator {
                SelectorOperator::In | SelectorOperator::NotIn if values.is_empty() => {
                    return Err(FieldError::new(
                        format!("{f}.values"),
                        format!("must be non-empty when the operator is {operator}"),
                    ));
                }
                SelectorOperator::Exists | SelectorOperator::DoesNotExist if !values.is_empty() => {
                    return Err(FieldError::new(
                        format!("{f}.values"),
                        format!("must be empty when the operator is {operator}"),
                    ));
                }
                _ => {}
            }
            for (j, value) in values.iter().enumerate() {
                validate::label_value(&format!("{f}.values[{j}]"), value)?;
            }
            match_expressions.push(LabelRequirement {
                key: req.key,
                operator,
                values,
            });
        }
        Ok(LabelSelector {
            match_labels,
            match_expressions,
        })
    }
}

impl fmt::Display for LabelSelector {
    /// `app=web,tier in (a,b),!debug`, as kubectl prints selectors; `{}` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("{}");
        }
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for r in &self.match_expressions {
            parts.push(match r.operator {
                SelectorOperator::In => format!("{} in ({})", r.key, r.values.join(",")),
                SelectorOperator::NotIn => format!("{} notin ({})", r.key, r.values.join(",")),
                SelectorOperator::Exists => r.key.clone(),
                SelectorOperator::DoesNotExist => format!("!{}", r.key),
            });
        }
        f.write_str(&parts.join(","))
    }
}

/// A selector key: a label key, with (Cilium only) an optional known source prefix.
fn selector_key(field: &str, key: &str, flavor: SelectorFlavor) -> Result<(), FieldError> {
    let name = match (flavor, key.split_once(':')) {
        (SelectorFlavor::Cilium, Some((source, name))) => {
            if !SELECTOR_SOURCES.contains(&source) {
                return Err(FieldError::new(
                    field,
                    format!(
                        "label key {key:?} names an unsupported source {source:?} (expected one of {})",
                        SELECTOR_SOURCES.join(", ")
                    ),
                ));
            }
            name
        }
        _ => key,
    };
    validate::label_key(field, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(yaml: &str) -> RawSelector {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn operators_and_values_are_checked() {
        let ok = LabelSelector::from_raw(
            "s",
            raw("{matchLabels: {app: web}, matchExpressions: [{key: tier, operator: In, values: [a, b]}, {key: debug, operator: DoesNotExist}]}"),
            SelectorFlavor::Kubernetes,
        )
        .unwrap();
        assert_eq!(ok.to_string(), "app=web,tier in (a,b),!debug");
        let err = LabelSelector::from_raw(
            "s",
            raw("{matchExpressions: [{key: tier, operator: In}]}"),
            SelectorFlavor::Kubernetes,
        )
        .unwrap_err();
        assert_eq!(err.field, "s.matchExpressions[0].values");
        assert!(err.reason.contains("non-empty"), "{}", err.reason);
        let err = LabelSelector::from_raw(
            "s",
            raw("{matchExpressions: [{key: tier, operator: Exists, values: [a]}]}"),
            SelectorFlavor::Kubernetes,
        )
        .unwrap_err();
        assert!(err.reason.contains("must be empty"), "{}", err.reason);
        let err = LabelSelector::from_raw(
            "s",
            raw("{matchExpressions: [{key: tier, operator: Like, values: [a]}]}"),
            SelectorFlavor::Kubernetes,
        )
        .unwrap_err();
        assert_eq!(err.field, "s.matchExpressions[0].operator");
        assert!(err.reason.contains("\"Like\""), "{}", err.reason);
    }

    #[test]
    fn source_prefixes_only_in_cilium_selectors() {
        let yaml = "{matchLabels: {'k8s:io.kubernetes.pod.namespace': shop, 'reserved:host': ''}}";
        assert!(LabelSelector::from_raw("s", raw(yaml), SelectorFlavor::Cilium).is_ok());
        let err = LabelSelector::from_raw("s", raw(yaml), SelectorFlavor::Kubernetes).unwrap_err();
        assert_eq!(err.field, "s.matchLabels[k8s:io.kubernetes.pod.namespace]");
        let err = LabelSelector::from_raw(
            "s",
            raw("{matchLabels: {'foo:app': web}}"),
            SelectorFlavor::Cilium,
        )
        .unwrap_err();
        assert!(
            err.reason.contains("unsupported source \"foo\""),
            "{}",
            err.reason
        );
        let err = LabelSelector::from_raw(
            "s",
            raw("{matchLabels: {app: 'not valid'}}"),
            SelectorFlavor::Cilium,
        )
        .unwrap_err();
        assert!(err.reason.contains("label value"), "{}", err.reason);
    }
}

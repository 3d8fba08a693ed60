//! Gaps in policy: objects policy depends on that are not in force, and which endpoints each
//! could have restricted (the scope the policy repository locks down for it).
//!
//! A policy that is not in force cannot restrict anything, so the endpoints it would have
//! selected must fail closed; but only those: one tenant's policy using a feature this
//! version lacks must not lock down every other tenant's pods. What an object could have
//! selected is read from as much of it as can be read:
//! - a Cilium policy whose every rule's `endpointSelector` reads: those selectors (in its
//!   namespace when namespaced); a rule with only a `nodeSelector` selects the node, no pod;
//! - any other namespaced policy: its namespace (NetworkPolicies select only there);
//! - anything else (a clusterwide policy whose selectors do not read, a Pod's or a
//!   Namespace's labels, which any policy anywhere may select or deny by, a record whose
//!   kind cannot be told): every endpoint.

use serde::Deserialize;
use serde_json::Value;

use crate::key::ObjectKey;
use crate::{LabelSelector, RawSelector, SelectorFlavor};

/// An object policy depends on that is not in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyGap {
    /// What it is and why it is not in force, as status names it.
    pub text: String,
    /// The endpoints it could have restricted.
    pub scope: GapScope,
}

/// The endpoints a [`PolicyGap`] could have restricted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GapScope {
    /// Every endpoint.
    Everything,
    /// The endpoints of one namespace.
    Namespace(String),
    /// The endpoints any of the selectors selects; in `namespace` only, when given. No
    /// selector: no endpoint (a host policy's).
    Selected {
        /// The policy's namespace; `None` for a clusterwide policy.
        namespace: Option<String>,
        /// Its rules' endpoint selectors.
        selectors: Vec<LabelSelector>,
    },
}

impl std::fmt::Display for GapScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GapScope::Everything => f.write_str("every endpoint"),
            GapScope::Namespace(ns) => write!(f, "the endpoints of namespace {ns}"),
            GapScope::Selected {
                namespace: Some(ns),
                ..
            } => write!(f, "the endpoints it selects in namespace {ns}"),
            GapScope::Selected {
                namespace: None, ..
            } => f.write_str("the endpoints it selects"),
        }
    }
}

/// The scope of an object of `kind` named `key` when nothing more of it can be read.
pub fn scope_of_key(kind: &str, key: &ObjectKey) -> GapScope {
    let namespaced_policy = matches!(kind, "NetworkPolicy" | "CiliumNetworkPolicy");
    if namespaced_policy && !key.namespace.is_empty() {
        GapScope::Namespace(key.namespace.clone())
    } else {
        GapScope::Everything
    }
}

/// The scope of a Cilium policy (`spec` and `specs`) as the API server sent it, when every
/// rule's subject reads; `None` otherwise.
pub fn cilium_scope(value: &Value, namespace: Option<&str>) -> Option<GapScope> {
    let subjects = Subjects::deserialize(value).ok()?;
    let rules: Vec<Subject> = subjects
        .spec
        .into_iter()
        .chain(subjects.specs.into_iter().flatten())
        .collect();
    if rules.is_empty() {
        return None;
    }
    let mut selectors = Vec::new();
    for rule in rules {
        match (rule.endpoint_selector, rule.node_selector.is_some()) {
            (Some(raw), _) => selectors.push(
                LabelSelector::from_raw("endpointSelector", raw, SelectorFlavor::Cilium).ok()?,
            ),
            (None, true) => {}
            (None, false) => return None,
        }
    }
    Some(GapScope::Selected {
        namespace: namespace.filter(|ns| !ns.is_empty()).map(str::to_string),
        selectors,
    })
}

/// Only the subjects of a Cilium policy: every other field is ignored, so that they read
/// however wrong or new the rest is.
#[derive(Deserialize)]
struct Subjects {
    #[serde(default)]
    spec: Option<Subject>,
    #[serde(default)]
    specs: Option<Vec<Subject>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Subject {
    #[serde(default)]
    endpoint_selector: Option<RawSelector>,
    #[serde(default)]
    node_selector: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cilium_policy_s_scope_is_its_readable_selectors() {
        let p = json!({"spec": {"endpointSelector": {"matchLabels": {"app": "db"}},
                                "egress": [{"toFQDNs": [{"matchName": "a.com"}]}]}});
        let Some(GapScope::Selected {
            namespace,
            selectors,
        }) = cilium_scope(&p, Some("shop"))
        else {
            panic!("no scope");
        };
        assert_eq!(namespace.as_deref(), Some("shop"));
        assert_eq!(selectors.len(), 1);
        // A host policy selects no pod; a rule without a subject, or one that does not read,
        // leaves the scope unknown.
        let host = json!({"specs": [{"nodeSelector": {}}]});
        assert_eq!(
            cilium_scope(&host, None),
            Some(GapScope::Selected {
                namespace: None,
                selectors: Vec::new()
            })
        );
        assert_eq!(cilium_scope(&json!({"spec": {"ingress": []}}), None), None);
        let bad = json!({"spec": {"endpointSelector": {"matchLabels": {"-bad-": "x"}}}});
        assert_eq!(cilium_scope(&bad, None), None);
        assert_eq!(cilium_scope(&json!({}), None), None);
    }

    #[test]
    fn without_selectors_a_namespaced_policy_s_scope_is_its_namespace() {
        let key = ObjectKey::namespaced("shop", "p");
        assert_eq!(
            scope_of_key("NetworkPolicy", &key),
            GapScope::Namespace("shop".into())
        );
        assert_eq!(scope_of_key("Pod", &key), GapScope::Everything);
        let cluster = ObjectKey::namespaced("", "p");
        assert_eq!(
            scope_of_key("CiliumClusterwideNetworkPolicy", &cluster),
            GapScope::Everything
        );
    }
}

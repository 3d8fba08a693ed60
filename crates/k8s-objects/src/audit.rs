//! Per-policy audit mode: the annotation `policy.cellium.io/audit-mode: "true"` on a
//! NetworkPolicy, CiliumNetworkPolicy or CiliumClusterwideNetworkPolicy lets through what only
//! that policy would drop, reported as an audit verdict (Cilium has only the agent-wide
//! `policy-audit-mode`; its users have asked for one per policy since cilium#9580).

use std::collections::BTreeMap;

use crate::validate::FieldError;

/// The annotation.
pub const AUDIT_MODE_ANNOTATION: &str = "policy.cellium.io/audit-mode";

/// Whether `annotations` put the policy in audit mode: `"true"` or `"false"` (absent:
/// false); any other value is refused, since a misspelt value must not silently enforce or
/// audit a policy its author meant otherwise.
pub fn audit_mode(annotations: Option<&BTreeMap<String, String>>) -> Result<bool, FieldError> {
    match annotations.and_then(|a| a.get(AUDIT_MODE_ANNOTATION)) {
        None => Ok(false),
        Some(v) if v == "true" => Ok(true),
        Some(v) if v == "false" => Ok(false),
        Some(v) => Err(FieldError::new(
            format!("metadata.annotations[{AUDIT_MODE_ANNOTATION}]"),
            format!("{v:?} is not \"true\" or \"false\""),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_false_or_absent_and_nothing_else() {
        let with = |v: &str| BTreeMap::from([(AUDIT_MODE_ANNOTATION.to_string(), v.to_string())]);
        assert!(audit_mode(Some(&with("true"))).unwrap());
        assert!(!audit_mode(Some(&with("false"))).unwrap());
        assert!(!audit_mode(None).unwrap());
        assert!(!audit_mode(Some(&BTreeMap::new())).unwrap());
        let e = audit_mode(Some(&with("yes"))).unwrap_err();
        assert_eq!(
            e.field,
            "metadata.annotations[policy.cellium.io/audit-mode]"
        );
    }
}

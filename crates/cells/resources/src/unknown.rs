//! Fields of the API server's objects that this version does not know (a newer API's).
//!
//! The API server validated them, so skipping them is what its clients do; but what an
//! object means without them differs by kind:
//! - a Service or an EndpointSlice is put in force for what is known, and each unknown field
//!   is named in the resources module's status (a newer field may change how it should be
//!   served, never whom a policy admits);
//! - a NetworkPolicy with one in its `spec` is not put in force: a field of its rules this
//!   version cannot read may restrict what it allows, so ignoring it could open traffic; it is
//!   rejected, and its namespace locked down ([`cellium_k8s_objects::gap`]), as a Cilium
//!   policy with an unknown field is (one in its metadata or status is reported);
//! - the other kinds skip them silently: Pods, Nodes and Namespaces carry many fields the
//!   agent has no use for, and decoding them without path tracking keeps a sync fast.

use cellium_k8s_objects::validate::FieldError;

/// What a kind's unknown fields mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Treatment {
    /// Skipped, not even looked for.
    Skip,
    /// Skipped and named in status.
    Report,
    /// The object is rejected.
    Refuse,
}

/// The treatment of the unknown fields of an object of `kind` (as the tables name it).
pub(crate) fn treatment(kind: &str) -> Treatment {
    match kind {
        "Service" | "EndpointSlice" => Treatment::Report,
        "NetworkPolicy" => Treatment::Refuse,
        _ => Treatment::Skip,
    }
}

/// The unknown fields of an object of `kind` to report, or why it is rejected.
/// A refused kind is refused for a field of its `spec` only: one of its metadata or status
/// says nothing about what it allows, and is reported.
pub(crate) fn judge(kind: &str, unknown: Vec<String>) -> Result<Vec<String>, FieldError> {
    let in_spec = unknown
        .iter()
        .find(|f| *f == "spec" || f.starts_with("spec."));
    match (treatment(kind), in_spec) {
        (Treatment::Refuse, Some(field)) => Err(FieldError::new(
            field.clone(),
            "a field this version does not know: what the policy allows cannot be told without it",
        )),
        (Treatment::Skip, _) => Ok(Vec::new()),
        _ => Ok(unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_report_policies_refuse_pods_skip() {
        let new = || vec!["spec.newField".to_string()];
        assert_eq!(judge("Service", new()).unwrap(), new());
        assert_eq!(judge("EndpointSlice", new()).unwrap(), new());
        assert!(judge("Pod", new()).unwrap().is_empty());
        let e = judge("NetworkPolicy", new()).unwrap_err();
        assert_eq!(e.field, "spec.newField");
        assert!(judge("NetworkPolicy", Vec::new()).unwrap().is_empty());
        let status = vec!["status.conditions".to_string()];
        assert_eq!(judge("NetworkPolicy", status.clone()).unwrap(), status);
    }
}

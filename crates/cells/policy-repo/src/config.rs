//! The `policy-repo` configuration section, with Cilium's key names.

use serde::{Deserialize, Serialize};

/// How policies are enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PolicyConfig {
    /// Every policy in audit mode (Cilium's `policy-audit-mode`): what policy would drop
    /// passes, reported as an `AUDIT` policy verdict. One policy alone is put in audit mode by
    /// its annotation `policy.cellium.io/audit-mode: "true"`.
    pub policy_audit_mode: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_cilium_s_and_off_by_default() {
        let c: PolicyConfig = serde_yaml::from_str("policy-audit-mode: true").unwrap();
        assert!(c.policy_audit_mode);
        assert!(!PolicyConfig::default().policy_audit_mode);
    }
}

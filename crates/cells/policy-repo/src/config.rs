//! The `policy-repo` configuration section.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where policies come from besides the resources tables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PolicyConfig {
    /// A directory of Kubernetes YAML files applied as they change; empty (the default)
    /// for none. A file removed, or an object removed from a file, is deleted; a file that
    /// does not apply leaves the previous state of its objects in place.
    pub policy_dir: PathBuf,
}

impl PolicyConfig {
    /// The policy directory, if one is set.
    pub fn policy_dir(&self) -> Option<&Path> {
        (!self.policy_dir.as_os_str().is_empty()).then_some(self.policy_dir.as_path())
    }
}

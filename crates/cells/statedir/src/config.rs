//! The `statedir` configuration section.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the agent keeps its durable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct StateDirConfig {
    /// The state directory; created (mode 0700) at start if missing.
    pub state_dir: PathBuf,
}

impl Default for StateDirConfig {
    fn default() -> Self {
        StateDirConfig {
            state_dir: PathBuf::from("/var/run/cellium"),
        }
    }
}

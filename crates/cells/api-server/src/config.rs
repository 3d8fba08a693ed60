//! The `api-server` configuration section.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the API is served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ApiServerConfig {
    /// The unix socket; its directory is created if missing.
    pub api_socket: PathBuf,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        ApiServerConfig {
            api_socket: PathBuf::from(cellium_api::DEFAULT_SOCKET),
        }
    }
}

//! The `metrics` configuration section.

use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

/// Where metrics are served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MetricsConfig {
    /// The address of the HTTP listener (`host:port`); port 0 picks a free port.
    pub metrics_addr: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            metrics_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 9962)),
        }
    }
}

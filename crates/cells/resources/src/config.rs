//! The `resources` configuration section.

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// What the resources cell needs to know to behave as the API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ResourcesConfig {
    /// The range ClusterIP services get their address from, as the API server's
    /// `--service-cluster-ip-range`. IPv4 only (the datapath balances IPv4); between a /12 and
    /// a /30, as the API server accepts.
    pub service_cidr: Ipv4Net,
}

impl Default for ResourcesConfig {
    fn default() -> Self {
        ResourcesConfig {
            service_cidr: Ipv4Net::new(std::net::Ipv4Addr::new(10, 96, 0, 0), 12)
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_range_is_the_api_servers() {
        assert_eq!(
            ResourcesConfig::default().service_cidr.to_string(),
            "10.96.0.0/12"
        );
    }
}

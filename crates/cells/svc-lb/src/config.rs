//! The `svc-lb` configuration section.

use serde::{Deserialize, Serialize};

/// What a new connection to a service without backends gets (key
/// `service-no-backend-response`, Cilium's name and values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoBackendResponse {
    /// An ICMP (ICMPv6) port unreachable from the service address, sent back into the client
    /// pod: its connect() fails at once with ECONNREFUSED, as with kube-proxy and Cilium.
    #[default]
    Reject,
    /// Nothing: the packet is dropped and the client waits for its own timeout.
    Drop,
}

/// The `svc-lb` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct SvcLbConfig {
    /// `reject` (the default) or `drop`.
    pub service_no_backend_response: NoBackendResponse,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_takes_ciliums_values_and_names_a_bad_one() {
        let parse = |v: &str| {
            serde_json::from_value::<SvcLbConfig>(
                serde_json::json!({ "service-no-backend-response": v }),
            )
        };
        assert_eq!(
            parse("drop").unwrap().service_no_backend_response,
            NoBackendResponse::Drop
        );
        assert_eq!(
            parse("reject").unwrap().service_no_backend_response,
            NoBackendResponse::Reject
        );
        assert_eq!(
            SvcLbConfig::default().service_no_backend_response,
            NoBackendResponse::Reject
        );
        let err = parse("refuse").unwrap_err().to_string();
        assert!(err.contains("refuse") && err.contains("reject"), "{err}");
    }
}

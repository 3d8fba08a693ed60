//! The `svc-lb` configuration section.

use std::path::PathBuf;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct SvcLbConfig {
    /// `reject` (the default) or `drop`.
    pub service_no_backend_response: NoBackendResponse,
    /// Socket-level load balancing of the node's own processes (Cilium's `bpf-lb-sock`): off
    /// by default, as in Cilium without kube-proxy replacement.
    pub bpf_lb_sock: bool,
    /// The cgroup v2 directory the socket-level programs are attached to (Cilium's
    /// `cgroup-root`): every process in it and below is served. A path that is no cgroup v2
    /// directory gets a hierarchy mounted.
    pub cgroup_root: PathBuf,
}

impl Default for SvcLbConfig {
    fn default() -> Self {
        SvcLbConfig {
            service_no_backend_response: NoBackendResponse::default(),
            bpf_lb_sock: false,
            cgroup_root: PathBuf::from("/run/cellium/cgroupv2"),
        }
    }
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

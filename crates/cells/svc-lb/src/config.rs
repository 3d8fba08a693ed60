//! The `svc-lb` configuration section.

use std::path::PathBuf;

use cellium_resources::LbAlgorithm;
use serde::{Deserialize, Serialize};

use crate::maglev::{DEFAULT_TABLE_SIZE, TABLE_SIZES};

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

/// How a NodePort connection balanced to another node's backend reaches it (key
/// `bpf-lb-mode`, Cilium's name and values; docs/services.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LbMode {
    /// The client's source becomes the frontend's address; replies come back through the
    /// frontend's node.
    #[default]
    Snat,
    /// Direct server return: the client keeps its source, the backend's node learns the
    /// frontend from an IPv4 option (in tunnel routing, on the inner packet, the client's
    /// identity in the VNI) and replies straight to the client (IPv4; IPv6 as `snat`).
    Dsr,
    /// `dsr` for TCP, `snat` for UDP.
    Hybrid,
}

impl LbMode {
    /// Whether TCP connections are sent by DSR.
    pub fn dsr_tcp(self) -> bool {
        self != LbMode::Snat
    }

    /// Whether UDP connections are sent by DSR.
    pub fn dsr_udp(self) -> bool {
        self == LbMode::Dsr
    }
}

/// `bpf-lb-maglev-table-size`: one of Cilium's primes ([`TABLE_SIZES`]); anything else is
/// refused at start, naming the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct MaglevTableSize(u32);

impl MaglevTableSize {
    /// The number of entries.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for MaglevTableSize {
    fn default() -> Self {
        MaglevTableSize(DEFAULT_TABLE_SIZE)
    }
}

impl TryFrom<u32> for MaglevTableSize {
    type Error = String;
    fn try_from(m: u32) -> Result<Self, String> {
        if TABLE_SIZES.contains(&m) {
            Ok(MaglevTableSize(m))
        } else {
            Err(format!(
                "bpf-lb-maglev-table-size: {m} is not one of the supported primes {TABLE_SIZES:?}"
            ))
        }
    }
}

impl From<MaglevTableSize> for u32 {
    fn from(m: MaglevTableSize) -> u32 {
        m.0
    }
}

/// The `svc-lb` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct SvcLbConfig {
    /// `reject` (the default) or `drop`.
    pub service_no_backend_response: NoBackendResponse,
    /// How frontends choose a new connection's backend: `random` (the default) or `maglev`;
    /// a service's annotation `service.cilium.io/lb-algorithm` overrides it.
    pub bpf_lb_algorithm: LbAlgorithm,
    /// `snat` (the default), `dsr` or `hybrid` ([`LbMode`]).
    pub bpf_lb_mode: LbMode,
    /// The entries of each maglev table (default 16381).
    pub bpf_lb_maglev_table_size: MaglevTableSize,
    /// Socket-level load balancing of the node's own processes (Cilium's `bpf-lb-sock`): off
    /// by default, as in Cilium without kube-proxy replacement.
    pub bpf_lb_sock: bool,
    /// The cgroup v2 directory the socket-level programs are attached to (Cilium's
    /// `cgroup-root`): every process in it and below is served. A path that is no cgroup v2
    /// directory gets a hierarchy mounted.
    pub cgroup_root: PathBuf,
    /// Pods' `hostPort`s and runtimes' CNI `portMappings` served by the datapath (Cilium's
    /// `enable-host-port`; on by default, in every mode): no `portmap` plugin needed
    /// ([`crate::host_ports`]).
    pub enable_host_port: bool,
}

impl Default for SvcLbConfig {
    fn default() -> Self {
        SvcLbConfig {
            service_no_backend_response: NoBackendResponse::default(),
            bpf_lb_algorithm: LbAlgorithm::default(),
            bpf_lb_mode: LbMode::default(),
            bpf_lb_maglev_table_size: MaglevTableSize::default(),
            bpf_lb_sock: false,
            cgroup_root: PathBuf::from("/run/cellium/cgroupv2"),
            enable_host_port: true,
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

    #[test]
    fn bpf_lb_mode_takes_ciliums_values_and_refuses_others_naming_them() {
        let parse = |v: &str| {
            serde_json::from_value::<SvcLbConfig>(serde_json::json!({ "bpf-lb-mode": v }))
        };
        assert_eq!(SvcLbConfig::default().bpf_lb_mode, LbMode::Snat);
        let modes = |m: LbMode| (m.dsr_tcp(), m.dsr_udp());
        assert_eq!(modes(parse("snat").unwrap().bpf_lb_mode), (false, false));
        assert_eq!(modes(parse("dsr").unwrap().bpf_lb_mode), (true, true));
        assert_eq!(modes(parse("hybrid").unwrap().bpf_lb_mode), (true, false));
        let err = parse("direct").unwrap_err().to_string();
        assert!(err.contains("direct") && err.contains("hybrid"), "{err}");
    }

    #[test]
    fn the_lb_keys_take_ciliums_values_and_refuse_others_naming_the_key() {
        let parse = |v: serde_json::Value| serde_json::from_value::<SvcLbConfig>(v);
        let default = SvcLbConfig::default();
        assert_eq!(default.bpf_lb_algorithm, LbAlgorithm::Random);
        assert_eq!(default.bpf_lb_maglev_table_size.get(), 16381);
        let cfg = parse(serde_json::json!({
            "bpf-lb-algorithm": "maglev",
            "bpf-lb-maglev-table-size": 1021
        }))
        .unwrap();
        assert_eq!(cfg.bpf_lb_algorithm, LbAlgorithm::Maglev);
        assert_eq!(cfg.bpf_lb_maglev_table_size.get(), 1021);
        for bad in [1000, 16383, 0, 7] {
            let err = parse(serde_json::json!({ "bpf-lb-maglev-table-size": bad }))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("bpf-lb-maglev-table-size") && err.contains("16381"),
                "{err}"
            );
        }
        let err = parse(serde_json::json!({ "bpf-lb-algorithm": "hash" }))
            .unwrap_err()
            .to_string();
        assert!(err.contains("hash") && err.contains("maglev"), "{err}");
        // Rendered as written.
        let back = serde_json::to_value(&cfg).unwrap();
        assert_eq!(back["bpf-lb-maglev-table-size"], 1021);
        assert_eq!(back["bpf-lb-algorithm"], "maglev");
    }
}

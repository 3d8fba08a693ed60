//! `runtimeConfig.portMappings`: the ports a runtime asks to publish on the node (the CNI
//! `portMappings` capability: podman's and nerdctl's `-p`, the kubelet's `hostPort`s through
//! containerd or CRI-O), which the agent serves in the datapath as host ports, so that no
//! `portmap` plugin is needed.
//!
//! Read strictly, as nothing is created from a mapping the plugin half understood: each entry
//! is an object of `hostPort` and `containerPort` (integers 1-65535, required), `protocol`
//! (`tcp`, `udp` or `sctp` in any case; absent or empty: `tcp`) and `hostIP` (an address;
//! absent or empty: every node address). Keys are matched regardless of case, as the
//! reference plugin's Go decoder matches them: containerd sends `HostPort`, `ContainerPort`,
//! `Protocol`, `HostIP` (its library's struct has no JSON tags). Any other key, a key given
//! twice, or two entries publishing the same `hostIP`, `hostPort` and protocol is an error
//! naming the entry.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The key errors name.
const KEY: &str = "runtimeConfig.portMappings";

/// A transport protocol a port is published for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP: accepted, since the kubelet passes a Pod's SCTP hostPorts, and reported by the
    /// agent as not served (the datapath balances TCP and UDP).
    Sctp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        })
    }
}

/// One port to publish: `host_ip`:`host_port` to the container's `container_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMapping {
    /// The port on the node.
    pub host_port: u16,
    /// The port in the container.
    pub container_port: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// The node address it is published on; `None`: every one.
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    /// As the agent's API takes it.
    pub fn to_proto(&self) -> cellium_api::v1::PortMapping {
        cellium_api::v1::PortMapping {
            host_port: u32::from(self.host_port),
            container_port: u32::from(self.container_port),
            protocol: self.protocol.to_string(),
            host_ip: self.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
        }
    }
}

/// Reads `runtimeConfig.portMappings` of the runtime configuration `rc`; absent or `null`: none.
pub fn parse(rc: &Map<String, Value>) -> Result<Vec<PortMapping>> {
    let entries = match rc.get("portMappings") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(entries)) => entries,
        Some(other) => {
            return Err(invalid(format!(
                "{other} is not a list of {{\"hostPort\", \"containerPort\", \"protocol\", \"hostIP\"}} objects"
            )));
        }
    };
    let mut out = Vec::with_capacity(entries.len());
    let mut published = BTreeSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let mapping = entry_of(entry).map_err(|why| invalid(format!("entry {i}: {why}")))?;
        if !published.insert((mapping.host_ip, mapping.host_port, mapping.protocol)) {
            return Err(invalid(format!(
                "entry {i}: {}/{} is published twice: give each host port once",
                address_and_port(&mapping),
                mapping.protocol
            )));
        }
        out.push(mapping);
    }
    Ok(out)
}

fn invalid(reason: String) -> Error {
    Error::InvalidConfig { key: KEY, reason }
}

fn address_and_port(m: &PortMapping) -> String {
    match m.host_ip {
        Some(ip) => std::net::SocketAddr::new(ip, m.host_port).to_string(),
        None => format!("host port {}", m.host_port),
    }
}

/// One entry, or what is wrong with it.
fn entry_of(entry: &Value) -> std::result::Result<PortMapping, String> {
    let Value::Object(fields) = entry else {
        return Err(format!("{entry} is not an object"));
    };
    let (mut host_port, mut container_port, mut protocol, mut host_ip) = (None, None, None, None);
    for (key, value) in fields {
        let slot = match key.to_ascii_lowercase().as_str() {
            "hostport" => &mut host_port,
            "containerport" => &mut container_port,
            "protocol" => &mut protocol,
            "hostip" => &mut host_ip,
            _ => {
                return Err(format!(
                    "unknown key \"{key}\": an entry has hostPort, containerPort, protocol and hostIP"
                ));
            }
        };
        if slot.replace((key, value)).is_some() {
            return Err(format!("\"{key}\" is given twice"));
        }
    }
    Ok(PortMapping {
        host_port: port(host_port, "hostPort")?,
        container_port: port(container_port, "containerPort")?,
        protocol: match protocol {
            None | Some((_, Value::Null)) => Protocol::Tcp,
            Some((key, value)) => protocol_of(key, value)?,
        },
        host_ip: match host_ip {
            None | Some((_, Value::Null)) => None,
            Some((key, value)) => address(key, value)?,
        },
    })
}

fn port(field: Option<(&String, &Value)>, name: &str) -> std::result::Result<u16, String> {
    let Some((key, value)) = field.filter(|(_, v)| !v.is_null()) else {
        return Err(format!("\"{name}\" is required"));
    };
    value
        .as_u64()
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("\"{key}\" {value} is not a port number (an integer 1-65535)"))
}

fn protocol_of(key: &str, value: &Value) -> std::result::Result<Protocol, String> {
    let text = value.as_str().unwrap_or_default();
    match text.to_ascii_lowercase().as_str() {
        "tcp" => Ok(Protocol::Tcp),
        "udp" => Ok(Protocol::Udp),
        "sctp" => Ok(Protocol::Sctp),
        // Go's zero value, which a runtime sends for "unset".
        "" if value.is_string() => Ok(Protocol::Tcp),
        _ => Err(format!(
            "\"{key}\" {value} is not a protocol: give \"tcp\", \"udp\" or \"sctp\""
        )),
    }
}

fn address(key: &str, value: &Value) -> std::result::Result<Option<IpAddr>, String> {
    let text = value
        .as_str()
        .ok_or_else(|| format!("\"{key}\" {value} is not an address string"))?;
    if text.is_empty() {
        // Go's zero value: containerd sends it for a port without hostIP.
        return Ok(None);
    }
    let ip: IpAddr = text
        .parse()
        .map_err(|_| format!("\"{key}\" \"{text}\" is not an IPv4 or IPv6 address"))?;
    Ok((!ip.is_unspecified()).then_some(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_list(list: Value) -> Result<Vec<PortMapping>> {
        let rc = json!({ "portMappings": list });
        parse(rc.as_object().unwrap())
    }

    fn mapping(host_port: u16, container_port: u16, protocol: Protocol) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            protocol,
            host_ip: None,
        }
    }

    #[test]
    fn mappings_as_podman_and_containerd_send_them_are_read() {
        // podman (containers/common): lower camel case, hostIP left out when unset.
        let podman = parse_list(json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "192.168.1.10"}
        ]))
        .unwrap();
        assert_eq!(podman[0], mapping(8080, 80, Protocol::Tcp));
        assert_eq!(
            podman[1],
            PortMapping {
                host_ip: Some("192.168.1.10".parse().unwrap()),
                ..mapping(5353, 53, Protocol::Udp)
            }
        );
        // containerd (go-cni): Go field names, every field, empty strings for unset.
        let containerd = parse_list(json!([
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""},
            {"HostPort": 9000, "ContainerPort": 9000, "Protocol": "sctp", "HostIP": "fd00::10"}
        ]))
        .unwrap();
        assert_eq!(containerd[0], mapping(8080, 80, Protocol::Tcp));
        assert_eq!(containerd[1].protocol, Protocol::Sctp);
        assert_eq!(containerd[1].host_ip, Some("fd00::10".parse().unwrap()));
    }

    #[test]
    fn defaults_and_case() {
        let got = parse_list(json!([
            {"hostPort": 1, "containerPort": 65535},
            {"hostPort": 2, "containerPort": 2, "protocol": "UDP", "hostIP": "0.0.0.0"},
            {"hostPort": 3, "containerPort": 3, "protocol": "Tcp", "hostIP": "::"},
            {"hostPort": 4, "containerPort": 4, "protocol": "", "hostIP": null}
        ]))
        .unwrap();
        assert_eq!(
            got,
            [
                mapping(1, 65535, Protocol::Tcp),
                mapping(2, 2, Protocol::Udp),
                mapping(3, 3, Protocol::Tcp),
                mapping(4, 4, Protocol::Tcp),
            ]
        );
        assert!(parse(&Map::new()).unwrap().is_empty());
        assert!(parse_list(Value::Null).unwrap().is_empty());
        assert!(parse_list(json!([])).unwrap().is_empty());
    }

    #[test]
    fn anything_else_is_code_7_naming_the_entry_and_the_field() {
        let cases = [
            (json!({"hostPort": 8080}), "is not a list"),
            (
                json!([{"hostPort": 8080}]),
                "entry 0: \"containerPort\" is required",
            ),
            (
                json!([{"containerPort": 80}]),
                "entry 0: \"hostPort\" is required",
            ),
            (
                json!([{"hostPort": 0, "containerPort": 80}]),
                "\"hostPort\" 0 is not a port number",
            ),
            (
                json!([{"hostPort": 65536, "containerPort": 80}]),
                "\"hostPort\" 65536",
            ),
            (
                json!([{"hostPort": -1, "containerPort": 80}]),
                "\"hostPort\" -1",
            ),
            (
                json!([{"hostPort": "8080", "containerPort": 80}]),
                "\"hostPort\" \"8080\"",
            ),
            (
                json!([{"hostPort": 8080.5, "containerPort": 80}]),
                "\"hostPort\" 8080.5",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 0}]),
                "\"containerPort\" 0",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 80, "protocol": "icmp"}]),
                "\"protocol\" \"icmp\" is not a protocol",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 80, "protocol": 6}]),
                "\"protocol\" 6",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "node-1"}]),
                "\"hostIP\" \"node-1\" is not an IPv4 or IPv6 address",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "10.0.0.1/24"}]),
                "\"10.0.0.1/24\"",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 80, "hostIP": 1}]),
                "not an address string",
            ),
            (
                json!([{"hostPort": 8080, "containerPort": 80, "hostip ": "1.2.3.4"}]),
                "unknown key \"hostip \"",
            ),
            (
                json!([{"hostPort": 8080, "HostPort": 8081, "containerPort": 80}]),
                "is given twice",
            ),
            (json!(["8080:80"]), "entry 0: \"8080:80\" is not an object"),
            (
                json!([
                    {"hostPort": 8080, "containerPort": 80},
                    {"hostPort": 8080, "containerPort": 81, "protocol": "TCP"}
                ]),
                "entry 1: host port 8080/tcp is published twice",
            ),
        ];
        for (list, needle) in cases {
            let err = parse_list(list.clone()).unwrap_err();
            assert_eq!(err.code(), 7, "{list}: {err}");
            let msg = err.to_string();
            assert!(msg.contains("\"runtimeConfig.portMappings\""), "{msg}");
            assert!(msg.contains(needle), "{list}: {msg}");
        }
        // The same port on two addresses, or for two protocols, is no clash.
        let ok = parse_list(json!([
            {"hostPort": 53, "containerPort": 53, "protocol": "udp"},
            {"hostPort": 53, "containerPort": 53, "protocol": "tcp"},
            {"hostPort": 53, "containerPort": 53, "hostIP": "10.0.0.1"}
        ]))
        .unwrap();
        assert_eq!(ok.len(), 3);
    }

    #[test]
    fn the_api_gets_upper_or_lower_case_as_it_accepts_either() {
        let m = PortMapping {
            host_ip: Some("10.0.0.1".parse().unwrap()),
            ..mapping(8080, 80, Protocol::Udp)
        };
        let p = m.to_proto();
        assert_eq!(
            (
                p.host_port,
                p.container_port,
                p.protocol.as_str(),
                p.host_ip.as_str()
            ),
            (8080, 80, "udp", "10.0.0.1")
        );
    }
}

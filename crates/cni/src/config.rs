//! The network configuration the runtime writes on stdin.
//!
//! Keys (unknown keys are ignored, as the spec lets plugins have their own):
//!
//! | key | meaning |
//! |---|---|
//! | `cniVersion` | required; one of [`crate::version::SUPPORTED`] |
//! | `name` | required; the network name, `[a-zA-Z0-9][a-zA-Z0-9_.-]*` |
//! | `type` | the binary's name; read by the runtime, not here |
//! | `socket` | the agent's API socket (absolute path), default [`cellium_api::DEFAULT_SOCKET`] |
//! | `mtu` | the pod interface's MTU, 68-65535; absent or 0 = the agent's default |
//! | `dns` | `nameservers`, `domain`, `search`, `options`: copied into the ADD result |
//! | `timeout` | limit on each agent call: seconds (number) or a duration ("90s", "2m"); default 60 s |
//! | `log-file` | absolute path; one line per call is appended (verb, container, outcome) |
//! | `prevResult` | the previous plugin's result (chaining; CHECK) |
//! | `runtimeConfig.ips` | requested addresses (the `ips` capability) |
//! | `runtimeConfig.portMappings` | ports to publish on the node (the `portMappings` capability, [`crate::port_mappings`]); read by ADD only |
//! | `args.cni.ips` | requested addresses (the `args` convention) |
//! | `cni.dev/valid-attachments` | GC: the attachments still in use |

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::addr;
use crate::args::CniArgs;
use crate::env::is_valid_name;
use crate::error::{Error, Result};
use crate::port_mappings::{self, PortMapping};
use crate::result::Dns;
use crate::version::{CniVersion, Verb};

/// How long one agent call may take unless `timeout` says otherwise. Long enough for an
/// endpoint's synchronous datapath set-up on a busy node, short enough that a wedged agent
/// fails the call well within kubelet's two-minute runtime request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One plugin's network configuration, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion`: the version to answer in.
    pub version: CniVersion,
    /// `name`: the network, which scopes GC.
    pub name: String,
    /// `socket`: where the agent listens.
    pub socket: PathBuf,
    /// `mtu`: `None` leaves the choice to the agent.
    pub mtu: Option<u32>,
    /// `dns`: copied into the ADD result.
    pub dns: Dns,
    /// `timeout`: the limit on each agent call.
    pub timeout: Duration,
    /// `log-file`: where to append one line per call.
    pub log_file: Option<PathBuf>,
    /// `prevResult`, undecoded: only ADD and CHECK read it, and DEL must not fail on it.
    pub prev_result: Option<Value>,
    /// `runtimeConfig.ips`, canonical.
    pub runtime_ips: Vec<String>,
    /// `runtimeConfig.portMappings`, checked; read for ADD only (empty for the other verbs:
    /// a DEL must not fail on what an ADD refused).
    pub port_mappings: Vec<PortMapping>,
    /// `args.cni.ips`, canonical.
    pub args_ips: Vec<String>,
    /// `cni.dev/valid-attachments` (GC).
    pub valid_attachments: Option<Vec<ValidAttachment>>,
}

/// One element of `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ValidAttachment {
    /// `CNI_CONTAINERID` of the attachment's ADD.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME` of the attachment's ADD.
    pub ifname: String,
}

impl NetConf {
    /// Parses and validates the configuration for `verb`, in the order the reference library
    /// checks: JSON (code 6), name (7), version and whether it has `verb` (1), then the values
    /// (7).
    pub fn parse(stdin: &[u8], verb: Verb) -> Result<NetConf> {
        let map = parse_object(stdin)?;
        let name = network_name(&map)?;
        let version = match map.get("cniVersion") {
            None | Some(Value::Null) => CniVersion::from_config(None)?,
            Some(Value::String(s)) => CniVersion::from_config(Some(s))?,
            Some(other) => CniVersion::from_config(Some(&other.to_string()))?,
        };
        version.require(verb)?;
        let socket = match field::<String>(&map, "socket", "a path")? {
            None => PathBuf::from(cellium_api::DEFAULT_SOCKET),
            Some(s) => absolute(s, "socket", "the agent's API socket")?,
        };
        let log_file = field::<String>(&map, "log-file", "a path")?
            .map(|s| absolute(s, "log-file", "a file to append call records to"))
            .transpose()?;
        Ok(NetConf {
            version,
            name,
            socket,
            mtu: mtu(&map)?,
            dns: field::<Dns>(
                &map,
                "dns",
                "an object of nameservers, domain, search and options",
            )?
            .unwrap_or_default(),
            timeout: timeout(&map)?,
            log_file,
            prev_result: map.get("prevResult").filter(|v| !v.is_null()).cloned(),
            runtime_ips: runtime_ips(&map)?,
            port_mappings: if verb == Verb::Add {
                port_mappings::parse(runtime_config(&map)?)?
            } else {
                Vec::new()
            },
            args_ips: args_ips(&map)?,
            valid_attachments: field::<Vec<ValidAttachment>>(
                &map,
                "cni.dev/valid-attachments",
                "a list of {\"containerID\", \"ifname\"} objects",
            )?,
        })
    }

    /// The addresses requested for the pod: the `ips` capability wins over `args.cni.ips`, which
    /// wins over `IP=` in CNI_ARGS (the conventions say a plugin that understands `args` must
    /// ignore the CNI_ARGS field).
    pub fn requested_ips<'a>(&'a self, args: &'a CniArgs) -> &'a [String] {
        if !self.runtime_ips.is_empty() {
            &self.runtime_ips
        } else if !self.args_ips.is_empty() {
            &self.args_ips
        } else {
            &args.ips
        }
    }
}

/// Parses stdin as a JSON object; a syntax error names its position.
pub fn parse_object(stdin: &[u8]) -> Result<Map<String, Value>> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| Error::MalformedConfig {
        line: e.line(),
        column: e.column(),
        reason: e.to_string(),
    })?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(Error::ConfigNotObject {
            found: json_type(&other),
        }),
    }
}

/// The `log-file` of a configuration, read leniently: the call is logged even when the rest
/// of the configuration is invalid, since that is when a log helps most.
pub fn log_file(stdin: &[u8]) -> Option<PathBuf> {
    let map = parse_object(stdin).ok()?;
    let path = PathBuf::from(map.get("log-file")?.as_str()?);
    path.is_absolute().then_some(path)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Reads an optional key; `null` counts as absent.
fn field<T: DeserializeOwned>(
    map: &Map<String, Value>,
    key: &'static str,
    expected: &str,
) -> Result<Option<T>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| Error::InvalidConfig {
                key,
                reason: format!("{v} is not {expected} ({e})"),
            }),
    }
}

fn network_name(map: &Map<String, Value>) -> Result<String> {
    let name = field::<String>(map, "name", "a string")?.ok_or(Error::MissingName)?;
    if name.is_empty() {
        return Err(Error::MissingName);
    }
    if !is_valid_name(&name) {
        return Err(Error::InvalidConfig {
            key: "name",
            reason: format!(
                "\"{name}\" must start with a letter or digit followed by letters, digits, '_', '.' or '-'"
            ),
        });
    }
    Ok(name)
}

fn absolute(s: String, key: &'static str, what: &str) -> Result<PathBuf> {
    let path = PathBuf::from(&s);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(Error::InvalidConfig {
            key,
            reason: format!(
                "\"{s}\" is not an absolute path: set it to the absolute path of {what} (the runtime's working directory is unknown)"
            ),
        })
    }
}

fn mtu(map: &Map<String, Value>) -> Result<Option<u32>> {
    let fix = "set an MTU between 68 and 65535, or leave it out for the agent's default";
    let Some(value) = map.get("mtu").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(0) => Ok(None),
        Some(m @ 68..=65535) => Ok(Some(m as u32)),
        _ => Err(Error::InvalidConfig {
            key: "mtu",
            reason: format!("{value} is not a valid MTU: {fix}"),
        }),
    }
}

fn timeout(map: &Map<String, Value>) -> Result<Duration> {
    let invalid = |value: &Value, why: &str| Error::InvalidConfig {
        key: "timeout",
        reason: format!(
            "{value} {why}: give a number of seconds (30) or a duration (\"90s\", \"2m\") greater than zero"
        ),
    };
    let parsed = match map.get("timeout") {
        None | Some(Value::Null) => return Ok(DEFAULT_TIMEOUT),
        Some(v @ Value::Number(n)) => n
            .as_f64()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| invalid(v, "is not a valid number of seconds"))?,
        Some(v @ Value::String(s)) => humantime::parse_duration(s)
            .map_err(|e| invalid(v, &format!("is not a duration ({e})")))?,
        Some(v) => return Err(invalid(v, "is neither a number nor a string")),
    };
    if parsed.is_zero() {
        return Err(invalid(&map["timeout"], "is zero"));
    }
    Ok(parsed)
}

fn parse_ips(key: &'static str, list: Vec<String>) -> Result<Vec<String>> {
    list.iter()
        .map(|ip| {
            addr::parse_requested(ip).map_err(|reason| Error::InvalidConfig {
                key,
                reason: format!("{reason}: each entry must be ip or ip/prefix"),
            })
        })
        .collect()
}

/// `runtimeConfig`, the capabilities' arguments the runtime inserts; empty when absent.
fn runtime_config(map: &Map<String, Value>) -> Result<&Map<String, Value>> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    match map.get("runtimeConfig") {
        None | Some(Value::Null) => Ok(EMPTY.get_or_init(Map::new)),
        Some(Value::Object(rc)) => Ok(rc),
        Some(other) => Err(Error::InvalidConfig {
            key: "runtimeConfig",
            reason: format!("{other} is not an object: the runtime must pass an object"),
        }),
    }
}

fn runtime_ips(map: &Map<String, Value>) -> Result<Vec<String>> {
    let rc = runtime_config(map)?;
    let ips = field::<Vec<String>>(rc, "ips", "a list of address strings")
        .map_err(|e| rekey(e, "runtimeConfig.ips"))?
        .unwrap_or_default();
    parse_ips("runtimeConfig.ips", ips)
}

/// `args` is optional metadata by convention: anything but `args.cni.ips` is ignored, and only
/// a malformed `ips`, which this plugin acts on, is an error.
fn args_ips(map: &Map<String, Value>) -> Result<Vec<String>> {
    let Some(cni) = map
        .get("args")
        .and_then(|a| a.get("cni"))
        .and_then(Value::as_object)
    else {
        return Ok(Vec::new());
    };
    let ips = field::<Vec<String>>(cni, "ips", "a list of address strings")
        .map_err(|e| rekey(e, "args.cni.ips"))?
        .unwrap_or_default();
    parse_ips("args.cni.ips", ips)
}

/// Names the full path of a nested key in an error raised for its last component.
fn rekey(e: Error, key: &'static str) -> Error {
    match e {
        Error::InvalidConfig { reason, .. } => Error::InvalidConfig { key, reason },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, verb: Verb) -> Result<NetConf> {
        NetConf::parse(v.to_string().as_bytes(), verb)
    }

    fn base() -> Value {
        json!({"cniVersion": "1.1.0", "name": "cellium", "type": "cellium-cni"})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut v = base();
        v[key] = value;
        v
    }

    #[test]
    fn a_minimal_configuration_gets_the_defaults() {
        let c = parse(base(), Verb::Add).unwrap();
        assert_eq!(c.version, CniVersion::V1_1_0);
        assert_eq!(c.name, "cellium");
        assert_eq!(c.socket, PathBuf::from(cellium_api::DEFAULT_SOCKET));
        assert_eq!(c.mtu, None);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.dns, Dns::default());
        assert_eq!(c.prev_result, None);
        assert_eq!(c.log_file, None);
        assert_eq!(c.valid_attachments, None);
        assert!(c.port_mappings.is_empty());
    }

    #[test]
    fn every_key_is_read() {
        let c = parse(
            json!({
                "cniVersion": "0.4.0",
                "name": "net-1.a_b",
                "type": "cellium-cni",
                "socket": "/tmp/agent.sock",
                "mtu": 1400,
                "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"], "options": ["ndots:5"], "domain": "cluster.local"},
                "timeout": "90s",
                "log-file": "/var/log/cellium-cni.log",
                "prevResult": {"cniVersion": "0.4.0"},
                "runtimeConfig": {"ips": ["10.0.0.9/24"], "portMappings": [{"hostPort": 8080, "containerPort": 80}]},
                "args": {"cni": {"ips": ["10.0.0.8"], "labels": []}},
                "somePluginKey": {"anything": true}
            }),
            Verb::Add,
        )
        .unwrap();
        assert_eq!(c.version, CniVersion::V0_4_0);
        assert_eq!(c.socket, PathBuf::from("/tmp/agent.sock"));
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.dns.search, ["svc.cluster.local"]);
        assert_eq!(c.dns.domain.as_deref(), Some("cluster.local"));
        assert_eq!(c.timeout, Duration::from_secs(90));
        assert_eq!(c.log_file, Some(PathBuf::from("/var/log/cellium-cni.log")));
        assert_eq!(c.prev_result, Some(json!({"cniVersion": "0.4.0"})));
        assert_eq!(c.runtime_ips, ["10.0.0.9/24"]);
        assert_eq!(c.args_ips, ["10.0.0.8"]);
        assert_eq!(c.port_mappings.len(), 1);
        assert_eq!(
            (
                c.port_mappings[0].host_port,
                c.port_mappings[0].container_port
            ),
            (8080, 80)
        );
    }

    #[test]
    fn port_mappings_are_read_by_add_only() {
        let bad = with(
            "runtimeConfig",
            json!({"portMappings": [{"hostPort": 0, "containerPort": 80}]}),
        );
        let err = parse(bad.clone(), Verb::Add).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(
            err.to_string().contains("\"runtimeConfig.portMappings\""),
            "{err}"
        );
        // A runtime sends the same runtimeConfig with the DEL that follows a refused ADD: it
        // must succeed.
        for verb in [Verb::Del, Verb::Check] {
            assert!(parse(bad.clone(), verb).unwrap().port_mappings.is_empty());
        }
    }

    #[test]
    fn malformed_json_is_code_6_with_the_position() {
        let err = NetConf::parse(b"{\n  \"name\": \"x\",\n  oops\n}", Verb::Add).unwrap_err();
        assert_eq!(err.code(), 6);
        let msg = err.to_string();
        assert!(msg.contains("line 3 column 3"), "{msg}");
        let err = NetConf::parse(b"", Verb::Add).unwrap_err();
        assert_eq!(err.code(), 6);
        let err = NetConf::parse(b"[1]", Verb::Add).unwrap_err();
        assert_eq!(err.code(), 6);
        assert!(err.to_string().contains("JSON array"), "{err}");
    }

    #[test]
    fn the_name_is_required_and_checked_before_the_version() {
        let err = parse(json!({"cniVersion": "9.9.9"}), Verb::Add).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("no \"name\""), "{err}");
        let err = parse(with("name", json!("bad name")), Verb::Add).unwrap_err();
        assert_eq!(err.code(), 7);
        assert!(err.to_string().contains("\"bad name\""), "{err}");
    }

    #[test]
    fn unsupported_versions_are_code_1_naming_both_sides() {
        for v in [json!("0.2.0"), json!("2.0.0"), json!(1.0)] {
            let err = parse(with("cniVersion", v.clone()), Verb::Add).unwrap_err();
            assert_eq!(err.code(), 1, "{v}");
            assert!(
                err.to_string()
                    .contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"),
                "{err}"
            );
        }
        let mut no_version = base();
        no_version.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(parse(no_version, Verb::Del).unwrap_err().code(), 1);
    }

    #[test]
    fn verbs_are_gated_by_the_configuration_version() {
        let err = parse(with("cniVersion", json!("0.3.1")), Verb::Check).unwrap_err();
        assert_eq!(err.code(), 1);
        assert!(
            err.to_string()
                .contains("CHECK does not exist in cniVersion 0.3.1"),
            "{err}"
        );
        assert_eq!(
            parse(with("cniVersion", json!("1.0.0")), Verb::Gc)
                .unwrap_err()
                .code(),
            1
        );
        assert_eq!(
            parse(with("cniVersion", json!("1.0.0")), Verb::Status)
                .unwrap_err()
                .code(),
            1
        );
        parse(with("cniVersion", json!("0.4.0")), Verb::Check).unwrap();
    }

    #[test]
    fn invalid_values_are_code_7_naming_the_key() {
        let cases = [
            ("mtu", json!(67), "mtu"),
            ("mtu", json!(70000), "mtu"),
            ("mtu", json!("1500"), "mtu"),
            ("socket", json!("run/cellium.sock"), "absolute path"),
            ("socket", json!(5), "socket"),
            ("log-file", json!("x.log"), "absolute path"),
            ("timeout", json!(0), "zero"),
            ("timeout", json!(-1), "timeout"),
            ("timeout", json!("soon"), "not a duration"),
            ("timeout", json!(true), "neither"),
            ("dns", json!({"nameservers": "1.1.1.1"}), "dns"),
            (
                "runtimeConfig",
                json!({"ips": ["10.0.0.300"]}),
                "runtimeConfig.ips",
            ),
            (
                "runtimeConfig",
                json!({"ips": "10.0.0.3"}),
                "runtimeConfig.ips",
            ),
            ("runtimeConfig", json!([]), "runtimeConfig"),
            ("args", json!({"cni": {"ips": ["x"]}}), "args.cni.ips"),
            (
                "cni.dev/valid-attachments",
                json!([{"containerID": "a"}]),
                "valid-attachments",
            ),
        ];
        for (key, value, needle) in cases {
            let err = parse(with(key, value.clone()), Verb::Add).unwrap_err();
            assert_eq!(err.code(), 7, "{key}={value}: {err}");
            let msg = err.to_string();
            assert!(msg.contains(needle), "{key}={value}: {msg}");
            assert!(
                msg.contains(&format!("\"{}", key.split('.').next().unwrap())),
                "{msg}"
            );
        }
    }

    #[test]
    fn an_mtu_of_zero_means_the_agent_default() {
        assert_eq!(parse(with("mtu", json!(0)), Verb::Add).unwrap().mtu, None);
        assert_eq!(
            parse(with("mtu", json!(68)), Verb::Add).unwrap().mtu,
            Some(68)
        );
    }

    #[test]
    fn timeouts_take_seconds_or_durations() {
        let t = |v| parse(with("timeout", v), Verb::Add).unwrap().timeout;
        assert_eq!(t(json!(5)), Duration::from_secs(5));
        assert_eq!(t(json!(0.5)), Duration::from_millis(500));
        assert_eq!(t(json!("2m")), Duration::from_secs(120));
    }

    #[test]
    fn args_that_are_not_ours_are_ignored() {
        let c = parse(with("args", json!("free text")), Verb::Add).unwrap();
        assert!(c.args_ips.is_empty());
        let c = parse(
            with("args", json!({"cni": {"labels": [1]}, "k8s": 1})),
            Verb::Add,
        )
        .unwrap();
        assert!(c.args_ips.is_empty());
    }

    #[test]
    fn requested_ips_prefer_capability_then_args_then_cni_args() {
        let cni_args = CniArgs::parse(Some("IP=10.0.0.1")).unwrap();
        let mut c = parse(base(), Verb::Add).unwrap();
        assert_eq!(c.requested_ips(&cni_args), ["10.0.0.1"]);
        c.args_ips = vec!["10.0.0.2".into()];
        assert_eq!(c.requested_ips(&cni_args), ["10.0.0.2"]);
        c.runtime_ips = vec!["10.0.0.3".into()];
        assert_eq!(c.requested_ips(&cni_args), ["10.0.0.3"]);
    }

    #[test]
    fn gc_attachments_are_read() {
        let c = parse(
            json!({"cniVersion": "1.1.0", "name": "n", "cni.dev/valid-attachments": [
                {"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "net1"}
            ]}),
            Verb::Gc,
        )
        .unwrap();
        let valid = c.valid_attachments.unwrap();
        assert_eq!(valid.len(), 2);
        assert_eq!(valid[1].container_id, "c2");
        assert_eq!(valid[1].ifname, "net1");
    }

    #[test]
    fn the_log_file_is_found_even_in_an_invalid_configuration() {
        let stdin = br#"{"cniVersion": "0.1.0", "log-file": "/var/log/c.log"}"#;
        assert_eq!(log_file(stdin), Some(PathBuf::from("/var/log/c.log")));
        assert_eq!(log_file(br#"{"log-file": "rel.log"}"#), None);
        assert_eq!(log_file(b"{oops"), None);
    }
}

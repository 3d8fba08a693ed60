//! The plugin's errors and their CNI error object.
//!
//! Every failure of the plugin is an [`Error`]; it alone knows its CNI code ([`Error::code`]) and
//! turns itself into the spec's `{"cniVersion", "code", "msg", "details"}` ([`Error::to_object`]).
//! Each message says what is wrong and what to fix; `details` carries the underlying cause.
//!
//! Codes 1-7, 11, 50 and 51 are the spec's; codes 100 and up are this plugin's, one per class of
//! failure the agent reports. The agent's refusals carry a typed reason, which decides the code
//! and the advice ([`reason`]); the gRPC code decides only for refusals without one ([`grpc`]).
//! `docs/cni.md` tabulates both.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::version::{CniVersion, Verb, supported_list};

mod grpc;
mod reason;

pub use grpc::grpc_code;
use grpc::{grpc_hint, grpc_name};

use cellium_api::Reason;

/// Incompatible CNI version.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// Unsupported field (here: an unknown CNI_ARGS key without `IgnoreUnknown`).
pub const UNSUPPORTED_FIELD: u32 = 2;
/// Invalid or missing environment variables.
pub const INVALID_ENVIRONMENT: u32 = 4;
/// I/O failure.
pub const IO_FAILURE: u32 = 5;
/// Failed to decode content.
pub const DECODING_FAILURE: u32 = 6;
/// Invalid network configuration.
pub const INVALID_CONFIG: u32 = 7;
/// Try again later.
pub const TRY_AGAIN_LATER: u32 = 11;
/// STATUS: the plugin cannot serve ADD.
pub const NOT_AVAILABLE: u32 = 50;
/// STATUS: the plugin cannot serve ADD and existing pods may have limited connectivity.
pub const LIMITED_CONNECTIVITY: u32 = 51;
/// The agent failed internally, or answered something the plugin cannot use.
pub const AGENT_INTERNAL: u32 = 100;
/// The agent rejected the request as invalid.
pub const AGENT_INVALID_REQUEST: u32 = 101;
/// The agent found no such thing: the pod's netns (ADD) or the endpoint (CHECK).
pub const AGENT_NOT_FOUND: u32 = 102;
/// Something the agent hands out is exhausted: addresses, endpoint ids or identities.
pub const RESOURCES_EXHAUSTED: u32 = 103;
/// The requested address is in use, or the interface name is taken in the pod.
pub const ALREADY_EXISTS: u32 = 104;
/// CHECK found the attachment different from what ADD set up.
pub const CHECK_FAILED: u32 = 105;
/// The agent refused the caller.
pub const PERMISSION_DENIED: u32 = 106;
/// The agent does not implement the call: agent and plugin versions differ.
pub const UNIMPLEMENTED: u32 = 107;

/// The CNI_ARGS keys this plugin understands, for messages.
pub const KNOWN_ARGS: &str =
    "IgnoreUnknown, K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID, K8S_POD_UID, IP";

/// Everything that can go wrong in one invocation of the plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration has no `cniVersion` (0.1.0 to the reference library).
    #[error(
        "the network configuration has no cniVersion (which means 0.1.0, not supported): set \"cniVersion\" to one of {}",
        supported_list()
    )]
    MissingVersion,
    /// The configuration's `cniVersion` is not one this plugin speaks.
    #[error(
        "cniVersion \"{version}\" is not supported by cellium-cni: set \"cniVersion\" in the network configuration to one of {}",
        supported_list()
    )]
    UnsupportedVersion {
        /// The version asked for.
        version: String,
    },
    /// The verb does not exist in the configuration's version.
    #[error(
        "{verb} does not exist in cniVersion {version} (it was added in {since}): set the configuration's cniVersion to {since} or later, or do not call {verb} for this network"
    )]
    VerbNotInVersion {
        /// The verb called.
        verb: Verb,
        /// The configuration's version.
        version: CniVersion,
        /// The first version with the verb.
        since: CniVersion,
    },

    /// `CNI_COMMAND` is unset.
    #[error(
        "CNI_COMMAND is not set: the runtime must name the operation (ADD, DEL, CHECK, STATUS, GC or VERSION)"
    )]
    MissingCommand,
    /// `CNI_COMMAND` is not a CNI verb.
    #[error(
        "CNI_COMMAND=\"{value}\" is not a CNI operation: the runtime must pass ADD, DEL, CHECK, STATUS, GC or VERSION"
    )]
    UnknownCommand {
        /// The value found.
        value: String,
    },
    /// Variables the verb requires are unset or empty.
    #[error("{}", missing_env_message(*.verb, names))]
    MissingEnv {
        /// The verb that requires them.
        verb: Verb,
        /// The variables missing, in the spec's order.
        names: Vec<&'static str>,
    },
    /// `CNI_CONTAINERID` has characters the spec does not allow.
    #[error(
        "CNI_CONTAINERID=\"{value}\" is not a valid container id: the runtime must pass an id that starts with a letter or digit followed by letters, digits, '_', '.' or '-'"
    )]
    InvalidContainerId {
        /// The value found.
        value: String,
    },
    /// `CNI_IFNAME` cannot be a Linux interface name.
    #[error(
        "CNI_IFNAME=\"{value}\" is not a valid interface name ({reason}): the runtime must pass a name of 1 to 15 characters without '/', ':' or spaces"
    )]
    InvalidIfname {
        /// The value found.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `CNI_ARGS` element is not `K=V`.
    #[error(
        "CNI_ARGS has a malformed pair \"{pair}\": CNI_ARGS must be K=V pairs separated by ';' (no empty pairs, no '=' in values)"
    )]
    MalformedArgs {
        /// The offending element.
        pair: String,
    },
    /// A known `CNI_ARGS` key has a value it cannot take.
    #[error("CNI_ARGS {key}=\"{value}\" is invalid: {reason}")]
    InvalidArg {
        /// The key.
        key: &'static str,
        /// The value found.
        value: String,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// `CNI_ARGS` has keys this plugin does not know and no `IgnoreUnknown`.
    #[error(
        "CNI_ARGS has unknown keys {pairs:?}: cellium-cni knows {KNOWN_ARGS}; remove the others or add IgnoreUnknown=1"
    )]
    UnknownArgs {
        /// The unknown `K=V` pairs.
        pairs: Vec<String>,
    },

    /// Stdin could not be read.
    #[error("cannot read the network configuration from stdin: the runtime must write it there")]
    ReadStdin {
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// Stdin is not JSON.
    #[error(
        "the network configuration on stdin is not valid JSON at line {line} column {column} ({reason}): fix the configuration file the runtime reads"
    )]
    MalformedConfig {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's description.
        reason: String,
    },
    /// Stdin is JSON but not an object.
    #[error(
        "the network configuration on stdin is a JSON {found}, not an object: the runtime must pass one plugin's configuration object"
    )]
    ConfigNotObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// `prevResult` does not decode as a result of its version.
    #[error(
        "prevResult is not a valid CNI {version} result ({reason}): the runtime must pass the previous plugin's result unchanged"
    )]
    InvalidPrevResult {
        /// The version it was read as.
        version: String,
        /// What is wrong.
        reason: String,
    },

    /// The configuration has no network name.
    #[error(
        "the network configuration has no \"name\": set it to the network's name (letters, digits, '_', '.' or '-')"
    )]
    MissingName,
    /// A configuration key has a value the plugin cannot use.
    #[error("\"{key}\" in the network configuration is invalid: {reason}")]
    InvalidConfig {
        /// The key, as written in JSON.
        key: &'static str,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// CHECK without `prevResult`.
    #[error(
        "{verb} needs \"prevResult\", the result of ADD: the runtime must pass the cached ADD result"
    )]
    MissingPrevResult {
        /// The verb that needs it.
        verb: Verb,
    },
    /// GC without `cni.dev/valid-attachments`.
    #[error(
        "\"cni.dev/valid-attachments\" is missing: the runtime must list the attachments still in use (nothing was removed: without the list every endpoint of network \"{network}\" would be)"
    )]
    MissingValidAttachments {
        /// The network's name.
        network: String,
    },

    /// Nothing listens on the agent's socket.
    #[error(
        "the Cellium agent is not running at {} ({reason}): start the agent, or set \"socket\" in the network configuration to its API socket; the runtime should retry later",
        socket.display()
    )]
    AgentNotRunning {
        /// The socket tried.
        socket: PathBuf,
        /// What the kernel said.
        reason: String,
    },
    /// The agent's socket is not accessible to this user.
    #[error(
        "permission denied on the agent's socket {}: the runtime must run cellium-cni as root (the socket is mode 0600)",
        socket.display()
    )]
    AgentPermissionDenied {
        /// The socket tried.
        socket: PathBuf,
    },
    /// Any other failure to reach the agent.
    #[error(
        "cannot connect to the Cellium agent at {}: check that \"socket\" in the network configuration names the agent's API socket",
        socket.display()
    )]
    AgentConnect {
        /// The socket tried.
        socket: PathBuf,
        /// The client's error.
        #[source]
        source: cellium_api::ConnectError,
    },
    /// The agent did not answer in time.
    #[error(
        "the Cellium agent did not answer {call} within {}: it is overloaded or stuck (check `cellium status` and the agent's log, or raise \"timeout\" in the network configuration if the call is legitimately slow); the runtime should retry later",
        humantime::format_duration(*timeout)
    )]
    AgentTimeout {
        /// The gRPC method, e.g. `Endpoints.Create`.
        call: &'static str,
        /// The limit that expired.
        timeout: Duration,
    },
    /// The connection to the agent broke while a call was in flight: the agent exited or
    /// restarted. What the call did on the agent is unknown, so the runtime retries (a failed
    /// ADD is followed by its DEL, which removes whatever the agent finished).
    #[error(
        "the connection to the Cellium agent broke during {call} ({reason}): the agent stopped or restarted (check `cellium status` and the agent's log); the runtime should retry later"
    )]
    AgentGone {
        /// The gRPC method.
        call: &'static str,
        /// The transport's description of the failure.
        reason: String,
    },
    /// The agent answered with a gRPC error.
    #[error("{call} failed ({}): {message}; {}", agent_name(*grpc, *reason), agent_hint(call, *grpc, *reason))]
    Agent {
        /// The gRPC method.
        call: &'static str,
        /// The status code.
        grpc: tonic::Code,
        /// The typed reason the agent gave, when it gave one this plugin knows.
        reason: Option<Reason>,
        /// The agent's message.
        message: String,
    },
    /// `socket` names something that is not a socket.
    #[error(
        "\"socket\" in the network configuration names {found}, not a unix socket: {}; set it to the agent's API socket (the agent's api-socket)",
        socket.display()
    )]
    NotASocket {
        /// The path.
        socket: PathBuf,
        /// What is there ("a regular file", "a directory", ...).
        found: &'static str,
    },
    /// `CNI_NETNS` cannot be opened.
    #[error("CNI_NETNS={} cannot be opened ({source}): {}", path.display(), netns_hint(source))]
    NetnsOpen {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The agent answered but the answer cannot be used.
    #[error(
        "the agent answered {call} with data cellium-cni cannot use ({reason}): the agent and cellium-cni may be of different versions; install them from the same release"
    )]
    AgentReply {
        /// The gRPC method.
        call: &'static str,
        /// What is wrong with the answer.
        reason: String,
    },
    /// Create returned an endpoint in the failed state.
    #[error(
        "the agent set up endpoint {id} but reports it failed ({message}): see the agent's log; the runtime should delete the pod's network and retry"
    )]
    EndpointFailed {
        /// The endpoint's id.
        id: u32,
        /// The agent's status message.
        message: String,
    },

    /// CHECK found the attachment different from what ADD set up.
    #[error(
        "the attachment differs from what ADD set up: {}; re-create the pod (DEL then ADD)",
        differences.join("; ")
    )]
    CheckMismatch {
        /// One line per difference.
        differences: Vec<String>,
    },

    /// STATUS: ADD cannot be served.
    #[error("cellium-cni cannot serve ADD now: {reason}")]
    NotAvailable {
        /// Why, with what to do.
        reason: String,
    },
    /// STATUS: ADD cannot be served and running pods may be affected.
    #[error(
        "cellium-cni cannot serve ADD now and existing pods may have limited connectivity: {reason}"
    )]
    LimitedConnectivity {
        /// Why, with what to do.
        reason: String,
    },
}

/// The plugin's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The spec's error result, as printed on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// The protocol version in use.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The CNI error code.
    pub code: u32,
    /// What is wrong and what to fix.
    pub msg: String,
    /// The underlying cause, when there is one.
    pub details: String,
}

impl Error {
    /// The CNI error code of this error.
    pub fn code(&self) -> u32 {
        match self {
            Error::MissingVersion
            | Error::UnsupportedVersion { .. }
            | Error::VerbNotInVersion { .. } => INCOMPATIBLE_VERSION,
            Error::UnknownArgs { .. } => UNSUPPORTED_FIELD,
            Error::MissingCommand
            | Error::UnknownCommand { .. }
            | Error::MissingEnv { .. }
            | Error::InvalidContainerId { .. }
            | Error::InvalidIfname { .. }
            | Error::MalformedArgs { .. }
            | Error::InvalidArg { .. } => INVALID_ENVIRONMENT,
            // The socket is found to be something else only when the plugin connects to it:
            // an I/O failure of that connection, not a value it could have checked, and not a
            // reason to retry (11) either.
            Error::ReadStdin { .. } | Error::AgentConnect { .. } | Error::NotASocket { .. } => {
                IO_FAILURE
            }
            Error::MalformedConfig { .. }
            | Error::ConfigNotObject { .. }
            | Error::InvalidPrevResult { .. } => DECODING_FAILURE,
            Error::MissingName
            | Error::InvalidConfig { .. }
            | Error::MissingPrevResult { .. }
            | Error::MissingValidAttachments { .. } => INVALID_CONFIG,
            Error::AgentNotRunning { .. }
            | Error::AgentTimeout { .. }
            | Error::AgentGone { .. } => TRY_AGAIN_LATER,
            Error::AgentPermissionDenied { .. } => PERMISSION_DENIED,
            Error::Agent {
                grpc: _,
                reason: Some(reason),
                ..
            } => reason::row(*reason).code,
            Error::Agent {
                grpc, reason: None, ..
            } => grpc_code(*grpc),
            Error::NetnsOpen { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                reason::row(Reason::NetnsMissing).code
            }
            Error::NetnsOpen { .. } => IO_FAILURE,
            Error::AgentReply { .. } | Error::EndpointFailed { .. } => AGENT_INTERNAL,
            Error::CheckMismatch { .. } => CHECK_FAILED,
            Error::NotAvailable { .. } => NOT_AVAILABLE,
            Error::LimitedConnectivity { .. } => LIMITED_CONNECTIVITY,
        }
    }

    /// The longer description: the chain of causes, or what the agent said verbatim.
    pub fn details(&self) -> String {
        match self {
            Error::Agent {
                call,
                grpc,
                reason,
                message,
            } => match reason {
                Some(reason) => format!(
                    "gRPC {call} returned {grpc:?} ({}): {message}",
                    reason.as_str_name()
                ),
                None => format!("gRPC {call} returned {grpc:?}: {message}"),
            },
            Error::CheckMismatch { differences } => differences.join("\n"),
            _ => {
                let mut parts = Vec::new();
                let mut source = std::error::Error::source(self);
                while let Some(e) = source {
                    parts.push(e.to_string());
                    source = e.source();
                }
                parts.join(": ")
            }
        }
    }

    /// The spec's error object, written in `version`.
    pub fn to_object(&self, version: CniVersion) -> ErrorObject {
        ErrorObject {
            cni_version: version.as_str().to_string(),
            code: self.code(),
            msg: self.to_string(),
            details: self.details(),
        }
    }

    /// Maps the failure of connecting to the agent.
    pub fn from_connect(e: cellium_api::ConnectError) -> Error {
        use cellium_api::ConnectError as C;
        match e {
            C::NotRunning { socket, reason } => Error::AgentNotRunning { socket, reason },
            C::PermissionDenied { socket } => Error::AgentPermissionDenied { socket },
            C::NotASocket { socket, found } => Error::NotASocket { socket, found },
            C::Transport { ref socket, .. } => Error::AgentNotRunning {
                socket: socket.clone(),
                reason: format!("the socket accepts connections but gRPC fails: {e}"),
            },
            C::Io { ref socket, .. } => Error::AgentConnect {
                socket: socket.clone(),
                source: e,
            },
        }
    }
}

/// The name of an agent's refusal in messages: the reason's, or the gRPC code's.
fn agent_name(grpc: tonic::Code, reason: Option<Reason>) -> &'static str {
    match reason {
        Some(reason) => reason::row(reason).name,
        None => grpc_name(grpc),
    }
}

/// What to do about an agent's refusal: the reason's advice, or the gRPC code's.
fn agent_hint(call: &str, grpc: tonic::Code, reason: Option<Reason>) -> &'static str {
    match reason {
        Some(reason) => reason::row(reason).hint,
        None => grpc_hint(call, grpc),
    }
}

fn netns_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::NotFound => "the runtime must pass the pod's existing network namespace",
        io::ErrorKind::PermissionDenied => "run cellium-cni as root",
        _ => "the runtime must pass the path of the pod's network namespace",
    }
}

/// What each CNI variable carries, to tell the runtime what it forgot.
fn env_purpose(name: &str) -> &'static str {
    match name {
        "CNI_CONTAINERID" => "the container id",
        "CNI_NETNS" => "the pod's network namespace path",
        "CNI_IFNAME" => "the interface name to create in the pod",
        _ => "its value",
    }
}

fn missing_env_message(verb: Verb, names: &[&'static str]) -> String {
    let purposes: Vec<&str> = names.iter().map(|n| env_purpose(n)).collect();
    let verb_be = if names.len() == 1 { "is" } else { "are" };
    format!(
        "{} {verb_be} not set: the runtime must pass {} for {verb}",
        names.join(", "),
        purposes.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_object_has_the_four_keys_of_the_spec() {
        let e = Error::MissingEnv {
            verb: Verb::Add,
            names: vec!["CNI_NETNS"],
        };
        let json = serde_json::to_value(e.to_object(CniVersion::V0_4_0)).unwrap();
        let obj = json.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["cniVersion", "code", "details", "msg"]);
        assert_eq!(json["cniVersion"], "0.4.0");
        assert_eq!(json["code"], 4);
        assert_eq!(
            json["msg"],
            "CNI_NETNS is not set: the runtime must pass the pod's network namespace path for ADD"
        );
    }

    #[test]
    fn several_missing_variables_are_all_named() {
        let e = Error::MissingEnv {
            verb: Verb::Check,
            names: vec!["CNI_CONTAINERID", "CNI_IFNAME"],
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("CNI_CONTAINERID, CNI_IFNAME are not set"),
            "{msg}"
        );
        assert!(
            msg.contains("the container id, the interface name"),
            "{msg}"
        );
    }

    #[test]
    fn agent_errors_say_what_failed_and_what_to_do() {
        let e = Error::Agent {
            call: "Endpoints.Create",
            grpc: tonic::Code::ResourceExhausted,
            reason: Some(Reason::PoolExhausted),
            message: "pool 10.0.0.0/30 has no free address".into(),
        };
        let msg = e.to_string();
        assert!(msg.contains("Endpoints.Create failed"), "{msg}");
        assert!(
            msg.contains("pool 10.0.0.0/30 has no free address"),
            "{msg}"
        );
        assert!(msg.contains("larger pod CIDR"), "{msg}");
        assert_eq!(
            e.details(),
            "gRPC Endpoints.Create returned ResourceExhausted (REASON_POOL_EXHAUSTED): pool 10.0.0.0/30 has no free address"
        );
        let netns = Error::Agent {
            call: "Endpoints.Create",
            grpc: tonic::Code::InvalidArgument,
            reason: Some(Reason::NetnsRefused),
            message: "no netns".into(),
        };
        assert!(netns.to_string().contains("CNI_NETNS"), "{netns}");
        let ep = Error::Agent {
            call: "Endpoints.Check",
            grpc: tonic::Code::NotFound,
            reason: Some(Reason::EndpointNotFound),
            message: "no endpoint".into(),
        };
        assert!(ep.to_string().contains("re-create the pod"), "{ep}");
    }

    #[test]
    fn details_carry_the_source_chain() {
        let e = Error::ReadStdin {
            source: io::Error::other("broken pipe"),
        };
        assert_eq!(e.code(), 5);
        assert_eq!(e.details(), "broken pipe");
    }

    #[test]
    fn connect_failures_keep_their_meaning() {
        let socket = PathBuf::from("/run/x.sock");
        let not_running = Error::from_connect(cellium_api::ConnectError::NotRunning {
            socket: socket.clone(),
            reason: "no such socket".into(),
        });
        assert_eq!(not_running.code(), TRY_AGAIN_LATER);
        let msg = not_running.to_string();
        assert!(
            msg.contains("not running at /run/x.sock (no such socket)"),
            "{msg}"
        );
        let denied = Error::from_connect(cellium_api::ConnectError::PermissionDenied {
            socket: socket.clone(),
        });
        assert_eq!(denied.code(), PERMISSION_DENIED);
        let io = Error::from_connect(cellium_api::ConnectError::Io {
            socket,
            source: io::Error::other("not a socket"),
        });
        assert_eq!(io.code(), IO_FAILURE);
        assert!(io.details().contains("not a socket"), "{}", io.details());
    }

    #[test]
    fn a_netns_that_cannot_be_opened_names_the_path() {
        let missing = Error::NetnsOpen {
            path: "/run/netns/gone".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(missing.code(), AGENT_NOT_FOUND);
        assert!(
            missing.to_string().contains("CNI_NETNS=/run/netns/gone"),
            "{missing}"
        );
        let denied = Error::NetnsOpen {
            path: "/x".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(denied.code(), IO_FAILURE);
        assert!(denied.to_string().contains("root"), "{denied}");
    }

    #[test]
    fn a_socket_that_is_not_a_socket_is_an_io_failure() {
        let e = Error::from_connect(cellium_api::ConnectError::NotASocket {
            socket: "/etc/cni/net.d".into(),
            found: "a directory",
        });
        assert_eq!(e.code(), IO_FAILURE);
        let msg = e.to_string();
        assert!(msg.contains("\"socket\""), "{msg}");
        assert!(
            msg.contains("a directory, not a unix socket: /etc/cni/net.d"),
            "{msg}"
        );
    }

    #[test]
    fn timeouts_name_the_call_and_the_limit() {
        let e = Error::AgentTimeout {
            call: "Endpoints.Delete",
            timeout: Duration::from_secs(90),
        };
        assert_eq!(e.code(), 11);
        let msg = e.to_string();
        assert!(msg.contains("Endpoints.Delete within 1m 30s"), "{msg}");
        assert!(msg.contains("\"timeout\""), "{msg}");
    }
}

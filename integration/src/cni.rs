//! One invocation of the CNI plugin as a runtime makes it: the `CNI_*` environment and the
//! network configuration on stdin ([`CniCall`]), the running process ([`CniProcess`]), and
//! reading its result.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::{Child, ExitStatus};

use serde_json::Value;

use crate::error::{Error, Result};

/// One plugin invocation: the `CNI_*` environment and stdin, exactly as a runtime passes them.
#[derive(Debug, Clone)]
pub struct CniCall {
    /// The environment variables set (others named `CNI_*` are removed).
    pub env: Vec<(String, String)>,
    /// The bytes on stdin; `None` = the agent's [`Agent::net_conf`](crate::Agent::net_conf) in `cni_version`.
    pub stdin: Option<Vec<u8>>,
    /// The version of the default configuration.
    pub cni_version: String,
    /// A command the plugin is run through, its path appended (`nsenter --net=... --`, say, to
    /// run it in another namespace); empty = run directly.
    pub via: Vec<String>,
}

impl CniCall {
    /// `command` on (`container_id`, `eth0`), without a netns yet.
    pub fn new(command: &str, container_id: &str) -> CniCall {
        CniCall {
            env: vec![
                ("CNI_COMMAND".into(), command.into()),
                ("CNI_CONTAINERID".into(), container_id.into()),
                ("CNI_IFNAME".into(), "eth0".into()),
            ],
            stdin: None,
            cni_version: "1.0.0".into(),
            via: Vec::new(),
        }
    }

    /// Runs the plugin through `command` (its path is appended as the last argument), as a
    /// runtime in other namespaces than the test's would run it.
    pub fn via(mut self, command: &[&str]) -> CniCall {
        self.via = command.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Sets `CNI_NETNS`.
    pub fn netns(self, path: impl AsRef<Path>) -> CniCall {
        self.set("CNI_NETNS", &path.as_ref().display().to_string())
    }

    /// Sets `CNI_ARGS`.
    pub fn args(self, args: &str) -> CniCall {
        self.set("CNI_ARGS", args)
    }

    /// Sets (or replaces) a variable.
    pub fn set(mut self, key: &str, value: &str) -> CniCall {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    /// Leaves a variable out.
    pub fn unset(mut self, key: &str) -> CniCall {
        self.env.retain(|(k, _)| k != key);
        self
    }

    /// Writes `bytes` on stdin instead of the agent's configuration.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> CniCall {
        self.stdin = Some(bytes.into());
        self
    }

    /// Writes `conf` on stdin.
    pub fn conf(self, conf: &Value) -> CniCall {
        let bytes = serde_json::to_vec(conf).unwrap_or_default();
        self.stdin(bytes)
    }

    /// The default configuration in `version`.
    pub fn version(mut self, version: &str) -> CniCall {
        self.cni_version = version.into();
        self
    }

    pub(crate) fn describe(&self) -> String {
        let get = |k: &str| {
            self.env
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or("-")
        };
        format!("{} {}", get("CNI_COMMAND"), get("CNI_CONTAINERID"))
    }
}

/// A plugin process started by [`Agent::spawn_cni`](crate::Agent::spawn_cni).
#[derive(Debug)]
pub struct CniProcess {
    pub(crate) child: Child,
    pub(crate) what: String,
}

impl CniProcess {
    /// Waits for the plugin; returns its exit status and stdout as JSON (`Null` when it printed
    /// nothing, as DEL and CHECK do on success).
    pub fn wait(self) -> Result<(ExitStatus, Value)> {
        let what = self.what;
        let out = self
            .child
            .wait_with_output()
            .map_err(|source| Error::Spawn {
                cmd: format!("cellium-cni ({what})"),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|source| Error::Json {
                what: format!("cellium-cni ({what})"),
                text: text.clone(),
                source,
            })?
        };
        Ok((out.status, value))
    }
}

/// The first IPv4 address of an ADD result.
pub fn result_ipv4(result: &Value) -> Option<Ipv4Addr> {
    result["ips"]
        .as_array()?
        .iter()
        .filter_map(|ip| ip["address"].as_str())
        .find_map(|a| a.split('/').next()?.parse().ok())
}

/// The first IPv6 address of an ADD result.
pub fn result_ipv6(result: &Value) -> Option<Ipv6Addr> {
    result["ips"]
        .as_array()?
        .iter()
        .filter_map(|ip| ip["address"].as_str())
        .find_map(|a| a.split('/').next()?.parse().ok())
}

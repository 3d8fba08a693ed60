//! The `CNI_*` environment variables: which verb, which attachment.
//!
//! A variable set to the empty string counts as unset, as in the reference library. The plugin
//! never runs other plugins, so `CNI_PATH` is read for nothing and required by no verb.

use crate::error::{Error, Result};
use crate::version::Verb;

/// The CNI variables of one invocation, as the runtime set them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: Option<String>,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS`.
    pub args: Option<String>,
}

/// The attachment an ADD, DEL or CHECK is about: the `(CNI_CONTAINERID, CNI_IFNAME)` pair and
/// the pod's netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// `CNI_CONTAINERID`, validated.
    pub container_id: String,
    /// `CNI_IFNAME`, validated.
    pub ifname: String,
    /// `CNI_NETNS`; empty only on DEL, where the netns may already be gone.
    pub netns: String,
}

impl Env {
    /// Reads the variables of this process.
    pub fn from_process() -> Env {
        Env::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the variables through `get`, so tests need not touch the process environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Env {
        let get = |name| get(name).filter(|v| !v.is_empty());
        Env {
            command: get("CNI_COMMAND"),
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
        }
    }

    /// The verb named by `CNI_COMMAND`.
    pub fn verb(&self) -> Result<Verb> {
        let value = self.command.as_deref().ok_or(Error::MissingCommand)?;
        Verb::parse(value).ok_or_else(|| Error::UnknownCommand {
            value: value.to_string(),
        })
    }

    /// The attachment of an ADD, DEL or CHECK, after checking that every variable the verb
    /// requires is present (all missing ones are named at once) and valid.
    pub fn attachment(&self, verb: Verb) -> Result<Attachment> {
        let netns_required = matches!(verb, Verb::Add | Verb::Check);
        let required = [
            ("CNI_CONTAINERID", &self.container_id, true),
            ("CNI_NETNS", &self.netns, netns_required),
            ("CNI_IFNAME", &self.ifname, true),
        ];
        let names: Vec<&'static str> = required
            .iter()
            .filter(|(_, value, needed)| *needed && value.is_none())
            .map(|(name, _, _)| *name)
            .collect();
        if !names.is_empty() {
            return Err(Error::MissingEnv { verb, names });
        }
        let container_id = self.container_id.clone().unwrap_or_default();
        let ifname = self.ifname.clone().unwrap_or_default();
        validate_container_id(&container_id)?;
        validate_ifname(&ifname)?;
        Ok(Attachment {
            container_id,
            ifname,
            netns: self.netns.clone().unwrap_or_default(),
        })
    }
}

/// Whether `s` is a name the spec allows for container ids and network names:
/// `[a-zA-Z0-9][a-zA-Z0-9_.-]*`.
pub fn is_valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn validate_container_id(value: &str) -> Result<()> {
    if is_valid_name(value) {
        Ok(())
    } else {
        Err(Error::InvalidContainerId {
            value: value.to_string(),
        })
    }
}

/// The kernel's rules for an interface name (`dev_valid_name`), as the reference library checks.
fn validate_ifname(value: &str) -> Result<()> {
    let reason = if value.len() > 15 {
        Some("longer than 15 bytes")
    } else if value == "." || value == ".." {
        Some("'.' and '..' are reserved")
    } else if value
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidIfname {
            value: value.to_string(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Env {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn add_requires_container_netns_and_ifname_and_names_all_missing() {
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0")]);
        let err = e.attachment(Verb::Add).unwrap_err();
        assert_eq!(err.code(), 4);
        let msg = err.to_string();
        assert!(
            msg.starts_with("CNI_CONTAINERID, CNI_NETNS are not set"),
            "{msg}"
        );
    }

    #[test]
    fn empty_values_count_as_unset() {
        let e = env(&[
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", ""),
            ("CNI_IFNAME", "eth0"),
        ]);
        let msg = e.attachment(Verb::Check).unwrap_err().to_string();
        assert_eq!(
            msg,
            "CNI_NETNS is not set: the runtime must pass the pod's network namespace path for CHECK"
        );
    }

    #[test]
    fn del_does_without_a_netns() {
        let e = env(&[("CNI_CONTAINERID", "abc"), ("CNI_IFNAME", "eth0")]);
        let a = e.attachment(Verb::Del).unwrap();
        assert_eq!(a.netns, "");
        assert_eq!(a.container_id, "abc");
    }

    #[test]
    fn container_ids_follow_the_spec_charset() {
        for ok in ["abc", "A1", "0_x.y-z", "a"] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", "a b", "a/b", "é"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
        let e = env(&[
            ("CNI_CONTAINERID", "bad id"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
        ]);
        let err = e.attachment(Verb::Add).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("\"bad id\""), "{err}");
    }

    #[test]
    fn interface_names_follow_the_kernel_rules() {
        for (bad, why) in [
            ("a234567890123456", "longer than 15"),
            (".", "reserved"),
            ("..", "reserved"),
            ("e/0", "'/'"),
            ("e:0", "'/'"),
            ("e 0", "whitespace"),
        ] {
            let err = validate_ifname(bad).unwrap_err();
            assert_eq!(err.code(), 4);
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
        validate_ifname("a23456789012345").unwrap();
    }

    #[test]
    fn the_verb_is_read_from_cni_command() {
        assert_eq!(env(&[("CNI_COMMAND", "GC")]).verb().unwrap(), Verb::Gc);
        assert!(matches!(env(&[]).verb(), Err(Error::MissingCommand)));
        let err = env(&[("CNI_COMMAND", "UP")]).verb().unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("\"UP\""), "{err}");
    }
}

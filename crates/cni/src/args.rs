//! `CNI_ARGS`: `K=V;K=V` pairs from the runtime.
//!
//! Parsed as the reference library's `types.LoadArgs` does: every element must be exactly one
//! `K=V` (an empty element or a second `=` is an error even with `IgnoreUnknown`), keys match
//! case-sensitively, a later pair overrides an earlier one, and unknown keys are an error unless
//! `IgnoreUnknown` is true ("1" or "true" in any case; "0"/"false" turn it off), wherever it
//! appears in the string.

use crate::addr;
use crate::error::{Error, Result};

/// The `CNI_ARGS` keys this plugin understands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`; accepted (kubelet sends it) and otherwise unused.
    pub infra_container_id: Option<String>,
    /// `K8S_POD_UID`; accepted and otherwise unused.
    pub pod_uid: Option<String>,
    /// `IP`: requested addresses, comma-separated, in canonical text.
    pub ips: Vec<String>,
}

impl CniArgs {
    /// Parses the value of `CNI_ARGS`; `None` or empty yields no arguments.
    pub fn parse(args: Option<&str>) -> Result<CniArgs> {
        let mut out = CniArgs::default();
        let Some(args) = args.filter(|a| !a.is_empty()) else {
            return Ok(out);
        };
        let mut ignore_unknown = false;
        let mut unknown = Vec::new();
        for pair in args.split(';') {
            let mut kv = pair.split('=');
            let (Some(key), Some(value), None) = (kv.next(), kv.next(), kv.next()) else {
                return Err(Error::MalformedArgs {
                    pair: pair.to_string(),
                });
            };
            match key {
                "IgnoreUnknown" => ignore_unknown = parse_bool("IgnoreUnknown", value)?,
                "K8S_POD_NAMESPACE" => out.pod_namespace = Some(value.to_string()),
                "K8S_POD_NAME" => out.pod_name = Some(value.to_string()),
                "K8S_POD_INFRA_CONTAINER_ID" => out.infra_container_id = Some(value.to_string()),
                "K8S_POD_UID" => out.pod_uid = Some(value.to_string()),
                "IP" => out.ips = parse_ips(value)?,
                _ => unknown.push(pair.to_string()),
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(Error::UnknownArgs { pairs: unknown });
        }
        Ok(out)
    }
}

/// The reference library's `UnmarshallableBool`.
fn parse_bool(key: &'static str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(Error::InvalidArg {
            key,
            value: value.to_string(),
            reason: "use 1, true, 0 or false".into(),
        }),
    }
}

fn parse_ips(value: &str) -> Result<Vec<String>> {
    value
        .split(',')
        .map(|ip| {
            addr::parse_requested(ip).map_err(|reason| Error::InvalidArg {
                key: "IP",
                value: value.to_string(),
                reason: format!(
                    "{reason}; use comma-separated addresses, each ip or ip/prefix (IP=10.0.0.5 or IP=10.0.0.5,fd00::5)"
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_absent_args_are_fine() {
        assert_eq!(CniArgs::parse(None).unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse(Some("")).unwrap(), CniArgs::default());
    }

    #[test]
    fn kubelet_args_are_read() {
        let a = CniArgs::parse(Some(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
        ))
        .unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("default"));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.infra_container_id.as_deref(), Some("abc"));
        assert_eq!(a.pod_uid.as_deref(), Some("u-1"));
    }

    #[test]
    fn podman_args_are_read() {
        let a = CniArgs::parse(Some("IgnoreUnknown=1;K8S_POD_NAME=box")).unwrap();
        assert_eq!(a.pod_name.as_deref(), Some("box"));
        assert_eq!(a.pod_namespace, None);
    }

    #[test]
    fn unknown_keys_fail_with_code_2_unless_ignored() {
        let err = CniArgs::parse(Some("FOO=bar;K8S_POD_NAME=x")).unwrap_err();
        assert_eq!(err.code(), 2);
        let msg = err.to_string();
        assert!(
            msg.contains("FOO=bar") && msg.contains("IgnoreUnknown=1"),
            "{msg}"
        );
        // IgnoreUnknown takes effect wherever it is, and in any spelling of true.
        for on in ["1", "true", "True", "TRUE"] {
            CniArgs::parse(Some(&format!("FOO=bar;IgnoreUnknown={on}"))).unwrap();
        }
        for off in ["0", "false", "False"] {
            let err = CniArgs::parse(Some(&format!("IgnoreUnknown={off};FOO=bar"))).unwrap_err();
            assert_eq!(err.code(), 2);
        }
    }

    #[test]
    fn keys_are_case_sensitive() {
        assert_eq!(
            CniArgs::parse(Some("ignoreunknown=1")).unwrap_err().code(),
            2
        );
        assert_eq!(
            CniArgs::parse(Some("k8s_pod_name=x")).unwrap_err().code(),
            2
        );
    }

    #[test]
    fn a_bad_ignore_unknown_value_names_the_key() {
        let err = CniArgs::parse(Some("IgnoreUnknown=yes")).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("IgnoreUnknown=\"yes\""), "{err}");
    }

    #[test]
    fn malformed_pairs_are_errors_even_when_ignoring_unknown() {
        for bad in [
            "IgnoreUnknown=1;",
            "IgnoreUnknown=1;;A=b",
            "A",
            "IgnoreUnknown=1;A=b=c",
        ] {
            let err = CniArgs::parse(Some(bad)).unwrap_err();
            assert_eq!(err.code(), 4, "{bad}");
            assert!(matches!(err, Error::MalformedArgs { .. }), "{bad}");
        }
    }

    #[test]
    fn ip_takes_one_or_more_addresses() {
        let a = CniArgs::parse(Some("IP=10.0.0.5")).unwrap();
        assert_eq!(a.ips, ["10.0.0.5"]);
        let a = CniArgs::parse(Some("IP=10.0.0.5/24,FD00::0005")).unwrap();
        assert_eq!(a.ips, ["10.0.0.5/24", "fd00::5"]);
        let err = CniArgs::parse(Some("IP=10.0.0.5,nope")).unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("\"nope\""), "{err}");
        assert_eq!(CniArgs::parse(Some("IP=")).unwrap_err().code(), 4);
    }

    #[test]
    fn later_pairs_override_earlier_ones() {
        let a = CniArgs::parse(Some("K8S_POD_NAME=a;K8S_POD_NAME=b")).unwrap();
        assert_eq!(a.pod_name.as_deref(), Some("b"));
    }
}

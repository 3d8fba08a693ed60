//! VERSION: the versions this plugin speaks.
//!
//! Answers `{"cniVersion": <the input's cniVersion, or 1.1.0>, "supportedVersions": [...]}`.
//! The input is read leniently: runtimes send `{"cniVersion": "..."}`, some send nothing, and
//! the answer must not depend on the rest of a configuration.

use serde_json::{Value, json};

use super::Reply;
use crate::error::Result;
use crate::version::{CniVersion, SUPPORTED};

/// Runs VERSION on the runtime's stdin.
pub fn exec(stdin: &[u8]) -> Result<Reply> {
    let requested = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| CniVersion::LATEST.as_str().to_string());
    let supported: Vec<&str> = SUPPORTED.iter().map(|v| v.as_str()).collect();
    Ok(Reply {
        stdout: Some(json!({"cniVersion": requested, "supportedVersions": supported})),
        summary: format!("asked for {requested}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requested_version_is_echoed_with_the_supported_ones() {
        for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            let out = exec(format!(r#"{{"cniVersion": "{v}"}}"#).as_bytes())
                .unwrap()
                .stdout
                .unwrap();
            assert_eq!(
                out,
                json!({"cniVersion": v, "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
            );
        }
    }

    #[test]
    fn without_a_version_the_answer_is_1_1_0() {
        for stdin in [&b""[..], b"{}", b"not json", br#"{"cniVersion": ""}"#] {
            let out = exec(stdin).unwrap().stdout.unwrap();
            assert_eq!(out["cniVersion"], "1.1.0");
        }
    }
}

//! CNI specification versions: which ones the plugin speaks and which verbs each one has.
//!
//! The plugin implements spec 1.1.0 and answers configurations written for 0.3.0, 0.3.1, 0.4.0
//! and 1.0.0 in their own result shape. 0.1.0 and 0.2.0 are not supported: their result has a
//! different layout (`ip4`/`ip6`) that no runtime still sends.

use std::fmt;

use crate::error::{Error, Result};

/// A CNI specification version this plugin supports, ordered oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.3.0: the rich result type and plugin chaining.
    V0_3_0,
    /// 0.3.1: a typo fix of 0.3.0.
    V0_3_1,
    /// 0.4.0: CHECK, and `prevResult` on DEL.
    V0_4_0,
    /// 1.0.0: no `version` field in `ips`.
    V1_0_0,
    /// 1.1.0: STATUS and GC.
    V1_1_0,
}

/// Every supported version, oldest first, as VERSION reports them.
pub const SUPPORTED: [CniVersion; 5] = [
    CniVersion::V0_3_0,
    CniVersion::V0_3_1,
    CniVersion::V0_4_0,
    CniVersion::V1_0_0,
    CniVersion::V1_1_0,
];

/// The supported versions as one comma-separated string, for messages.
pub fn supported_list() -> String {
    SUPPORTED
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl CniVersion {
    /// The newest version, used when the input names none that can be used.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// Parses an exact version string ("0.4.0"); `None` for anything not supported.
    pub fn parse(s: &str) -> Option<CniVersion> {
        SUPPORTED.into_iter().find(|v| v.as_str() == s)
    }

    /// Parses the `cniVersion` of a network configuration.
    ///
    /// An absent or empty `cniVersion` means 0.1.0 to the reference library, which this plugin
    /// does not support; both are told apart in the message.
    pub fn from_config(value: Option<&str>) -> Result<CniVersion> {
        match value {
            None | Some("") => Err(Error::MissingVersion),
            Some(v) => CniVersion::parse(v).ok_or_else(|| Error::UnsupportedVersion {
                version: v.to_string(),
            }),
        }
    }

    /// The version as it is written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Whether results of this version carry `"version": "4"|"6"` on each IP and lack the 1.x
    /// interface fields (`mtu`, `socketPath`, `pciID`).
    pub fn is_legacy_result(self) -> bool {
        self < CniVersion::V1_0_0
    }

    /// Fails when `verb` does not exist in this version (CHECK before 0.4.0, STATUS and GC
    /// before 1.1.0), as the reference library's dispatcher does.
    pub fn require(self, verb: Verb) -> Result<()> {
        match verb.since() {
            Some(since) if self < since => Err(Error::VerbNotInVersion {
                verb,
                version: self,
                since,
            }),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A CNI operation, as named by `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Attach a container to the network.
    Add,
    /// Detach it; idempotent.
    Del,
    /// Verify an attachment (0.4.0+).
    Check,
    /// Tell whether ADD can be served (1.1.0+).
    Status,
    /// Remove attachments the runtime no longer knows (1.1.0+).
    Gc,
    /// Report the supported versions.
    Version,
}

impl Verb {
    /// Every verb, in the order the spec lists them.
    pub const ALL: [Verb; 6] = [
        Verb::Add,
        Verb::Del,
        Verb::Check,
        Verb::Status,
        Verb::Gc,
        Verb::Version,
    ];

    /// Parses `CNI_COMMAND`; the spec's verbs are upper case and so is the match.
    pub fn parse(s: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The verb as `CNI_COMMAND` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Add => "ADD",
            Verb::Del => "DEL",
            Verb::Check => "CHECK",
            Verb::Status => "STATUS",
            Verb::Gc => "GC",
            Verb::Version => "VERSION",
        }
    }

    /// The first spec version that has the verb; `None` for verbs as old as 0.3.0.
    pub fn since(self) -> Option<CniVersion> {
        match self {
            Verb::Check => Some(CniVersion::V0_4_0),
            Verb::Status | Verb::Gc => Some(CniVersion::V1_1_0),
            Verb::Add | Verb::Del | Verb::Version => None,
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The version to write in an error object: the input's `cniVersion` when it is one this plugin
/// speaks (the runtime then reads the error in its own version), else the newest.
///
/// This reads the input leniently on purpose: it runs for inputs that failed to parse.
pub fn of_input(stdin: &[u8]) -> CniVersion {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .as_ref()
        .and_then(|v| v.get("cniVersion"))
        .and_then(|v| v.as_str())
        .and_then(CniVersion::parse)
        .unwrap_or(CniVersion::LATEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_version_round_trips() {
        for v in SUPPORTED {
            assert_eq!(CniVersion::parse(v.as_str()), Some(v));
        }
        assert_eq!(supported_list(), "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0");
    }

    #[test]
    fn old_and_unknown_versions_are_refused_with_their_name() {
        for bad in ["0.1.0", "0.2.0", "1.2.0", "2.0.0", "1.0", "banana"] {
            let err = CniVersion::from_config(Some(bad)).unwrap_err();
            assert_eq!(err.code(), 1, "{bad}");
            let msg = err.to_string();
            assert!(msg.contains(bad), "{msg}");
            assert!(msg.contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"), "{msg}");
        }
    }

    #[test]
    fn a_missing_version_is_refused_and_says_so() {
        for missing in [None, Some("")] {
            let err = CniVersion::from_config(missing).unwrap_err();
            assert_eq!(err.code(), 1);
            assert!(err.to_string().contains("no cniVersion"), "{err}");
        }
    }

    #[test]
    fn verbs_exist_from_their_spec_version() {
        use CniVersion::*;
        let cases = [
            (Verb::Check, V0_3_1, false),
            (Verb::Check, V0_4_0, true),
            (Verb::Status, V1_0_0, false),
            (Verb::Status, V1_1_0, true),
            (Verb::Gc, V1_0_0, false),
            (Verb::Gc, V1_1_0, true),
            (Verb::Add, V0_3_0, true),
            (Verb::Del, V0_3_0, true),
        ];
        for (verb, version, ok) in cases {
            let got = version.require(verb);
            assert_eq!(got.is_ok(), ok, "{verb} on {version}");
            if let Err(e) = got {
                assert_eq!(e.code(), 1);
                let msg = e.to_string();
                assert!(
                    msg.contains(verb.as_str()) && msg.contains(version.as_str()),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn legacy_result_shape_is_before_1_0_0() {
        assert!(CniVersion::V0_4_0.is_legacy_result());
        assert!(CniVersion::V0_3_0.is_legacy_result());
        assert!(!CniVersion::V1_0_0.is_legacy_result());
        assert!(!CniVersion::V1_1_0.is_legacy_result());
    }

    #[test]
    fn errors_speak_the_input_version_when_it_is_known() {
        assert_eq!(of_input(br#"{"cniVersion":"0.3.1"}"#), CniVersion::V0_3_1);
        assert_eq!(of_input(br#"{"cniVersion":"9.9.9"}"#), CniVersion::LATEST);
        assert_eq!(of_input(b"{not json"), CniVersion::LATEST);
        assert_eq!(of_input(b""), CniVersion::LATEST);
    }

    #[test]
    fn verbs_parse_exactly() {
        for v in Verb::ALL {
            assert_eq!(Verb::parse(v.as_str()), Some(v));
        }
        assert_eq!(Verb::parse("add"), None);
        assert_eq!(Verb::parse("DELETE"), None);
    }
}

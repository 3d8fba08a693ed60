//! One label: a source, a key and a value.

use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cidr;
use crate::error::{Error, Result};

/// The label sources Cellium uses.
pub mod source {
    /// Labels of Kubernetes objects: a pod's own labels, its namespace and the namespace's
    /// labels.
    pub const K8S: &str = "k8s";
    /// Labels of the reserved identities (`reserved:host`, `reserved:world`, ...).
    pub const RESERVED: &str = "reserved";
    /// Labels of IP prefixes (`cidr:10.0.0.0/8`).
    pub const CIDR: &str = "cidr";
    /// Only in selectors: a key that matches under every source (`any:app`, or just `app`).
    pub const ANY: &str = "any";
    /// The source of a label written without one (`app=web`).
    pub const UNSPEC: &str = "unspec";
}

/// A label: `source:key=value`.
///
/// Displayed as `source:key=value`, or `source:key` when the value is empty
/// (`reserved:host`); [`FromStr`] reads the same text, and a label written without a
/// source gets [`source::UNSPEC`]. The fields are plain strings: constructing a label by
/// hand does not validate it, parsing does. Labels order by source, key, then value.
///
/// ```
/// use cellium_labels::Label;
/// let l: Label = "k8s:app=web".parse()?;
/// assert_eq!((l.source.as_str(), l.key.as_str(), l.value.as_str()), ("k8s", "app", "web"));
/// assert_eq!(Label::reserved("host").to_string(), "reserved:host");
/// assert_eq!(Label::cidr("fd00::/64".parse().unwrap()).to_string(), "cidr:fd00--0/64");
/// # Ok::<(), cellium_labels::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label {
    /// Where the label comes from: one of [`source`]'s constants.
    pub source: String,
    /// The key, e.g. `app` or `io.kubernetes.pod.namespace`.
    pub key: String,
    /// The value; empty for reserved and CIDR labels.
    pub value: String,
}

impl Label {
    /// A label from its parts, not validated.
    pub fn new(
        source: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Label {
        Label {
            source: source.into(),
            key: key.into(),
            value: value.into(),
        }
    }

    /// A Kubernetes label `k8s:key=value`.
    pub fn k8s(key: impl Into<String>, value: impl Into<String>) -> Label {
        Label::new(source::K8S, key, value)
    }

    /// The reserved label `reserved:name`.
    pub fn reserved(name: impl Into<String>) -> Label {
        Label::new(source::RESERVED, name, "")
    }

    /// The label of a prefix, `cidr:10.0.0.0/8` (host bits cleared; IPv6 written with `-`
    /// for `:`, see the crate docs).
    pub fn cidr(net: IpNet) -> Label {
        Label::new(source::CIDR, cidr::encode(net), "")
    }

    /// The prefix of a `cidr:` label; `None` for other labels.
    pub fn cidr_prefix(&self) -> Option<IpNet> {
        if self.source != source::CIDR {
            return None;
        }
        cidr::decode(&self.key)
    }

    /// Whether this is a `reserved:` label.
    pub fn is_reserved(&self) -> bool {
        self.source == source::RESERVED
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.source, self.key)
        } else {
            write!(f, "{}:{}={}", self.source, self.key, self.value)
        }
    }
}

impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl FromStr for Label {
    type Err = Error;

    /// Reads `source:key=value`, `source:key` or `key=value` (source `unspec`). A `cidr:`
    /// key may use either the dashed or the colon form of an IPv6 prefix; it is stored in
    /// the dashed form.
    fn from_str(text: &str) -> Result<Label> {
        let bad = |reason: &str| Error::InvalidLabel {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let (source, rest) = split_source(text).unwrap_or((source::UNSPEC, text));
        check_source(source).map_err(|r| bad(&r))?;
        let (key, value) = rest.split_once('=').unwrap_or((rest, ""));
        if key.is_empty() {
            return Err(bad("the key is empty"));
        }
        if let Some(c) = key.chars().find(|c| forbidden(*c)) {
            return Err(bad(&format!("the key may not contain {c:?}")));
        }
        if let Some(c) = value.chars().find(|c| forbidden(*c)) {
            return Err(bad(&format!("the value may not contain {c:?}")));
        }
        if source == source::CIDR {
            let net =
                cidr::decode(key).ok_or_else(|| bad("a cidr label's key must be a prefix"))?;
            if !value.is_empty() {
                return Err(bad("a cidr label has no value"));
            }
            return Ok(Label::cidr(net));
        }
        Ok(Label::new(source, key, value))
    }
}

/// Splits `source:rest` at the first `:`, when what precedes it can be a source.
pub(crate) fn split_source(text: &str) -> Option<(&str, &str)> {
    let (source, rest) = text.split_once(':')?;
    // A `=` before the `:` means the colon is in the value (`app=a:b`), not after a source.
    (!source.contains('=')).then_some((source, rest))
}

/// Sources are short lowercase words (`k8s`, `reserved`, `cilium-generated`).
pub(crate) fn check_source(source: &str) -> Result<(), String> {
    if source.is_empty() {
        return Err("the source before ':' is empty".into());
    }
    let ok = source
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "source {source:?} may hold only lowercase letters, digits, '-' and '.'"
        ))
    }
}

/// Characters that would make a label's text ambiguous in a label set or a selector.
pub(crate) fn forbidden(c: char) -> bool {
    matches!(c, ',' | '=' | '(' | ')' | '!') || c.is_whitespace()
}

impl Serialize for Label {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Label, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(s: &str) -> Label {
        s.parse().unwrap()
    }

    #[test]
    fn text_round_trips() {
        for text in [
            "k8s:app=web",
            "k8s:io.kubernetes.pod.namespace=shop",
            "reserved:host",
            "cidr:10.0.0.0/8",
            "cidr:fd00--0/64",
            "unspec:team=a",
            "k8s:app.kubernetes.io/name=db",
        ] {
            assert_eq!(label(text).to_string(), text);
        }
    }

    #[test]
    fn parts_are_split_at_the_first_separator() {
        let l = label("k8s:app=");
        assert_eq!((l.key.as_str(), l.value.as_str()), ("app", ""));
        assert_eq!(l.to_string(), "k8s:app");
        assert_eq!(label("team=a"), Label::new("unspec", "team", "a"));
        assert_eq!(label("host"), Label::new("unspec", "host", ""));
    }

    #[test]
    fn cidr_labels_are_normalised() {
        assert_eq!(label("cidr:fd00::/64").to_string(), "cidr:fd00--0/64");
        assert_eq!(label("cidr:10.1.2.3/8").to_string(), "cidr:10.0.0.0/8");
        assert_eq!(
            label("cidr:10.0.0.0/8").cidr_prefix(),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(label("k8s:app=web").cidr_prefix(), None);
        assert_eq!(
            Label::cidr("::/0".parse().unwrap()).to_string(),
            "cidr:0--0/0"
        );
    }

    #[test]
    fn bad_text_is_refused_with_the_reason() {
        for (text, reason) in [
            (":app=web", "the source before ':' is empty"),
            ("K8S:app=web", "may hold only lowercase"),
            ("k8s:=web", "the key is empty"),
            ("k8s:a b=c", "the key may not contain ' '"),
            ("k8s:app=a,b", "the value may not contain ','"),
            ("cidr:10.0.0.1", "must be a prefix"),
            ("cidr:10.0.0.0/8=x", "has no value"),
        ] {
            let err = text.parse::<Label>().unwrap_err().to_string();
            assert!(err.contains(reason), "{text}: {err}");
            assert!(err.contains(&format!("{text:?}")), "{text}: {err}");
        }
    }

    #[test]
    fn serde_uses_the_text_form() {
        let l = Label::reserved("world");
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, "\"reserved:world\"");
        assert_eq!(serde_json::from_str::<Label>(&json).unwrap(), l);
        assert!(serde_json::from_str::<Label>("\"k8s:=x\"").is_err());
    }
}

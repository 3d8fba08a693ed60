//! Reading a selector from text: the canonical form and the Kubernetes selector syntax.

use std::str::FromStr;

use super::{Operator, Requirement, Selector};
use crate::error::{Error, Result};

/// How the empty selector is written.
pub(super) const ALL: &str = "<all>";

impl FromStr for Selector {
    type Err = Error;

    /// Reads requirements joined by commas: `key=v` (or `key==v`), `key!=v`,
    /// `key in (a,b)`, `key notin (a,b)`, `key` (exists), `!key` (does not exist). The
    /// empty text and `<all>` are the empty selector.
    fn from_str(text: &str) -> Result<Selector> {
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed == ALL {
            return Ok(Selector::all());
        }
        let bad = |reason: String| Error::InvalidSelector {
            text: text.to_string(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(trimmed).map_err(&bad)? {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("an empty requirement (two commas in a row?)".into()));
            }
            requirements.push(requirement(part).map_err(|e| bad(e.to_string()))?);
        }
        Ok(Selector::new(requirements))
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced ')' at offset {i}"))?
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement> {
    if let Some(key) = part.strip_prefix('!') {
        return Requirement::new(key.trim(), Operator::DoesNotExist, None::<String>);
    }
    for (word, op) in [(" notin ", Operator::NotIn), (" in ", Operator::In)] {
        if let Some((key, rest)) = part.split_once(word) {
            let rest = rest.trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| Error::InvalidRequirement {
                    key: key.trim().to_string(),
                    reason: format!("expected a list of values in parentheses, got {rest:?}"),
                })?;
            let values = inner.split(',').map(str::trim).filter(|v| !v.is_empty());
            return Requirement::new(key.trim(), op, values);
        }
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Requirement::new(key.trim(), Operator::NotIn, [value.trim()]);
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Requirement::new(key.trim(), Operator::In, [value.trim()]);
    }
    Requirement::exists(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> Selector {
        s.parse().unwrap()
    }

    #[test]
    fn canonical_text_round_trips() {
        for text in [
            "<all>",
            "any:app=web",
            "any:app in (a,b),k8s:io.kubernetes.pod.namespace=shop",
            "!any:debug,k8s:tier notin (cache,db)",
            "k8s:app!=a,reserved:host",
            "cidr:10.0.0.0/8",
            "cidr:fd00--0/64",
        ] {
            assert_eq!(sel(text).to_string(), text);
        }
    }

    #[test]
    fn kubernetes_syntax_reads_into_the_canonical_form() {
        assert_eq!(
            sel("tier in ( db , cache ), app==web, !debug").to_string(),
            "any:app=web,!any:debug,any:tier in (cache,db)"
        );
        assert_eq!(sel("cidr:fd00::/64").to_string(), "cidr:fd00--0/64");
        assert_eq!(sel(""), Selector::all());
        assert_eq!(sel("app in (web)"), sel("app=web"));
    }

    #[test]
    fn bad_text_names_the_problem() {
        for (text, reason) in [
            ("app=web,,tier=db", "an empty requirement"),
            ("app in (a", "unbalanced '('"),
            ("app in a)", "unbalanced ')'"),
            ("app in a", "expected a list of values in parentheses"),
            ("app in ()", "In needs at least one value"),
            ("app=we b", "may not contain ' '"),
        ] {
            let err = text.parse::<Selector>().unwrap_err().to_string();
            assert!(err.contains(reason), "{text}: {err}");
            assert!(err.starts_with("invalid selector"), "{text}: {err}");
        }
    }
}

//! The name selectors of Cilium's DNS rules (`toPorts[].rules.dns[]`) and `toFQDNs[]`:
//! `matchName` and `matchPattern`, checked and matched as Cilium does.
//!
//! Names compare case-insensitively and without the root's trailing dot (`Example.COM.` is
//! `example.com`). In a pattern, `*` matches any run, possibly empty, of DNS-name characters
//! (`a-z`, `0-9`, `-`, `_`) and never a `.`: `*.example.com` matches `www.example.com` but
//! not `a.b.example.com` nor `example.com`. A pattern of `*` alone matches every name.

use crate::validate::FieldError;

/// One name selector of a DNS rule or of `toFQDNs`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DnsMatch {
    /// `matchName`: exactly this name (normalized: lower case, no trailing dot).
    Name(String),
    /// `matchPattern`: this pattern (normalized as a name), `*` standing for a run of
    /// DNS-name characters within one label.
    Pattern(String),
}

impl DnsMatch {
    /// Checks and normalizes `matchName` (`pattern` false) or `matchPattern` at `field`.
    ///
    /// Fails, naming the field, on an empty value or one with characters Cilium's CRD
    /// refuses (anything but letters, digits, `-`, `_`, `.` and, in a pattern, `*`), or
    /// an empty label (`a..b`).
    pub fn parse(field: &str, value: &str, pattern: bool) -> Result<DnsMatch, FieldError> {
        let name = normalize(value);
        let allowed = |c: char| is_name_char(c) || c == '.' || (pattern && c == '*');
        if name.is_empty() || name.split('.').any(str::is_empty) {
            return Err(FieldError::new(
                field,
                format!("{value:?} is not a DNS name (empty, or with an empty label)"),
            ));
        }
        if let Some(bad) = name.chars().find(|c| !allowed(*c)) {
            let what = if pattern { "matchPattern" } else { "matchName" };
            return Err(FieldError::new(
                field,
                format!("{value:?}: {bad:?} is not allowed in a {what}"),
            ));
        }
        Ok(if pattern {
            DnsMatch::Pattern(name)
        } else {
            DnsMatch::Name(name)
        })
    }

    /// Whether the queried `name` (as sent, any case, with or without the trailing dot)
    /// is selected.
    pub fn matches(&self, name: &str) -> bool {
        let name = normalize(name);
        match self {
            DnsMatch::Name(want) => *want == name,
            DnsMatch::Pattern(p) if p == "*" => true,
            DnsMatch::Pattern(p) => glob(p.as_bytes(), name.as_bytes()),
        }
    }
}

/// Lower case, without the root's trailing dot.
fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// A character a `*` may stand for: any DNS-name character but the label separator.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Matches `pattern` against `name`, `*` taking runs of name characters; iterative with
/// one backtrack point, as a star never crosses a `.` and so never needs more.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    // The last star seen and the name position its run currently ends at.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if p < pattern.len() && pattern[p] == name[n] {
            p += 1;
            n += 1;
        } else if let Some((sp, sn)) = star
            && is_name_char(char::from(name[sn]))
        {
            // Let the star take one more character, which must not be a dot.
            star = Some((sp, sn + 1));
            p = sp + 1;
            n = sn + 1;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, by exhaustive recursion: slow, obviously right.
    fn reference(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, _) => n.is_empty(),
            (Some(b'*'), _) => {
                reference(&p[1..], n)
                    || n.first().is_some_and(|&c| is_name_char(char::from(c)))
                        && reference(p, &n[1..])
            }
            (Some(&c), Some(&d)) => c == d && reference(&p[1..], &n[1..]),
            (Some(_), None) => false,
        }
    }

    fn pattern(p: &str) -> DnsMatch {
        DnsMatch::parse("matchPattern", p, true).unwrap()
    }

    #[test]
    fn wildcard_semantics_against_a_table_of_names() {
        let table: &[(&str, &str, bool)] = &[
            ("*", "anything.at.all", true),
            ("*", "com", true),
            ("*.example.com", "www.example.com", true),
            ("*.example.com", "WWW.Example.COM.", true),
            ("*.example.com", "_srv.example.com", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", "a.b.example.com", false),
            ("*.example.com", "wwwexample.com", false),
            ("*.example.com", "www.example.org", false),
            ("*example.com", "example.com", true),
            ("*example.com", "myexample.com", true),
            ("*example.com", "my.example.com", false),
            ("api*.example.com", "api.example.com", true),
            ("api*.example.com", "api-v2.example.com", true),
            ("api*.example.com", "xapi.example.com", false),
            ("a*b*c.example.com", "abc.example.com", true),
            ("a*b*c.example.com", "axxbyyc.example.com", true),
            ("a*b*c.example.com", "axb.c.example.com", false),
            ("www.*.com", "www.example.com", true),
            ("www.*.com", "www.a.b.com", false),
            ("sub.*", "sub.io", true),
            ("sub.*", "sub.io.uk", false),
        ];
        for &(p, name, want) in table {
            assert_eq!(pattern(p).matches(name), want, "{p} against {name}");
        }
    }

    #[test]
    fn names_match_exactly_ignoring_case_and_the_root_dot() {
        let m = DnsMatch::parse("matchName", "API.GitHub.com.", false).unwrap();
        assert_eq!(m, DnsMatch::Name("api.github.com".into()));
        assert!(m.matches("api.github.com"));
        assert!(m.matches("Api.Github.Com."));
        assert!(!m.matches("www.api.github.com"));
        assert!(!m.matches("api.github.co"));
    }

    #[test]
    fn bad_names_and_patterns_are_refused_naming_the_field() {
        for (value, pattern) in [
            ("", false),
            ("a..b", false),
            ("*.example.com", false),
            ("exa mple.com", true),
            ("a/b", true),
            (".", true),
        ] {
            let err =
                DnsMatch::parse("spec.egress[0].toFQDNs[0].matchName", value, pattern).unwrap_err();
            assert_eq!(
                err.field, "spec.egress[0].toFQDNs[0].matchName",
                "{value:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn glob_agrees_with_the_definition(p in "[ab.*]{0,8}", n in "[ab.]{0,8}") {
            prop_assert_eq!(glob(p.as_bytes(), n.as_bytes()), reference(p.as_bytes(), n.as_bytes()));
        }
    }
}

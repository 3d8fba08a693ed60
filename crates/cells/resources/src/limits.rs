//! Bounds on the work one applied text may cost, checked before anything decodes it.
//!
//! The YAML decoder's scanner costs time in the square of how deeply flow collections nest
//! (`[[[[...]]]]`): 200 KB of brackets take half a minute. The limits are checked with an
//! event parser of the same grammar (a safe port of libyaml, which the decoder is built on)
//! that stops at the first event past the depth limit, so a hostile text costs at most a few
//! milliseconds per megabyte before it is refused; only a text within the limits reaches the
//! decoder.

use libyaml_safer::{EventData, Parser};
use tokio_util::sync::CancellationToken;

use crate::config::{MAX_APPLY_MAX_DEPTH, ResourcesConfig};
use crate::error::{Error, Result};
use cellium_k8s_objects::document::DocumentError;

/// How many parser events pass between two looks at the cancellation token.
const EVENTS_PER_CANCEL_CHECK: u64 = 4096;

/// The limits on one applied text (`apply-max-bytes`, `apply-max-depth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest text, in bytes.
    pub max_bytes: usize,
    /// How deeply mappings and sequences may nest in one document.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let cfg = ResourcesConfig::default();
        Limits {
            max_bytes: cfg.apply_max_bytes,
            max_depth: cfg.apply_max_depth,
        }
    }
}

impl Limits {
    /// The configured limits; fails, naming the key, when one is out of range.
    pub fn from_config(cfg: &ResourcesConfig) -> Result<Limits> {
        if cfg.apply_max_bytes == 0 {
            return Err(Error::Config {
                key: "apply-max-bytes",
                reason: "must be at least 1".into(),
            });
        }
        if !(1..=MAX_APPLY_MAX_DEPTH).contains(&cfg.apply_max_depth) {
            return Err(Error::Config {
                key: "apply-max-depth",
                reason: format!(
                    "{} is not between 1 and {MAX_APPLY_MAX_DEPTH} (the YAML decoder refuses deeper documents)",
                    cfg.apply_max_depth
                ),
            });
        }
        Ok(Limits {
            max_bytes: cfg.apply_max_bytes,
            max_depth: cfg.apply_max_depth,
        })
    }

    /// Checks `text` (from `source`) against the limits: its size first, unread, then each
    /// document's nesting, event by event. A YAML syntax error found on the way is reported
    /// as the decoder would (`invalid YAML`), naming the document. Stops early with
    /// [`Error::Cancelled`] once `cancel` is cancelled.
    pub fn check(&self, source: &str, text: &str, cancel: &CancellationToken) -> Result<()> {
        if text.len() > self.max_bytes {
            return Err(Error::TooLarge {
                origin: source.to_string(),
                size: text.len(),
                limit: self.max_bytes,
            });
        }
        let fail = |index: usize, reason: String| {
            Error::Invalid(vec![DocumentError {
                source: source.to_string(),
                index: index.max(1),
                object: None,
                field: String::new(),
                reason,
            }])
        };
        // The port panics in a few places where C's libyaml reads the NUL past the end of its
        // buffer: the padding gives it that lookahead (trailing line breaks change no
        // document's structure), and a panic that still happens is a refusal, not a crash.
        let padded = format!("{text}\n\n\n\n");
        let checked = std::panic::catch_unwind(|| self.nesting(&padded, cancel, fail));
        checked.unwrap_or_else(|_| {
            Err(fail(
                1,
                "invalid YAML: its nesting cannot be checked (apply-max-depth)".into(),
            ))
        })
    }

    /// Walks the events of `text`, failing at the first collection nested deeper than the
    /// limit.
    fn nesting(
        &self,
        text: &str,
        cancel: &CancellationToken,
        fail: impl Fn(usize, String) -> Error,
    ) -> Result<()> {
        let mut input = text.as_bytes();
        let mut parser = Parser::new();
        parser.set_input_string(&mut input);
        let (mut document, mut depth, mut events) = (0, 0, 0u64);
        for event in &mut parser {
            events += 1;
            if events % EVENTS_PER_CANCEL_CHECK == 0 && cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            let event = event.map_err(|e| fail(document, format!("invalid YAML: {e}")))?;
            match event.data {
                EventData::DocumentStart { .. } => {
                    document += 1;
                    depth = 0;
                }
                EventData::SequenceStart { .. } | EventData::MappingStart { .. } => {
                    depth += 1;
                    if depth > self.max_depth {
                        return Err(fail(
                            document,
                            format!(
                                "nested more than {} levels deep at {} (apply-max-depth)",
                                self.max_depth, event.start_mark
                            ),
                        ));
                    }
                }
                EventData::SequenceEnd | EventData::MappingEnd => depth -= 1,
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(limits: Limits, text: &str) -> Result<()> {
        limits.check("f.yaml", text, &CancellationToken::new())
    }

    const SMALL: Limits = Limits {
        max_bytes: 1000,
        max_depth: 4,
    };

    #[test]
    fn a_text_within_the_limits_passes() {
        check(SMALL, "a: {b: [c, {d: e}]}\n---\nf: [g]\n").unwrap();
        check(SMALL, "").unwrap();
    }

    #[test]
    fn too_large_is_refused_unread_naming_the_limit() {
        let err = check(SMALL, &"#".repeat(1001)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.yaml: 1001 bytes is more than apply-max-bytes (1000)"
        );
    }

    #[test]
    fn too_deep_is_refused_naming_document_place_and_limit() {
        let err = check(SMALL, "a: b\n---\na:\n  b:\n    c: [[d]]\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "1 invalid document(s), nothing applied:\n  f.yaml: document 2: nested more than 4 levels deep at line 5 column 9 (apply-max-depth)"
        );
    }

    #[test]
    fn a_syntax_error_names_its_document() {
        let err = check(SMALL, "a: b\n---\na: [b\n").unwrap_err().to_string();
        assert!(err.contains("f.yaml: document 2: invalid YAML"), "{err}");
    }

    #[test]
    fn texts_the_checker_trips_on_are_refused_not_a_crash() {
        // An escape at the very end: the port looks past its buffer there.
        let err = check(SMALL, "a: \"\\").unwrap_err().to_string();
        assert!(err.contains("f.yaml: document 1: invalid YAML"), "{err}");
        // A tag right before a comma: the port panics ("TODO"), C's libyaml reads on.
        let err = check(SMALL, "[!t,a]").unwrap_err().to_string();
        assert!(
            err.contains("invalid YAML: its nesting cannot be checked"),
            "{err}"
        );
    }

    #[test]
    fn a_cancelled_check_stops() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let limits = Limits {
            max_bytes: 1 << 20,
            max_depth: 4,
        };
        let err = limits
            .check("f.yaml", &"- [a, b]\n".repeat(10_000), &cancel)
            .unwrap_err();
        assert!(matches!(err, Error::Cancelled), "{err}");
    }

    #[test]
    fn configured_limits_are_checked_naming_the_key() {
        let cfg = ResourcesConfig {
            apply_max_depth: 500,
            ..ResourcesConfig::default()
        };
        let err = Limits::from_config(&cfg).unwrap_err().to_string();
        assert!(
            err.starts_with("apply-max-depth: 500 is not between 1 and 128"),
            "{err}"
        );
        assert_eq!(
            Limits::from_config(&ResourcesConfig::default()).unwrap(),
            Limits::default()
        );
    }
}

//! The optional call log (`log-file`): one line per call.
//!
//! A line is `<time> <VERB> container=<id> ifname=<name> <outcome> in <ms>ms: <text>`, e.g.
//! `2026-11-21T19:40:09.123Z ADD container=3f2a ifname=eth0 ok in 41ms: endpoint 7: 10.0.0.5/32`
//! or `... DEL container=3f2a ifname=eth0 error 11 in 2ms: the Cellium agent is not running ...`.
//! Each line is written with one `write` on a file opened in append mode, so concurrent calls
//! for different pods do not interleave within a line.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What one call did, for its log line.
#[derive(Debug, Clone)]
pub struct Record<'a> {
    /// `CNI_COMMAND` as given ("-" when unset).
    pub verb: &'a str,
    /// `CNI_CONTAINERID`, if any.
    pub container_id: Option<&'a str>,
    /// `CNI_IFNAME`, if any.
    pub ifname: Option<&'a str>,
    /// `Ok(summary)` or `Err((code, message))`.
    pub outcome: Result<&'a str, (u32, String)>,
    /// How long the call took.
    pub elapsed: Duration,
    /// When it ended.
    pub at: SystemTime,
}

impl Record<'_> {
    /// The record as one line, newline included.
    pub fn line(&self) -> String {
        let (status, text) = match &self.outcome {
            Ok(summary) => ("ok".to_string(), *summary),
            Err((code, msg)) => (format!("error {code}"), msg.as_str()),
        };
        // A message with a newline would split the record over two lines.
        let text = text.replace(['\n', '\r'], " ");
        format!(
            "{} {} container={} ifname={} {status} in {}ms: {text}\n",
            humantime::format_rfc3339_millis(self.at),
            self.verb,
            self.container_id.unwrap_or("-"),
            self.ifname.unwrap_or("-"),
            self.elapsed.as_millis(),
        )
    }

    /// Appends the record to `path`, creating the file if needed.
    pub fn append_to(&self, path: &Path) -> io::Result<()> {
        let mut file = OpenOptions::new().create(true).append(true).open(path)?;
        file.write_all(self.line().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn record(outcome: Result<&'static str, (u32, String)>) -> Record<'static> {
        Record {
            verb: "ADD",
            container_id: Some("c1"),
            ifname: Some("eth0"),
            outcome,
            elapsed: Duration::from_millis(41),
            at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        }
    }

    #[test]
    fn a_line_says_verb_container_and_outcome() {
        assert_eq!(
            record(Ok("endpoint 7: 10.0.0.5/32")).line(),
            "2023-11-14T22:13:20.123Z ADD container=c1 ifname=eth0 ok in 41ms: endpoint 7: 10.0.0.5/32\n"
        );
        assert_eq!(
            record(Err((11, "agent down\nretry".into()))).line(),
            "2023-11-14T22:13:20.123Z ADD container=c1 ifname=eth0 error 11 in 41ms: agent down retry\n"
        );
    }

    #[test]
    fn records_are_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cni.log");
        record(Ok("first")).append_to(&path).unwrap();
        record(Err((7, "second".into()))).append_to(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("ok in 41ms: first"), "{text}");
        assert!(lines[1].ends_with("error 7 in 41ms: second"), "{text}");
    }
}

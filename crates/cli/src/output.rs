//! How commands print: a table for people, JSON for programs; and what happens when the
//! reader goes away.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The `-o` flag shared by every listing command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns.
    #[default]
    Table,
    /// One JSON document.
    Json,
}

/// The answer of gRPC `call`, or an error of the form `Endpoints.Get: no endpoint 7`: the
/// agent's own message, without tonic's status dump around it.
pub fn answer<T>(
    reply: Result<tonic::Response<T>, tonic::Status>,
    call: &str,
) -> anyhow::Result<T> {
    reply
        .map(tonic::Response::into_inner)
        .map_err(|s| anyhow::anyhow!("{call}: {}", reason(&s)))
}

/// The agent's message of a failed call; for a service the agent does not have (an agent
/// built without the cell that serves it, whose reply carries no message), says so.
pub fn reason(status: &tonic::Status) -> String {
    match (status.code(), status.message()) {
        (tonic::Code::Unimplemented, "") => {
            "this agent does not serve it (it is built without the cell that does)".into()
        }
        (code, "") => code.description().into(),
        (_, message) => message.into(),
    }
}

/// `outln!` for the CLI: a line on standard output through [`write_line`].
macro_rules! outln {
    () => {
        $crate::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}

/// Writes a line on standard output. SIGPIPE stays ignored (Rust's default) so that a write to
/// the agent's socket after the agent went away is an error the command reports, never a
/// signal that kills it silently; `outln!` would then panic on a closed standard output
/// instead. Here a reader that stopped reading (`cellium observe | head`) ends the program
/// quietly with success, as the reader asked for no more; any other failure to write ends it
/// with a message.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cellium: writing the output: {e}");
        std::process::exit(1);
    }
}

/// Prints `value` as pretty JSON.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints rows under a header, each column as wide as its widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        outln!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A wall-clock time in milliseconds since the epoch as RFC 3339 (UTC, seconds).
pub fn rfc3339_ms(unix_ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// How long ago `unix_ms` was, rounded to whole seconds ("3m 12s").
pub fn ago_ms(unix_ms: i64) -> String {
    let then = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    let secs = SystemTime::now()
        .duration_since(then)
        .unwrap_or_default()
        .as_secs();
    format!(
        "{} ago",
        humantime::format_duration(Duration::from_secs(secs))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_without_a_message_still_says_why() {
        let missing = tonic::Status::new(tonic::Code::Unimplemented, "");
        assert_eq!(
            reason(&missing),
            "this agent does not serve it (it is built without the cell that does)"
        );
        let refused = tonic::Status::new(tonic::Code::NotFound, "no endpoint 7");
        assert_eq!(reason(&refused), "no endpoint 7");
        let bare = tonic::Status::new(tonic::Code::Unavailable, "");
        assert_eq!(reason(&bare), tonic::Code::Unavailable.description());
    }

    #[test]
    fn rfc3339_is_utc_seconds() {
        assert_eq!(rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20Z");
    }
}

//! Running external tools (`ip`, `ping`, ...) with errors that carry the
//! command line and its stderr.

use std::process::{Command, Output};

use crate::error::{Error, Result};

fn line(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `program args...`, returning its output even on failure.
pub fn output(program: &str, args: &[&str]) -> Result<Output> {
    Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            cmd: line(program, args),
            source,
        })
}

/// Runs `program args...` and fails unless it exits with 0; returns stdout.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = output(program, args)?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: line(program, args),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_carry_the_command_and_stderr() {
        let err = run("sh", &["-c", "echo oops >&2; exit 3"]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("sh -c"), "{msg}");
        assert!(msg.contains("oops"), "{msg}");
        assert_eq!(run("sh", &["-c", "echo hi"]).unwrap(), "hi\n");
    }
}

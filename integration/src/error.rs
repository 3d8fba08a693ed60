//! Errors of the test helpers: each names the command, namespace or probe.

use std::io;

/// Errors of the integration helpers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command could not be started.
    #[error("cannot run `{cmd}`")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A command exited with a failure.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// Entering a network namespace failed.
    #[error("cannot enter network namespace {name}")]
    Setns {
        /// The namespace.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A helper thread panicked.
    #[error("the thread running in network namespace {name} panicked")]
    ThreadPanicked {
        /// The namespace.
        name: String,
    },
    /// A mount or unmount failed.
    #[error("cannot {op} {path}")]
    Mount {
        /// mount or unmount.
        op: &'static str,
        /// The mount point.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A probe's socket operation failed or timed out.
    #[error("{probe} to {target} failed")]
    Probe {
        /// What was tried (tcp connect, udp request, ...).
        probe: &'static str,
        /// The address.
        target: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A binary the tests run is not built.
    #[error(
        "{path} is missing: run `cargo build --workspace --all-targets` first (the tests run the built {name})"
    )]
    MissingBinary {
        /// The binary's name.
        name: &'static str,
        /// Where it was looked for.
        path: String,
    },
    /// A file or directory operation failed.
    #[error("cannot {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The agent exited, or never answered, while it was expected to serve.
    #[error("the agent {what}; its log:\n{log}")]
    Agent {
        /// What happened (`exited with status 1 before its API answered`, ...).
        what: String,
        /// The agent's log so far.
        log: String,
    },
    /// A tool printed JSON that could not be read.
    #[error("{what} printed invalid JSON: {text}")]
    Json {
        /// The command.
        what: String,
        /// What it printed.
        text: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A call of the agent's gRPC API failed (or the API could not be reached).
    #[error("{call} failed: {reason}")]
    Api {
        /// The call (`Endpoints.List`, `connect`, ...).
        call: &'static str,
        /// Why, as the client reported it.
        reason: String,
    },
    /// A benchmark was told to stop (SIGINT or SIGTERM).
    #[error("interrupted")]
    Interrupted,
    /// Unexpected output from a tool or peer.
    #[error("unexpected {what}: {detail}")]
    Unexpected {
        /// What was read.
        what: &'static str,
        /// What it contained.
        detail: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

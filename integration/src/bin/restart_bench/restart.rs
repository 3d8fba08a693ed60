//! One restart of an agent, timed from outside: the old process is stopped (SIGTERM, waiting
//! for it to exit) or killed (SIGKILL), the new one is executed, and its API is polled until
//! every endpoint is restored and enforcing.
//!
//! **Restored and enforcing**, as counted here: the API answers (it is served only once the
//! restore is done: the API server starts after every cell whose service it mounts) and one
//! `Endpoints.List` reports every endpoint the node had, each in state ready and each at the
//! policy revision the repository reports (`Policy.Get`, read once the endpoints agree). An
//! endpoint reports a revision once its policy at that revision is written to the datapath;
//! a restored endpoint's programs are attached before the restore ends.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cellium_integration::Agent;
use cellium_integration::bench::{Api, interrupted};

/// How long a restart may take before the benchmark gives up.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// How the old agent ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// SIGTERM, and its exit waited for: the stop hooks run.
    Term,
    /// SIGKILL, as a crash.
    Kill,
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Ending::Term => "SIGTERM",
            Ending::Kill => "SIGKILL",
        })
    }
}

/// What one restart took.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// From the signal to the old process's exit.
    pub stop: Duration,
    /// From the exec of the new process to its API's first answer.
    pub api: Duration,
    /// From the exec to every endpoint restored and enforcing.
    pub ready: Duration,
    /// The new process's start hooks, as its log reports them: (module, hook, elapsed).
    pub hooks: Vec<(String, String, Duration)>,
    /// The phases of the endpoints' restore, as its log reports them (`plan 12.1ms, ...`).
    pub phases: String,
}

/// Ends the agent as `ending` says, executes it again and waits until its `endpoints`
/// endpoints are restored and enforcing (see the module docs).
pub fn restart(
    agent: &mut Agent,
    ending: Ending,
    endpoints: usize,
    runtime: &tokio::runtime::Runtime,
) -> Result<Timeline> {
    let signalled = Instant::now();
    match ending {
        Ending::Term => {
            let (status, _) = agent.stop()?;
            if !status.success() {
                bail!("the agent exited with {status} on SIGTERM");
            }
        }
        Ending::Kill => agent.kill()?,
    }
    let stop = signalled.elapsed();
    let log_before = agent.log().len();
    let launched = Instant::now();
    agent.launch()?;
    let (api, ready) = runtime.block_on(wait_restored(agent, launched, endpoints))?;
    let log = agent.log();
    let log = log.get(log_before..).unwrap_or_default();
    Ok(Timeline {
        stop,
        api: api - launched,
        ready: ready - launched,
        hooks: start_hooks(log),
        phases: restore_phases(log),
    })
}

/// Polls the API (a connection attempt, then `Endpoints.List` a millisecond after each
/// answer) until every endpoint is restored and enforcing; returns when the API first
/// answered and when the endpoints were first seen so.
async fn wait_restored(
    agent: &mut Agent,
    launched: Instant,
    endpoints: usize,
) -> Result<(Instant, Instant)> {
    let socket = agent.socket();
    let mut first_answer = None;
    loop {
        interrupted()?;
        if launched.elapsed() > RESTART_TIMEOUT {
            bail!(
                "the endpoints were not restored within {RESTART_TIMEOUT:?}; the agent's log:\n{}",
                agent.log()
            );
        }
        if !agent.is_running() {
            bail!("the agent exited while starting; its log:\n{}", agent.log());
        }
        if let Some(ready) = poll(&socket, endpoints, &mut first_answer).await? {
            let api = first_answer.unwrap_or(ready);
            return Ok((api, ready));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One connection: `Endpoints.List` until every endpoint is restored and enforcing (the moment
/// it was seen), or the connection fails (`None`: connect again).
async fn poll(
    socket: &Path,
    endpoints: usize,
    first_answer: &mut Option<Instant>,
) -> Result<Option<Instant>> {
    let Ok(mut api) = Api::connect(socket).await else {
        return Ok(None);
    };
    loop {
        interrupted()?;
        let Ok(seen) = api.enforced().await else {
            return Ok(None);
        };
        let at = Instant::now();
        first_answer.get_or_insert(at);
        let agreed =
            seen.endpoints == endpoints && seen.ready == endpoints && seen.lowest == seen.highest;
        if agreed && (endpoints == 0 || api.revision().await? == seen.lowest) {
            return Ok(Some(at));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The `start hook done` lines of an agent's log: (module, hook, elapsed), in order.
fn start_hooks(log: &str) -> Vec<(String, String, Duration)> {
    log.lines()
        .filter(|l| l.contains("start hook done"))
        .filter_map(|l| {
            let field = |name: &str| {
                let at = l.find(&format!("{name}="))? + name.len() + 1;
                let rest = &l[at..];
                let end = rest.find([' ', '}', ':']).unwrap_or(rest.len());
                Some(rest[..end].trim_matches('"').to_string())
            };
            let elapsed = parse_debug_duration(&field("elapsed")?)?;
            Some((field("module")?, field("hook")?, elapsed))
        })
        .collect()
}

/// The `took` field of the endpoint manager's `endpoints restored` line (empty without one).
fn restore_phases(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("endpoints restored"))
        .find_map(|l| l.split_once(" took="))
        .map(|(_, rest)| rest.trim().to_string())
        .unwrap_or_default()
}

/// Parses a `Duration`'s `Debug` text (`1.234ms`, `56.7µs`, `2.1s`, `890ns`).
fn parse_debug_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let secs = match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" | "us" => value / 1e6,
        "ns" => value / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_lines_are_read_from_the_log() {
        let log = "2025-01-01T00:00:00Z  INFO hook{module=endpoint-manager hook=restore-endpoints phase=start}: cellium_hive::lifecycle: start hook done elapsed=1.25s\n\
                   2025-01-01T00:00:00Z  INFO hook{module=api-server hook=serve-api phase=start}: cellium_hive::lifecycle: start hook done elapsed=350.5µs\n\
                   2025-01-01T00:00:00Z  INFO other line\n";
        let hooks = start_hooks(log);
        assert_eq!(
            hooks,
            vec![
                (
                    "endpoint-manager".into(),
                    "restore-endpoints".into(),
                    Duration::from_millis(1250)
                ),
                (
                    "api-server".into(),
                    "serve-api".into(),
                    Duration::from_secs_f64(350.5e-6)
                ),
            ]
        );
    }
}

//! One start of a stopped agent, timed from outside: the process is executed and its API
//! polled until every endpoint of the node is restored and enforcing. What the restart and
//! Kubernetes benchmarks both time.
//!
//! **Restored and enforcing**, as counted here: the API answers (it is served only once the
//! restore is done: the API server starts after every cell whose service it mounts) and one
//! `Endpoints.List` reports every endpoint the node had, each in state ready and each at the
//! policy revision the repository reports (`Policy.Get`, read once the endpoints agree). An
//! endpoint reports a revision once its policy at that revision is written to the datapath;
//! a restored endpoint's programs are attached before the restore ends.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use crate::agent::Agent;
use crate::bench::{Api, interrupted};
use crate::error::{Error, Result};

/// How long a start may take before the benchmark gives up.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// What one start took, from the exec.
#[derive(Debug, Clone)]
pub struct Start {
    /// The wall clock at the exec, to place the log's timestamps.
    pub launched: SystemTime,
    /// To the API's first answer.
    pub api: Duration,
    /// To every endpoint restored and enforcing.
    pub ready: Duration,
    /// The start hooks, as the log reports them: (module, hook, elapsed).
    pub hooks: Vec<(String, String, Duration)>,
    /// The phases of the endpoints' restore, as the log reports them (`plan 12.1ms, ...`).
    pub phases: String,
    /// The agent's log of this start.
    pub log: String,
}

/// Executes the stopped agent and waits until its `endpoints` endpoints are restored and
/// enforcing (see the module docs).
pub fn start(
    agent: &mut Agent,
    endpoints: usize,
    runtime: &tokio::runtime::Runtime,
) -> Result<Start> {
    let log_before = agent.log().len();
    let launched = SystemTime::now();
    let at = Instant::now();
    agent.launch()?;
    let (api, ready) = runtime.block_on(wait_restored(agent, at, endpoints))?;
    let log = agent
        .log()
        .get(log_before..)
        .unwrap_or_default()
        .to_string();
    Ok(Start {
        launched,
        api: api - at,
        ready: ready - at,
        hooks: start_hooks(&log),
        phases: restore_phases(&log),
        log,
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
        if launched.elapsed() > START_TIMEOUT {
            return Err(Error::Unexpected {
                what: "start",
                detail: format!(
                    "the endpoints were not restored within {START_TIMEOUT:?}; the agent's \
                     log:\n{}",
                    agent.log()
                ),
            });
        }
        if !agent.is_running() {
            return Err(Error::Unexpected {
                what: "start",
                detail: format!("the agent exited while starting; its log:\n{}", agent.log()),
            });
        }
        if let Some(ready) = poll(&socket, endpoints, &mut first_answer).await? {
            return Ok((first_answer.unwrap_or(ready), ready));
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
pub fn start_hooks(log: &str) -> Vec<(String, String, Duration)> {
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
pub fn restore_phases(log: &str) -> String {
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

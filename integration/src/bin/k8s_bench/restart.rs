//! One start of the stopped agent, timed from outside: the process is executed and its API
//! polled until every kind is synced and every endpoint of the node is restored and
//! enforcing.
//!
//! **Synced and enforcing**, as counted here: the API answers and one `Endpoints.List`
//! reports every endpoint the node had, each in state ready and each at the policy revision
//! the repository reports (`Policy.Get`, read once the endpoints agree). The endpoints are
//! restored only after the `sync-from-api-server` hook, which returns once every kind holds
//! the API server's complete list, so this moment is after both. When every kind was synced
//! is read from the agent's log (the timestamp of its `every kind synced from the API server`
//! line against the wall clock at the exec).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Result, bail};
use cellium_integration::Agent;
use cellium_integration::bench::{Api, interrupted};

/// How long a start may take before the benchmark gives up.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// What one start took, from the exec.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// To the API's first answer.
    pub api: Duration,
    /// To every kind synced (from the log).
    pub synced: Duration,
    /// To every endpoint restored and enforcing.
    pub ready: Duration,
    /// The start hooks, as the log reports them: (module, hook, elapsed).
    pub hooks: Vec<(String, String, Duration)>,
    /// The phases of the endpoints' restore, as the log reports them.
    pub phases: String,
    /// The objects of each kind the agent synced, as the log reports them (`Kind=count`,
    /// in the order of the floor's line).
    pub objects: String,
}

/// Executes the stopped agent and waits until its `endpoints` endpoints are restored and
/// enforcing (see the module docs).
pub fn start(
    agent: &mut Agent,
    endpoints: usize,
    runtime: &tokio::runtime::Runtime,
) -> Result<Timeline> {
    let log_before = agent.log().len();
    let wall = SystemTime::now();
    let launched = Instant::now();
    agent.launch()?;
    let (api, ready) = runtime.block_on(wait_restored(agent, launched, endpoints))?;
    let log = agent.log();
    let log = log.get(log_before..).unwrap_or_default();
    let synced = log
        .lines()
        .find(|l| l.contains("every kind synced from the API server"))
        .and_then(|l| timestamp(l.split_whitespace().next()?))
        .and_then(|at| at.duration_since(wall).ok());
    let Some(synced) = synced else {
        bail!("no `every kind synced` line in the agent's log:\n{log}");
    };
    Ok(Timeline {
        api: api - launched,
        synced,
        ready: ready - launched,
        hooks: start_hooks(log),
        phases: restore_phases(log),
        objects: synced_objects(log),
    })
}

/// Polls the API until every endpoint is restored and enforcing; returns when the API first
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
            bail!(
                "the endpoints were not restored within {START_TIMEOUT:?}; the agent's log:\n{}",
                agent.log()
            );
        }
        if !agent.is_running() {
            bail!("the agent exited while starting; its log:\n{}", agent.log());
        }
        if let Some(ready) = poll(&socket, endpoints, &mut first_answer).await? {
            return Ok((first_answer.unwrap_or(ready), ready));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One connection: `Endpoints.List` until every endpoint is restored and enforcing, or the
/// connection fails (`None`: connect again).
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

/// A log line's RFC 3339 UTC timestamp (`2026-01-02T03:04:05.678901Z`).
fn timestamp(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<u64>().ok()?,
        t.next()?.parse::<u64>().ok()?,
    );
    let secs: f64 = t.next()?.parse().ok()?;
    // Days since 1970-01-01 of a proleptic Gregorian date.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let whole = days * 86_400 + h * 3600 + min * 60;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(whole) + Duration::from_secs_f64(secs))
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

/// The `synced from the API server kind="K" objects=N` lines, as `K=N ...` in the order of
/// the agent's kinds.
fn synced_objects(log: &str) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for l in log
        .lines()
        .filter(|l| l.contains("synced from the API server kind="))
    {
        let field = |name: &str| {
            let at = l.find(&format!("{name}="))? + name.len() + 1;
            let rest = &l[at..];
            let end = rest.find(' ').unwrap_or(rest.len());
            Some(rest[..end].trim_matches('"').to_string())
        };
        if let (Some(kind), Some(n)) = (field("kind"), field("objects")) {
            counts.insert(kind, n);
        }
    }
    KINDS
        .iter()
        .map(|k| format!("{k}={}", counts.get(*k).map_or("?", String::as_str)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The kinds the agent watches, in the order the floor prints them.
const KINDS: [&str; 8] = [
    "Namespace",
    "Pod",
    "Node",
    "Service",
    "EndpointSlice",
    "NetworkPolicy",
    "CiliumNetworkPolicy",
    "CiliumClusterwideNetworkPolicy",
];

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
    fn log_timestamps_are_read() {
        let at = timestamp("2026-11-24T04:49:41.250000Z").unwrap();
        let secs = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(secs.as_millis(), 1_795_495_781_250);
        assert!(timestamp("INFO").is_none());
    }
}

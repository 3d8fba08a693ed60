//! One start of the stopped agent in Kubernetes mode, timed from outside as
//! [`cellium_integration::bench::start`] says, and when every kind was synced.
//!
//! **Synced and enforcing**: the endpoints are
//! restored only after the `sync-from-api-server` hook, which returns once every kind holds
//! the API server's complete list, so this moment is after both. When every kind was synced
//! is read from the agent's log (the timestamp of its `every kind synced from the API server`
//! line against the wall clock at the exec).

use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use cellium_integration::{Agent, bench};

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
    let started = bench::start::start(agent, endpoints, runtime)?;
    let synced = started
        .log
        .lines()
        .find(|l| l.contains("every kind synced from the API server"))
        .and_then(|l| timestamp(l.split_whitespace().next()?))
        .and_then(|at| at.duration_since(started.launched).ok());
    let Some(synced) = synced else {
        bail!(
            "no `every kind synced` line in the agent's log:\n{}",
            started.log
        );
    };
    Ok(Timeline {
        api: started.api,
        synced,
        ready: started.ready,
        objects: synced_objects(&started.log),
        hooks: started.hooks,
        phases: started.phases,
    })
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

//! One restart of an agent, timed from outside: the old process is stopped (SIGTERM, waiting
//! for it to exit) or killed (SIGKILL), then started again and timed as
//! [`cellium_integration::bench::start`] says.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cellium_integration::Agent;
use cellium_integration::bench::start::start;

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
    let started = start(agent, endpoints, runtime)?;
    Ok(Timeline {
        stop,
        api: started.api,
        ready: started.ready,
        hooks: started.hooks,
        phases: started.phases,
    })
}

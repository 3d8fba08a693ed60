//! Waiting on a condition, the one way tests wait: a condition polled until it holds, never
//! a sleep that hopes it will have. The bound is generous, for a busy 2-core machine; only a
//! failing test ever waits that long.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a condition may take before a test gives up.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(50);

/// Polls `f` until it gives a value; the error names `what` once `within` has passed.
pub fn poll_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let began = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if began.elapsed() > within {
            return Err(Error::Unexpected {
                what: "wait",
                detail: format!("{what}: not so after {within:?}"),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Polls `ok` until it holds, and returns how long that took; the error names `what` once
/// `within` has passed.
pub fn poll_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> Result<Duration> {
    let began = Instant::now();
    poll_for(what, within, || ok().then_some(()))?;
    Ok(began.elapsed())
}

/// In a test: the value `f` gives within [`CONVERGE`]; panics naming `what` if it never does.
pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll_for(what, CONVERGE, f).unwrap_or_else(|e| panic!("{e}"))
}

/// In a test: waits until `ok` holds, within [`CONVERGE`], and returns how long it took;
/// panics naming `what` if it never does.
pub fn eventually(what: &str, ok: impl FnMut() -> bool) -> Duration {
    eventually_or(what, String::new, ok)
}

/// As [`eventually`], the panic message followed by `context()` (the agents' logs, say).
pub fn eventually_or(
    what: &str,
    context: impl FnOnce() -> String,
    ok: impl FnMut() -> bool,
) -> Duration {
    poll_until(what, CONVERGE, ok).unwrap_or_else(|e| panic!("{e}\n{}", context()))
}

/// A container ID unique to this test process: `tag`, then the process ID, so that test
/// binaries running side by side do not share their pods' records.
pub fn container_id(tag: &str) -> String {
    format!("{tag}x{}", std::process::id())
}

/// How many rounds of a stream show it flowing (before, during or after an event).
pub const FLOWING_ROUNDS: usize = 20;

/// The rounds a background stream has completed, counted as they happen, so that a test
/// waits for traffic to have flowed (before, during and after an event) instead of sleeping.
#[derive(Debug, Clone, Default)]
pub struct Rounds(Arc<AtomicUsize>);

impl Rounds {
    /// One more round completed.
    pub fn done(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until `n` more rounds complete, or until `ended()` says the stream stopped (its
    /// failure is then for the caller to report when it collects the stream); panics after
    /// [`CONVERGE`].
    pub fn wait_more(&self, n: usize, ended: impl Fn() -> bool) {
        let target = self.0.load(Ordering::Relaxed) + n;
        eventually(&format!("{n} more rounds of the stream"), || {
            self.0.load(Ordering::Relaxed) >= target || ended()
        });
    }
}

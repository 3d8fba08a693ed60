//! Timer jobs: run a function at an interval, or early when triggered.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{JobContext, Jobs};
use crate::error::BoxError;
use crate::health::Level;

type TimerFn = Box<dyn FnMut(JobContext) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// Runs a timer job early. Triggers coalesce: any number of calls before the
/// job's next run cause one run. A trigger pulled before the job starts makes
/// its first run happen at start.
#[derive(Clone, Default)]
pub struct Trigger {
    inner: Arc<TriggerInner>,
}

#[derive(Default)]
struct TriggerInner {
    pending: AtomicBool,
    notify: Notify,
}

impl fmt::Debug for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trigger")
            .field("pending", &self.inner.pending.load(Ordering::Relaxed))
            .finish()
    }
}

impl Trigger {
    /// A trigger not attached to a job yet; give it to [`Timer::trigger`].
    pub fn new() -> Trigger {
        Trigger::default()
    }

    /// Requests a run as soon as possible.
    pub fn trigger(&self) {
        self.inner.pending.store(true, Ordering::SeqCst);
        self.inner.notify.notify_one();
    }

    /// Completes once triggered (a trigger pulled earlier counts).
    async fn wait(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.inner.pending.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// Whether a run was requested and has not started yet.
    fn is_pending(&self) -> bool {
        self.inner.pending.load(Ordering::SeqCst)
    }

    /// Marks pending triggers as served by the run that is starting.
    fn consume(&self) {
        self.inner.pending.store(false, Ordering::SeqCst);
    }
}

/// A timer job being built; call [`add`](Timer::add) to add it.
///
/// The first run comes at start, so that what the job keeps (collected
/// garbage, a resynchronised map) holds from the start and its health is known
/// at once rather than an interval later; then every interval (or at a
/// trigger). The interval is counted from the start of the last run, so a run
/// longer than the interval is followed at once by the next. An interval of
/// zero means "only when triggered". The job is Unknown until its first run ends
/// (a zero-interval timer with no trigger pending is OK: nothing is due); a
/// failed run turns it Degraded until a run succeeds.
#[must_use = "a job runs only once `.add()` is called"]
pub struct Timer {
    jobs: Jobs,
    name: String,
    interval: Duration,
    f: TimerFn,
    trigger: Option<Trigger>,
}

impl Jobs {
    /// A timer job named `name` running `f` every `interval`.
    pub fn timer<F, Fut>(&self, name: &str, interval: Duration, mut f: F) -> Timer
    where
        F: FnMut(JobContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        Timer {
            jobs: self.clone(),
            name: name.to_string(),
            interval,
            f: Box::new(move |ctx| Box::pin(f(ctx))),
            trigger: None,
        }
    }
}

impl Timer {
    /// Lets `trigger` run the job before the interval is over.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.trigger = Some(trigger);
        self
    }

    /// Adds the job: it starts with the module's jobs, or at once if they run.
    pub fn add(self) {
        let Timer {
            jobs,
            name,
            interval,
            mut f,
            trigger,
        } = self;
        jobs.add(
            &name,
            Box::new(move |ctx| {
                Box::pin(async move {
                    let r = ctx.reporter().clone();
                    let pending = trigger.as_ref().is_some_and(Trigger::is_pending);
                    if interval.is_zero() && !pending {
                        r.set_internal(Level::Ok, "waiting for a trigger");
                    } else {
                        r.set_internal(Level::Unknown, "waiting for the first run");
                    }
                    let mut next = (!interval.is_zero()).then(Instant::now);
                    loop {
                        let tick = async {
                            match next {
                                Some(at) => tokio::time::sleep_until(at).await,
                                None => std::future::pending().await,
                            }
                        };
                        let triggered = async {
                            match &trigger {
                                Some(t) => t.wait().await,
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            _ = ctx.cancelled() => break,
                            _ = tick => {}
                            _ = triggered => {}
                        }
                        if let Some(t) = &trigger {
                            t.consume();
                        }
                        let started = Instant::now();
                        next = (!interval.is_zero()).then(|| started + interval);
                        let version = r.version();
                        let result = f(ctx.clone()).await;
                        if ctx.is_cancelled() {
                            break;
                        }
                        match result {
                            Ok(()) => {
                                if r.version() == version {
                                    r.set_internal(
                                        Level::Ok,
                                        format!("ok ({:?})", started.elapsed()),
                                    );
                                }
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, "timer job run failed");
                                r.set_internal(Level::Degraded, format!("run failed: {err}"));
                            }
                        }
                    }
                    r.set_internal(Level::Stopped, "stopped");
                })
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::job::eventually;
    use crate::{Hive, Module};

    #[tokio::test(start_paused = true)]
    async fn runs_every_interval_and_triggers_coalesce() {
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let trigger = Trigger::new();
        let t = trigger.clone();
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |jobs: Jobs| {
                let r = r.clone();
                jobs.timer("gc", Duration::from_secs(10), move |_| {
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n == 1 {
                            Err("gc failed".into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .trigger(t.clone())
                .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        let start = Instant::now();
        eventually("the first run, at start", || {
            runs.load(Ordering::SeqCst) == 1
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the next run waits an interval"
        );
        assert!(
            health
                .node("m.gc")
                .unwrap()
                .status
                .message
                .starts_with("ok (")
        );
        trigger.trigger();
        trigger.trigger();
        trigger.trigger();
        eventually("one triggered run", || runs.load(Ordering::SeqCst) == 2).await;
        let gc = health.node("m.gc").unwrap();
        assert_eq!(gc.status.level, Level::Degraded);
        assert_eq!(gc.status.message, "run failed: gc failed");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "three triggers made one run"
        );
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "counted from the triggered run"
        );
        eventually("the next interval", || runs.load(Ordering::SeqCst) == 3).await;
        assert!(start.elapsed() >= Duration::from_secs(15));
        assert_eq!(health.node("m.gc").unwrap().status.level, Level::Ok);
        hive.stop().await.unwrap();
        assert_eq!(health.node("m.gc").unwrap().status.level, Level::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_runs_only_when_triggered_even_before_start() {
        let runs: Arc<Mutex<u32>> = Arc::default();
        let r = runs.clone();
        let trigger = Trigger::new();
        trigger.trigger();
        let t = trigger.clone();
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |jobs: Jobs| {
                let r = r.clone();
                jobs.timer("resync", Duration::ZERO, move |_| {
                    *r.lock().unwrap() += 1;
                    async { Ok(()) }
                })
                .trigger(t.clone())
                .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        eventually("the early trigger is served", || *runs.lock().unwrap() == 1).await;
        eventually("ok after its first run", || {
            health.node("m.resync").unwrap().status.level == Level::Ok
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(*runs.lock().unwrap(), 1);
        trigger.trigger();
        eventually("a second run", || *runs.lock().unwrap() == 2).await;
        hive.stop().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_timer_with_no_trigger_pending_has_nothing_due() {
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(|jobs: Jobs| {
                jobs.timer("regenerate", Duration::ZERO, |_| async { Ok(()) })
                    .trigger(Trigger::new())
                    .add();
                jobs.timer("gc", Duration::from_secs(30), |_| async {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Ok(())
                })
                .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        eventually("both jobs run", || {
            health.node("m.gc").unwrap().status.message != "not started"
                && health.node("m.regenerate").unwrap().status.message != "not started"
        })
        .await;
        let regenerate = health.node("m.regenerate").unwrap();
        assert_eq!(
            (regenerate.status.level, regenerate.status.message.as_str()),
            (Level::Ok, "waiting for a trigger")
        );
        assert_eq!(
            health.node("m").unwrap().status.level,
            Level::Unknown,
            "gc's first run has not ended"
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(health.node("m").unwrap().status.level, Level::Ok);
        hive.stop().await.unwrap();
    }
}

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

    /// Marks pending triggers as served by the run that is starting.
    fn consume(&self) {
        self.inner.pending.store(false, Ordering::SeqCst);
    }
}

/// A timer job being built; call [`add`](Timer::add) to add it.
///
/// The first run comes one interval after start (or at a trigger); the interval
/// is counted from the start of the last run, so a run longer than the interval
/// is followed at once by the next. An interval of zero means "only when
/// triggered". A failed run turns the job Degraded until a run succeeds.
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
                    r.set_internal(Level::Ok, "waiting for the first run");
                    let mut next = (!interval.is_zero()).then(|| Instant::now() + interval);
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

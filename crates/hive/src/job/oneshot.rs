//! One-shot jobs: run a function once, with optional retries.

use std::future::Future;

use futures::future::BoxFuture;

use super::{Backoff, JobContext, Jobs};
use crate::error::{BoxError, JobError};
use crate::health::Level;

type OneShotFn = Box<dyn FnMut(JobContext) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// A one-shot job being built; call [`add`](OneShot::add) to add it.
///
/// The function runs once; on error it is retried with [`retry`](OneShot::retry),
/// else the job fails for good: its node stays Degraded and, with
/// [`shutdown_on_error`](OneShot::shutdown_on_error), the hive shuts down with the
/// error (a process whose essential job failed must not look healthy).
#[must_use = "a job runs only once `.add()` is called"]
pub struct OneShot {
    jobs: Jobs,
    name: String,
    f: OneShotFn,
    retry: Option<Backoff>,
    shutdown_on_error: bool,
}

impl Jobs {
    /// A one-shot job named `name` running `f`.
    pub fn one_shot<F, Fut>(&self, name: &str, mut f: F) -> OneShot
    where
        F: FnMut(JobContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        OneShot {
            jobs: self.clone(),
            name: name.to_string(),
            f: Box::new(move |ctx| Box::pin(f(ctx))),
            retry: None,
            shutdown_on_error: false,
        }
    }
}

impl OneShot {
    /// Retries a failed run after the backoff's delay, up to its `max_retries`.
    pub fn retry(mut self, backoff: Backoff) -> Self {
        self.retry = Some(backoff);
        self
    }

    /// Asks the hive to shut down with the error if the job fails for good.
    pub fn shutdown_on_error(mut self) -> Self {
        self.shutdown_on_error = true;
        self
    }

    /// Adds the job: it starts with the module's jobs, or at once if they run.
    pub fn add(self) {
        let OneShot {
            jobs,
            name,
            mut f,
            retry,
            shutdown_on_error,
        } = self;
        let shutdowner = shutdown_on_error.then(|| jobs.shutdowner().clone());
        let module = jobs.module_id().to_string();
        let job_name = name.clone();
        jobs.add(
            &name,
            Box::new(move |ctx| {
                Box::pin(async move {
                    let r = ctx.reporter().clone();
                    // Not known to work until it returns or says so itself.
                    r.set_internal(Level::Unknown, "running");
                    let mut retries = 0u32;
                    loop {
                        let err = match f(ctx.clone()).await {
                            Ok(()) => {
                                tracing::debug!("one-shot job done");
                                r.remove();
                                return;
                            }
                            Err(err) => err,
                        };
                        if ctx.is_cancelled() {
                            r.set_internal(Level::Stopped, "cancelled");
                            return;
                        }
                        retries += 1;
                        if let Some(backoff) = retry.filter(|b| b.allows(retries)) {
                            let delay = backoff.delay(retries);
                            let msg = format!(
                                "attempt {retries} failed, retrying in {}: {err}",
                                humantime_serde::re::humantime::format_duration(delay)
                            );
                            tracing::warn!("{msg}");
                            r.set_internal(Level::Degraded, msg);
                            tokio::select! {
                                _ = tokio::time::sleep(delay) => continue,
                                _ = ctx.cancelled() => {
                                    r.set_internal(Level::Stopped, "cancelled");
                                    return;
                                }
                            }
                        }
                        tracing::error!(error = %err, "one-shot job failed");
                        r.set_internal(Level::Degraded, format!("failed: {err}"));
                        if let Some(s) = shutdowner {
                            s.shutdown(Some(Box::new(JobError {
                                job: job_name,
                                module,
                                source: err,
                            })));
                        }
                        return;
                    }
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

    use crate::job::eventually;
    use crate::{Backoff, Error, Hive, Jobs, Level, Module};

    fn backoff(max_retries: Option<u32>) -> Backoff {
        Backoff {
            min: Duration::from_secs(1),
            max: Duration::from_secs(4),
            factor: 2.0,
            max_retries,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_show_degraded_then_a_success_removes_the_node() {
        let attempts = Arc::new(AtomicU32::new(0));
        let a = attempts.clone();
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |jobs: Jobs| {
                let a = a.clone();
                jobs.one_shot("restore", move |_| {
                    let n = a.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n < 2 {
                            Err(format!("try {n} failed").into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .retry(backoff(None))
                .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        eventually("two failures and a success", || {
            if let Some(n) = health.node("m.restore") {
                let mut s = seen.lock().unwrap();
                if s.last() != Some(&n.status.message) {
                    s.push(n.status.message.clone());
                }
            }
            attempts.load(Ordering::SeqCst) == 3 && health.node("m.restore").is_none()
        })
        .await;
        let seen = seen.lock().unwrap().join("\n");
        assert!(
            seen.contains("attempt 1 failed, retrying in 1s: try 0 failed"),
            "{seen}"
        );
        assert!(
            seen.contains("attempt 2 failed, retrying in 2s: try 1 failed"),
            "{seen}"
        );
        assert_eq!(health.node("m").unwrap().status.level, Level::Ok);
        hive.stop().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_running_job_is_unknown_until_it_reports() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut hive = Hive::new([Module::new("api", "x")
            .invoke(move |jobs: Jobs| {
                let tx = tx.clone();
                jobs.one_shot("serve", move |ctx| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(());
                        // Binding, loading...: then it serves until cancelled.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        ctx.reporter().ok("serving");
                        ctx.cancelled().await;
                        Ok(())
                    }
                })
                .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        rx.recv().await.unwrap();
        let level = |id: &str| health.node(id).unwrap().status.level;
        assert_eq!(level("api.serve"), Level::Unknown);
        assert_eq!(level("api"), Level::Unknown, "the module shows it");
        eventually("it reports", || level("api.serve") == Level::Ok).await;
        assert_eq!(level("api"), Level::Ok);
        hive.stop().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_essential_job_shuts_the_hive_down_with_its_error() {
        let hive = Hive::new([Module::new("cp", "x")
            .cell(Module::new("ipam", "x").invoke(|jobs: Jobs| {
                jobs.one_shot("restore", |_| async { Err("state dir unreadable".into()) })
                    .retry(backoff(Some(1)))
                    .shutdown_on_error()
                    .add();
            }))
            .into()]);
        let health = hive.health();
        let err = hive.run(std::future::pending()).await.unwrap_err();
        assert!(matches!(err, Error::Shutdown { .. }), "{err:?}");
        let job = std::error::Error::source(&err).unwrap();
        assert_eq!(job.to_string(), "job `restore` of module `cp.ipam` failed");
        assert_eq!(job.source().unwrap().to_string(), "state dir unreadable");
        assert_eq!(health.level(), Level::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_job_without_shutdown_stays_degraded() {
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(|jobs: Jobs| {
                jobs.one_shot("once", |_| async { Err("boom".into()) })
                    .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        eventually("the job fails", || {
            health
                .node("m.once")
                .is_some_and(|n| n.status.level == Level::Degraded)
        })
        .await;
        let m = health.node("m").unwrap();
        assert_eq!(m.status.level, Level::Degraded);
        assert_eq!(m.status.message, "m.once: failed: boom");
        assert!(!hive.shutdowner().is_requested());
        hive.stop().await.unwrap();
    }
}

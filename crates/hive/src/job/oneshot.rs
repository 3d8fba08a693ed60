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
                    r.set_internal(Level::Ok, "running");
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

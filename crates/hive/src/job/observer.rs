//! Observer jobs: run a function for each item of a stream.

use std::future::Future;

use futures::{Stream, StreamExt};

use super::{JobContext, JobFn, Jobs};
use crate::error::BoxError;
use crate::health::Level;

/// An observer job being built; call [`add`](Observer::add) to add it.
///
/// The function runs for each item, one at a time, in order. A failed item turns
/// the job Degraded (the next success clears it) and the job goes on; it ends,
/// Stopped, when the stream ends or the hive stops.
#[must_use = "a job runs only once `.add()` is called"]
pub struct Observer {
    jobs: Jobs,
    name: String,
    run: JobFn,
}

impl Jobs {
    /// An observer job named `name` running `f` for each item of `stream`.
    pub fn observer<S, F, Fut>(&self, name: &str, stream: S, mut f: F) -> Observer
    where
        S: Stream + Send + 'static,
        S::Item: Send + 'static,
        F: FnMut(S::Item, JobContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let run: JobFn = Box::new(move |ctx: JobContext| {
            Box::pin(async move {
                let r = ctx.reporter().clone();
                r.set_internal(Level::Ok, "observing");
                let mut stream = std::pin::pin!(stream);
                loop {
                    let item = tokio::select! {
                        _ = ctx.cancelled() => break,
                        item = stream.next() => item,
                    };
                    let Some(item) = item else {
                        r.set_internal(Level::Stopped, "stream ended");
                        return;
                    };
                    let version = r.version();
                    match f(item, ctx.clone()).await {
                        Ok(()) => {
                            if r.version() == version {
                                r.set_internal(Level::Ok, "observing");
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "observer job failed on an item");
                            r.set_internal(Level::Degraded, format!("item failed: {err}"));
                        }
                    }
                }
                r.set_internal(Level::Stopped, "stopped");
            })
        });
        Observer {
            jobs: self.clone(),
            name: name.to_string(),
            run,
        }
    }
}

impl Observer {
    /// Adds the job: it starts with the module's jobs, or at once if they run.
    pub fn add(self) {
        self.jobs.add(&self.name, self.run);
    }
}

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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::job::eventually;
    use crate::{Hive, Module};

    #[tokio::test]
    async fn items_in_order_failures_degrade_and_the_end_stops() {
        let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
        let s = seen.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let rx = Arc::new(Mutex::new(Some(rx)));
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |jobs: Jobs| {
                let s = s.clone();
                let stream = futures::stream::unfold(rx.lock().unwrap().take(), |rx| async move {
                    let mut rx = rx?;
                    let item = rx.recv().await?;
                    Some((item, Some(rx)))
                });
                jobs.observer("events", stream, move |item, _ctx| {
                    s.lock().unwrap().push(item);
                    async move {
                        if item == 2 {
                            Err("item 2 is bad".into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .add();
            })
            .into()]);
        let health = hive.health();
        hive.start().await.unwrap();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        eventually("two items", || seen.lock().unwrap().len() == 2).await;
        eventually("degraded", || {
            health.node("m.events").unwrap().status.level == Level::Degraded
        })
        .await;
        assert_eq!(
            health.node("m.events").unwrap().status.message,
            "item failed: item 2 is bad"
        );
        tx.send(3).unwrap();
        eventually("ok again", || {
            health.node("m.events").unwrap().status.level == Level::Ok
        })
        .await;
        drop(tx);
        eventually("the stream ended", || {
            health.node("m.events").unwrap().status.message == "stream ended"
        })
        .await;
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
        assert_eq!(health.node("m").unwrap().status.level, Level::Ok);
        hive.stop().await.unwrap();
    }
}

//! Asking the hive to shut down from inside a cell.

use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::error::BoxError;

struct Inner {
    requested: watch::Sender<bool>,
    /// The first error given; later requests do not replace it, since the first
    /// failure is usually the cause of the others.
    error: Mutex<Option<BoxError>>,
}

/// Asks the hive to stop. [`Hive::run`](crate::Hive::run) waits for either its
/// shutdown future or a shutdowner, then stops every hook and returns the error
/// given here, if any.
///
/// Any constructor can depend on `Shutdowner`. Use it for failures the process
/// must not survive "healthy": a one-shot job with
/// [`shutdown_on_error`](crate::OneShot::shutdown_on_error) calls it for you.
#[derive(Clone)]
pub struct Shutdowner {
    inner: Arc<Inner>,
}

impl fmt::Debug for Shutdowner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shutdowner")
            .field("requested", &*self.inner.requested.borrow())
            .finish()
    }
}

impl Shutdowner {
    pub(crate) fn new() -> Shutdowner {
        Shutdowner {
            inner: Arc::new(Inner {
                requested: watch::channel(false).0,
                error: Mutex::new(None),
            }),
        }
    }

    /// Requests a shutdown, with the error that caused it (or `None` for a clean
    /// stop). Safe to call many times and from any thread.
    pub fn shutdown(&self, error: Option<BoxError>) {
        if let Some(error) = error {
            tracing::error!(error = %error, "shutdown requested");
            let mut slot = self.inner.error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(error);
            }
        } else {
            tracing::info!("shutdown requested");
        }
        self.inner.requested.send_replace(true);
    }

    /// Whether a shutdown was requested.
    pub fn is_requested(&self) -> bool {
        *self.inner.requested.borrow()
    }

    /// Marks the hive as stopping without requesting anything (the hive does, as its stop
    /// begins).
    pub(crate) fn mark_stopping(&self) {
        self.inner.requested.send_replace(true);
    }

    /// Completes once a shutdown is requested or the hive's stop has begun: a long-lived call
    /// (a followed stream) ends here, before the stop hooks run, since the API server's
    /// graceful stop waits for the calls in flight.
    pub async fn requested(&self) {
        let mut rx = self.inner.requested.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we wait.
        let _ = rx.wait_for(|r| *r).await;
    }

    pub(crate) fn take_error(&self) -> Option<BoxError> {
        self.inner
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_error_is_kept() {
        let s = Shutdowner::new();
        assert!(!s.is_requested());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.requested().await }
        });
        s.shutdown(Some("first".into()));
        s.shutdown(Some("second".into()));
        waiter.await.unwrap();
        assert!(s.is_requested());
        assert_eq!(s.take_error().unwrap().to_string(), "first");
    }
}

//! Helpers for testing a cell's constructor without a hive.
//!
//! ```
//! use cellium_hive::{Hook, testing::TestLifecycle};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let mut lc = TestLifecycle::new("ipam");
//! // Call the constructor under test by hand with `lc.lifecycle()`:
//! lc.lifecycle().append(Hook::new("restore").on_start(|_| async { Ok(()) }));
//! lc.start().await.unwrap();
//! // ... exercise the started object ...
//! lc.stop().await.unwrap();
//! # });
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::catalog::ModuleRef;
use crate::error::{Error, Result};
use crate::lifecycle::{LifecycleShared, Started, stop_all};
use crate::{HiveConfig, Lifecycle};

/// A lifecycle for one module, started and stopped by the test. Hooks that
/// started are stopped when it is dropped, if the test did not stop it.
///
/// Trap: the drop-time stop runs on a runtime of its own in a helper thread
/// (a destructor cannot await), so hooks whose stop needs the test's runtime
/// (its sockets, say) should be stopped with [`stop`](TestLifecycle::stop).
pub struct TestLifecycle {
    shared: Arc<LifecycleShared>,
    module: ModuleRef,
    started: Vec<Started>,
    timeouts: HiveConfig,
}

impl std::fmt::Debug for TestLifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestLifecycle")
            .field("module", &self.module.id)
            .field("started", &self.started.len())
            .finish()
    }
}

impl TestLifecycle {
    /// A lifecycle whose hooks belong to a module with this full id, with the
    /// hive's default timeouts.
    pub fn new(module_id: &str) -> TestLifecycle {
        TestLifecycle {
            shared: Arc::default(),
            module: ModuleRef {
                idx: 0,
                id: Arc::from(module_id),
            },
            started: Vec::new(),
            timeouts: HiveConfig::default(),
        }
    }

    /// Sets the start and stop timeouts.
    pub fn with_timeouts(mut self, start: Duration, stop: Duration) -> TestLifecycle {
        self.timeouts.start_timeout = start;
        self.timeouts.stop_timeout = stop;
        self
    }

    /// The handle to give to the constructor under test.
    pub fn lifecycle(&self) -> Lifecycle {
        self.shared.handle(self.module.clone())
    }

    /// Runs the start hooks appended so far, as the hive would.
    pub async fn start(&mut self) -> Result<()> {
        self.started = self
            .shared
            .start(self.timeouts.start_timeout, |_| {})
            .await?;
        Ok(())
    }

    /// Runs the stop hooks of what started, in reverse.
    pub async fn stop(&mut self) -> Result<()> {
        let failures = stop_all(
            std::mem::take(&mut self.started),
            self.timeouts.stop_timeout,
        )
        .await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Stop { failures })
        }
    }
}

impl Drop for TestLifecycle {
    fn drop(&mut self) {
        let started = std::mem::take(&mut self.started);
        if started.is_empty() {
            return;
        }
        let timeout = self.timeouts.stop_timeout;
        let stopped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(stop_all(started, timeout)))
        })
        .join();
        match stopped {
            Ok(Ok(failures)) => {
                for f in failures {
                    tracing::error!("{f}");
                }
            }
            Ok(Err(e)) => tracing::error!("cannot stop hooks at drop: {e}"),
            Err(_) => tracing::error!("a stop hook panicked at drop"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::Hook;

    #[tokio::test]
    async fn hooks_stop_at_drop_if_the_test_did_not_stop_them() {
        let log: Arc<Mutex<Vec<&str>>> = Arc::default();
        let (a, b) = (log.clone(), log.clone());
        {
            let mut lc = TestLifecycle::new("ipam");
            lc.lifecycle().append(
                Hook::new("h")
                    .on_start(move |_| async move {
                        a.lock().unwrap().push("start");
                        Ok(())
                    })
                    .on_stop(move |_| async move {
                        b.lock().unwrap().push("stop");
                        Ok(())
                    }),
            );
            lc.start().await.unwrap();
            assert_eq!(*log.lock().unwrap(), ["start"]);
        }
        assert_eq!(*log.lock().unwrap(), ["start", "stop"]);
    }

    #[tokio::test(start_paused = true)]
    async fn start_errors_name_the_test_module() {
        let mut lc = TestLifecycle::new("cp.ipam")
            .with_timeouts(Duration::from_millis(10), Duration::from_millis(10));
        lc.lifecycle()
            .append(Hook::new("slow").on_start(|ctx| async move {
                ctx.cancelled().await;
                Err("gave up".into())
            }));
        let err = lc.start().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "start hook `slow` of module `cp.ipam` timed out after 10ms"
        );
    }
}

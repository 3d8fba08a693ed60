//! Start and stop hooks.
//!
//! Constructors only validate and allocate; work starts in start hooks. Hooks are
//! appended while the hive populates, so their order is the construction order,
//! which is the dependency order: a hook never starts before the hooks of what its
//! module depends on. Start hooks run one after another, each under
//! `start-timeout`; stop hooks run in reverse, each under `stop-timeout`, and all
//! of them run even when some fail. A failed start stops what had started, in
//! reverse. Each hook that finishes logs `<phase> hook done` (info, with the
//! module, hook name and elapsed time), so the order can be read from the log.
//!
//! # Timeouts
//! When a hook's timeout expires, its [`HookContext`] is cancelled and the hook
//! keeps running for a grace period ([`HOOK_GRACE_PERIOD`]) so that it can see the
//! cancellation, undo what it half did and return. The hook has timed out either
//! way: a start fails with [`Error::StartTimeout`] (carrying the error the hook
//! returned, if any), a stop is reported as failed. A start hook that still
//! finished its work within the grace period counts as started, so the rollback
//! runs its stop function too. A hook that ignores its cancellation is abandoned
//! when the grace period ends: its future is dropped wherever it stood.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::Instrument;

use crate::catalog::ModuleRef;
use crate::error::{BoxError, Error, HookFailure};

type HookFn = Box<dyn FnOnce(HookContext) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// A start/stop pair with a name, appended to a [`Lifecycle`].
///
/// ```
/// use cellium_hive::{Hook, Lifecycle};
/// fn new_server(lc: Lifecycle) {
///     lc.append(
///         Hook::new("listen")
///             .on_start(|ctx| async move {
///                 // Open sockets, restore state; return fast, loops are jobs.
///                 // A wait that may be long races the context: at the timeout
///                 // the hook is cancelled and has a grace period to return.
///                 tokio::select! {
///                     _ = ctx.cancelled() => Err("cancelled before the peer answered".into()),
///                     _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => Ok(()),
///                 }
///             })
///             .on_stop(|_ctx| async move { Ok(()) }),
///     );
/// }
/// ```
pub struct Hook {
    name: String,
    start: Option<HookFn>,
    stop: Option<HookFn>,
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hook")
            .field("name", &self.name)
            .field("start", &self.start.is_some())
            .field("stop", &self.stop.is_some())
            .finish()
    }
}

impl Hook {
    /// A hook without functions; the name appears in errors, logs and `describe`.
    pub fn new(name: &str) -> Hook {
        Hook {
            name: name.to_string(),
            start: None,
            stop: None,
        }
    }

    /// The function run at start. It should return quickly and abort when its
    /// context is cancelled (at its timeout; it then has [`HOOK_GRACE_PERIOD`] to
    /// return); long-running loops belong in jobs.
    pub fn on_start<F, Fut>(mut self, f: F) -> Self
    where
        F: FnOnce(HookContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.start = Some(Box::new(move |ctx| Box::pin(f(ctx))));
        self
    }

    /// The function run at stop, only if the start function succeeded (or there
    /// was none).
    pub fn on_stop<F, Fut>(mut self, f: F) -> Self
    where
        F: FnOnce(HookContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.stop = Some(Box::new(move |ctx| Box::pin(f(ctx))));
        self
    }
}

/// How long a hook may run on once its context is cancelled at its timeout:
/// time to notice, undo what it half did and return.
pub const HOOK_GRACE_PERIOD: Duration = Duration::from_secs(5);

/// Given to hook functions: cancelled when the hook's timeout expires.
///
/// The hook is still polled after the cancellation, for [`HOOK_GRACE_PERIOD`], so
/// a hook that waits on [`cancelled`](HookContext::cancelled) (in a `select!`,
/// say) gets to clean up and return its own error. Trap: blocking calls cannot
/// see the cancellation; run them with `spawn_blocking` and a timeout of their own.
#[derive(Clone, Debug, Default)]
pub struct HookContext {
    token: CancellationToken,
}

impl HookContext {
    /// Whether the hook's time is up.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when the hook's time is up.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// The cancellation token, to hand to other tasks.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

struct HookEntry {
    name: String,
    module: ModuleRef,
    start: Option<HookFn>,
    stop: Option<HookFn>,
}

/// A hook whose start succeeded, waiting for its stop.
pub(crate) struct Started {
    name: String,
    module: ModuleRef,
    stop: Option<HookFn>,
}

#[derive(Default)]
pub(crate) struct LifecycleShared {
    hooks: Mutex<Vec<HookEntry>>,
    /// Set when start has run all hooks: later appends could never be started
    /// in their place in the order, so they are refused.
    closed: AtomicBool,
}

impl LifecycleShared {
    fn lock(&self) -> MutexGuard<'_, Vec<HookEntry>> {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn handle(self: &Arc<Self>, module: ModuleRef) -> Lifecycle {
        Lifecycle {
            shared: self.clone(),
            module,
        }
    }

    /// The hooks in start order: (name, module id).
    pub(crate) fn order(&self) -> Vec<(String, Arc<str>)> {
        self.lock()
            .iter()
            .map(|h| (h.name.clone(), h.module.id.clone()))
            .collect()
    }

    /// Runs the start hooks in order. `module_started` is called with a module's
    /// index once its last hook has started. On failure, stops what started.
    pub(crate) async fn start(
        &self,
        timeout: Duration,
        mut module_started: impl FnMut(&ModuleRef),
    ) -> Result<Vec<Started>, Error> {
        let mut started = Vec::new();
        let mut last: HashMap<usize, usize> = HashMap::new();
        let mut seen = 0;
        let mut i = 0;
        loop {
            let (name, module, start, stop) = {
                let mut hooks = self.lock();
                // Hooks may append hooks while starting; they run in turn.
                for (j, h) in hooks.iter().enumerate().skip(seen) {
                    last.insert(h.module.idx, j);
                }
                seen = hooks.len();
                let Some(h) = hooks.get_mut(i) else {
                    self.closed.store(true, Ordering::SeqCst);
                    break;
                };
                (
                    h.name.clone(),
                    h.module.clone(),
                    h.start.take(),
                    h.stop.take(),
                )
            };
            if let Some(start) = start
                && let Err(err) = run_hook(start, &name, &module, "start", timeout).await
            {
                self.closed.store(true, Ordering::SeqCst);
                let late_success = matches!(err, HookError::TimedOut(Some(Ok(()))));
                if late_success {
                    // It did start, only too late: undo it with the rest.
                    started.push(Started {
                        name: name.clone(),
                        module: module.clone(),
                        stop,
                    });
                }
                let rollback = stop_all(started, timeout).await;
                let module = module.id.to_string();
                return Err(match err {
                    HookError::Failed(source) => Error::StartHook {
                        hook: name,
                        module,
                        rollback,
                        source,
                    },
                    HookError::TimedOut(late) => Error::StartTimeout {
                        hook: name,
                        module,
                        timeout,
                        abandoned: late.is_none(),
                        rollback,
                        source: late.and_then(Result::err),
                    },
                });
            }
            if last.get(&module.idx) == Some(&i) {
                module_started(&module);
            }
            started.push(Started { name, module, stop });
            i += 1;
        }
        Ok(started)
    }

    /// Closes the lifecycle without starting (a stop before any start).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

/// Runs the stop functions of `started` in reverse order, every one of them,
/// and returns the failures.
pub(crate) async fn stop_all(started: Vec<Started>, timeout: Duration) -> Vec<HookFailure> {
    let mut failures = Vec::new();
    for s in started.into_iter().rev() {
        let Some(stop) = s.stop else { continue };
        if let Err(err) = run_hook(stop, &s.name, &s.module, "stop", timeout).await {
            failures.push(HookFailure {
                hook: s.name,
                module: s.module.id.to_string(),
                cause: match err {
                    HookError::Failed(e) => e.to_string(),
                    HookError::TimedOut(late) => {
                        let after = humantime_serde::re::humantime::format_duration(timeout);
                        match late {
                            None => format!(
                                "timed out after {after} and did not return within its grace period once cancelled"
                            ),
                            Some(Err(e)) => format!("timed out after {after}: {e}"),
                            Some(Ok(())) => format!("timed out after {after}"),
                        }
                    }
                },
            });
        }
    }
    failures
}

enum HookError {
    Failed(BoxError),
    /// The timeout expired; what the hook returned within the grace period
    /// after its cancellation, or `None` if it was abandoned.
    TimedOut(Option<Result<(), BoxError>>),
}

async fn run_hook(
    f: HookFn,
    name: &str,
    module: &ModuleRef,
    phase: &'static str,
    timeout: Duration,
) -> Result<(), HookError> {
    let span = tracing::info_span!("hook", module = %module.id, hook = %name, phase);
    let ctx = HookContext::default();
    let token = ctx.token.clone();
    let mut fut = std::pin::pin!(f(ctx).instrument(span.clone()));
    let began = Instant::now();
    match tokio::time::timeout(timeout, &mut fut).await {
        Ok(Ok(())) => {
            // One line per hook, in the order they ran: what an operator compares to see
            // that stop hooks run in reverse start order, and which hook is slow.
            span.in_scope(|| tracing::info!(elapsed = ?began.elapsed(), "{phase} hook done"));
            Ok(())
        }
        Ok(Err(e)) => {
            span.in_scope(|| tracing::error!(error = %e, "{phase} hook failed"));
            Err(HookError::Failed(e))
        }
        Err(_) => {
            // The hook (and the tasks it handed its token to) see the cancellation
            // only while its future is still polled: keep polling it for the grace
            // period instead of dropping it at once.
            token.cancel();
            span.in_scope(|| tracing::error!(?timeout, "{phase} hook timed out, cancelled"));
            let late = tokio::time::timeout(HOOK_GRACE_PERIOD, &mut fut).await.ok();
            if late.is_none() {
                span.in_scope(|| {
                    tracing::error!(grace = ?HOOK_GRACE_PERIOD, "{phase} hook ignored its cancellation, abandoned")
                });
            }
            Err(HookError::TimedOut(late))
        }
    }
}

/// Appends start/stop hooks. A `Lifecycle` dependency is scoped to the module
/// that receives it: errors and logs of its hooks name that module.
///
/// Trap: hooks appended once the hive has started are refused (logged as an
/// error), since their place in the start order has passed; start work later
/// with [`Jobs`](crate::Jobs) instead.
#[derive(Clone)]
pub struct Lifecycle {
    shared: Arc<LifecycleShared>,
    module: ModuleRef,
}

impl fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lifecycle")
            .field("module", &self.module.id)
            .finish()
    }
}

impl Lifecycle {
    /// Appends a hook; it starts after every hook appended before it.
    pub fn append(&self, hook: Hook) {
        if self.shared.closed.load(Ordering::SeqCst) {
            tracing::error!(
                module = %self.module.id,
                hook = %hook.name,
                "hook appended after start is ignored"
            );
            return;
        }
        self.shared.lock().push(HookEntry {
            name: hook.name,
            module: self.module.clone(),
            start: hook.start,
            stop: hook.stop,
        });
    }

    /// The full id of the module this handle belongs to.
    pub fn module_id(&self) -> &str {
        &self.module.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(idx: usize, id: &str) -> ModuleRef {
        ModuleRef {
            idx,
            id: Arc::from(id),
        }
    }

    type Log = Arc<Mutex<Vec<String>>>;

    fn hook(log: &Log, name: &str, fail_start: bool, fail_stop: bool) -> Hook {
        let (l1, l2) = (log.clone(), log.clone());
        let (n1, n2) = (name.to_string(), name.to_string());
        Hook::new(name)
            .on_start(move |_| async move {
                l1.lock().unwrap().push(format!("start {n1}"));
                if fail_start {
                    Err(format!("{n1} cannot start").into())
                } else {
                    Ok(())
                }
            })
            .on_stop(move |_| async move {
                l2.lock().unwrap().push(format!("stop {n2}"));
                if fail_stop {
                    Err(format!("{n2} cannot stop").into())
                } else {
                    Ok(())
                }
            })
    }

    #[tokio::test]
    async fn start_in_order_stop_in_reverse_and_report_every_stop_failure() {
        let shared = Arc::new(LifecycleShared::default());
        let log = Log::default();
        let (a, b) = (shared.handle(module(0, "a")), shared.handle(module(1, "b")));
        a.append(hook(&log, "a1", false, true));
        b.append(hook(&log, "b1", false, false));
        a.append(hook(&log, "a2", false, true));
        let mut done = Vec::new();
        let started = shared
            .start(Duration::from_secs(1), |m| done.push(m.id.to_string()))
            .await
            .unwrap();
        assert_eq!(done, ["b", "a"], "a module is started after its last hook");
        let failures = stop_all(started, Duration::from_secs(1)).await;
        assert_eq!(
            *log.lock().unwrap(),
            [
                "start a1", "start b1", "start a2", "stop a2", "stop b1", "stop a1"
            ]
        );
        let text: Vec<String> = failures.iter().map(|f| f.to_string()).collect();
        assert_eq!(
            text,
            [
                "stop hook `a2` of module `a`: a2 cannot stop",
                "stop hook `a1` of module `a`: a1 cannot stop"
            ]
        );
        // The lifecycle is closed now.
        a.append(hook(&log, "late", false, false));
        assert_eq!(shared.order().len(), 3);
    }

    #[tokio::test]
    async fn a_failed_start_stops_what_started_in_reverse() {
        let shared = Arc::new(LifecycleShared::default());
        let log = Log::default();
        let lc = shared.handle(module(0, "cp.ipam"));
        lc.append(hook(&log, "one", false, false));
        lc.append(hook(&log, "two", false, true));
        lc.append(hook(&log, "three", true, false));
        lc.append(hook(&log, "four", false, false));
        let err = shared
            .start(Duration::from_secs(1), |_| {})
            .await
            .err()
            .unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "start one",
                "start two",
                "start three",
                "stop two",
                "stop one"
            ]
        );
        let text = err.to_string();
        assert!(
            text.starts_with("start hook `three` of module `cp.ipam` failed"),
            "{text}"
        );
        assert!(
            text.contains("stop hook `two` of module `cp.ipam`: two cannot stop"),
            "{text}"
        );
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert_eq!(cause, "three cannot start");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_start_sees_its_cancellation_and_returns_its_own_error() {
        let shared = Arc::new(LifecycleShared::default());
        let log = Log::default();
        let lc = shared.handle(module(0, "slow"));
        lc.append(hook(&log, "first", false, false));
        let l = log.clone();
        lc.append(Hook::new("connect").on_start(move |ctx| async move {
            tokio::select! {
                _ = ctx.cancelled() => {}
                _ = std::future::pending::<()>() => {}
            }
            // Still polled after the cancellation: it can undo what it did and say why.
            l.lock()
                .unwrap()
                .push("connect saw its cancellation".into());
            Err("connect aborted: the peer never answered".into())
        }));
        let began = tokio::time::Instant::now();
        let err = shared
            .start(Duration::from_millis(20), |_| {})
            .await
            .err()
            .unwrap();
        assert_eq!(
            began.elapsed(),
            Duration::from_millis(20),
            "no grace waited for"
        );
        assert_eq!(
            err.to_string(),
            "start hook `connect` of module `slow` timed out after 20ms"
        );
        assert!(matches!(
            err,
            Error::StartTimeout {
                abandoned: false,
                ..
            }
        ));
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert_eq!(cause, "connect aborted: the peer never answered");
        assert_eq!(
            *log.lock().unwrap(),
            ["start first", "connect saw its cancellation", "stop first"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_that_finishes_within_the_grace_period_is_stopped_in_the_rollback() {
        let shared = Arc::new(LifecycleShared::default());
        let log = Log::default();
        let lc = shared.handle(module(0, "m"));
        let (l1, l2) = (log.clone(), log.clone());
        lc.append(
            Hook::new("late")
                .on_start(move |ctx| async move {
                    ctx.cancelled().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    l1.lock().unwrap().push("late started anyway".into());
                    Ok(())
                })
                .on_stop(move |_| async move {
                    l2.lock().unwrap().push("late stopped".into());
                    Ok(())
                }),
        );
        let err = shared
            .start(Duration::from_millis(20), |_| {})
            .await
            .err()
            .unwrap();
        assert!(matches!(
            err,
            Error::StartTimeout {
                abandoned: false,
                source: None,
                ..
            }
        ));
        assert_eq!(
            *log.lock().unwrap(),
            ["late started anyway", "late stopped"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_that_ignores_its_cancellation_is_abandoned_after_the_grace_period() {
        let shared = Arc::new(LifecycleShared::default());
        let lc = shared.handle(module(0, "slow"));
        let token_slot: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
        let slot = token_slot.clone();
        lc.append(Hook::new("wait-forever").on_start(move |ctx| async move {
            *slot.lock().unwrap() = Some(ctx.token());
            std::future::pending::<()>().await;
            Ok(())
        }));
        let began = tokio::time::Instant::now();
        let err = shared
            .start(Duration::from_millis(20), |_| {})
            .await
            .err()
            .unwrap();
        assert_eq!(
            began.elapsed(),
            Duration::from_millis(20) + HOOK_GRACE_PERIOD
        );
        assert!(matches!(
            err,
            Error::StartTimeout {
                abandoned: true,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            "start hook `wait-forever` of module `slow` timed out after 20ms and did not return within its grace period once cancelled"
        );
        assert!(token_slot.lock().unwrap().as_ref().unwrap().is_cancelled());
    }

    #[tokio::test]
    async fn hooks_appended_during_start_run_in_turn() {
        let shared = Arc::new(LifecycleShared::default());
        let log = Log::default();
        let lc = shared.handle(module(0, "m"));
        let (lc2, log2) = (lc.clone(), log.clone());
        lc.append(Hook::new("first").on_start(move |_| async move {
            lc2.append(hook(&log2, "appended", false, false));
            Ok(())
        }));
        let started = shared.start(Duration::from_secs(1), |_| {}).await.unwrap();
        assert_eq!(started.len(), 2);
        assert_eq!(*log.lock().unwrap(), ["start appended"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_stop_times_out_and_later_stops_still_run() {
        let shared = Arc::new(LifecycleShared::default());
        let log = Log::default();
        let lc = shared.handle(module(0, "m"));
        lc.append(hook(&log, "last-stopped", false, false));
        lc.append(Hook::new("stuck").on_stop(|_| std::future::pending()));
        let started = shared.start(Duration::from_secs(1), |_| {}).await.unwrap();
        let failures = stop_all(started, Duration::from_millis(10)).await;
        assert_eq!(failures.len(), 1);
        assert_eq!(
            failures[0].cause,
            "timed out after 10ms and did not return within its grace period once cancelled"
        );
        assert_eq!(
            *log.lock().unwrap(),
            ["start last-stopped", "stop last-stopped"]
        );
    }
}

//! Jobs: one-shot, timer and observer tasks tied to a module's lifecycle and
//! health.
//!
//! A [`Jobs`] handle is scoped to the module that receives it. Jobs added before
//! start wait for the module's place in the start order: the hive appends a
//! `jobs` hook right after the hooks of the constructor (or invoke) that took the
//! handle, so a module's jobs start after its own start hooks and after
//! everything it depends on, and stop before them (cf. hive#72). Jobs added after
//! start run at once. At stop every job's context is cancelled and the hive
//! waits for all of them (under `stop-timeout`).
//!
//! Each job has a health node `<module>.<job-name>`: Unknown until its first run
//! has ended (or the job reported through [`JobContext::reporter`]), OK after a
//! successful run, Degraded with the error while retrying or after a failure,
//! Stopped when it ended. A one-shot that succeeded removes its node, so finished
//! jobs do not pile up (cf. hive#20). What the first run is depends on the kind:
//!
//! - a one-shot's only run: a job that runs for the life of the hive (a server,
//!   a watch loop) stays Unknown until it reports OK itself, once it serves;
//! - a timer's first run, at start (a zero-interval timer: at its first trigger); a timer
//!   with a zero interval runs only when triggered, so while no trigger is
//!   pending it has nothing due and is OK ("waiting for a trigger");
//! - an observer has no first run: it is OK while it waits for items, and each
//!   item's outcome sets its level.

mod observer;
mod oneshot;
mod timer;

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::runtime::Handle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::catalog::ModuleRef;
use crate::error::{Problem, check_name};
use crate::health::{Health, Level, Reporter};
use crate::shutdown::Shutdowner;

pub use observer::Observer;
pub use oneshot::OneShot;
pub use timer::{Timer, Trigger};

/// A job's body, ready to be spawned.
type JobFn = Box<dyn FnOnce(JobContext) -> BoxFuture<'static, ()> + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What every job group of the hive shares.
pub(crate) struct JobsShared {
    pub(crate) health: Health,
    pub(crate) shutdowner: Shutdowner,
    /// Full ids of modules, which a job name must not shadow.
    pub(crate) modules: HashSet<String>,
    /// Full paths of jobs added and not finished.
    live: Mutex<HashSet<String>>,
    /// Bad job names found while populating; populate reports them.
    problems: Mutex<Vec<Problem>>,
    /// Parent of every group's token: cancelled when the hive is dropped, so
    /// jobs of a hive dropped without `stop` do not run on forever.
    pub(crate) root: CancellationToken,
}

impl JobsShared {
    pub(crate) fn new(health: Health, shutdowner: Shutdowner, modules: HashSet<String>) -> Self {
        JobsShared {
            health,
            shutdowner,
            modules,
            live: Mutex::default(),
            problems: Mutex::default(),
            root: CancellationToken::new(),
        }
    }

    pub(crate) fn take_problems(&self) -> Vec<Problem> {
        std::mem::take(&mut *lock(&self.problems))
    }
}

enum Phase {
    /// Before the module's place in the start order.
    Pending,
    /// Started: new jobs are spawned at once on this runtime.
    Running(Handle),
    /// Stopped: new jobs are refused.
    Stopped,
}

struct PendingJob {
    name: String,
    path: String,
    run: JobFn,
}

pub(crate) struct JobGroup {
    shared: Arc<JobsShared>,
    module: ModuleRef,
    phase: Mutex<(Phase, Vec<PendingJob>)>,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl JobGroup {
    pub(crate) fn new(shared: Arc<JobsShared>, module: ModuleRef) -> Arc<JobGroup> {
        Arc::new(JobGroup {
            token: shared.root.child_token(),
            shared,
            module,
            phase: Mutex::new((Phase::Pending, Vec::new())),
            tracker: TaskTracker::new(),
        })
    }

    /// Starts the jobs added so far; later ones start when added.
    pub(crate) fn start(&self) {
        let handle = Handle::current();
        let pending = {
            let mut state = lock(&self.phase);
            state.0 = Phase::Running(handle.clone());
            std::mem::take(&mut state.1)
        };
        for job in pending {
            self.spawn(&handle, job);
        }
    }

    /// Cancels every job and waits for all of them to return.
    pub(crate) async fn stop(&self) {
        let never_started = {
            let mut state = lock(&self.phase);
            state.0 = Phase::Stopped;
            std::mem::take(&mut state.1)
        };
        for job in never_started {
            lock(&self.shared.live).remove(&job.path);
            self.shared
                .health
                .set(&job.path, Level::Stopped, "stopped".into(), false);
        }
        self.token.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    fn spawn(&self, handle: &Handle, job: PendingJob) {
        let ctx = JobContext {
            token: self.token.child_token(),
            reporter: self.shared.health.reporter(&job.path),
        };
        let span = tracing::info_span!("job", module = %self.module.id, job = %job.name);
        let shared = self.shared.clone();
        let path = job.path;
        let run = job.run;
        let fut = async move {
            run(ctx).await;
            lock(&shared.live).remove(&path);
        };
        handle.spawn(self.tracker.track_future(fut.instrument(span)));
    }

    fn add(&self, name: &str, run: JobFn) {
        let module = &self.module.id;
        let problem = match check_name(name) {
            Err(reason) => Some(Problem::InvalidJobName {
                name: name.to_string(),
                module: module.to_string(),
                reason,
            }),
            Ok(()) => None,
        };
        let path = format!("{module}.{name}");
        let problem = problem.or_else(|| {
            let mut live = lock(&self.shared.live);
            if self.shared.modules.contains(&path) || !live.insert(path.clone()) {
                Some(Problem::DuplicateJobName {
                    name: name.to_string(),
                    module: module.to_string(),
                })
            } else {
                None
            }
        });
        if let Some(problem) = problem {
            // Populate reports these; once running, the module turns Degraded so
            // the mistake is visible rather than a silently missing job.
            tracing::error!(module = %module, "job not added: {problem}");
            self.shared.health.set(
                module,
                Level::Degraded,
                format!("job not added: {problem}"),
                true,
            );
            lock(&self.shared.problems).push(problem);
            return;
        }
        let job = PendingJob {
            name: name.to_string(),
            path,
            run,
        };
        let mut state = lock(&self.phase);
        match &state.0 {
            Phase::Pending => {
                self.shared
                    .health
                    .set(&job.path, Level::Stopped, "not started".into(), false);
                state.1.push(job);
            }
            Phase::Running(handle) => {
                let handle = handle.clone();
                drop(state);
                self.spawn(&handle, job);
            }
            Phase::Stopped => {
                drop(state);
                lock(&self.shared.live).remove(&job.path);
                tracing::warn!(module = %module, job = %name, "job added after stop is not run");
            }
        }
    }
}

/// Adds jobs to a module. A `Jobs` dependency is scoped to the consuming module;
/// clone it freely (into start hooks, other tasks).
///
/// Job names follow module ids (`[a-z][a-z0-9-]*`, at most 30 characters) and
/// are unique among a module's running jobs; a bad name is a populate error
/// (or, once running, turns the module Degraded), never rewritten.
///
/// ```
/// use std::time::Duration;
/// use cellium_hive::{Backoff, Jobs, Trigger};
///
/// fn new_sync(jobs: Jobs) {
///     jobs.one_shot("restore", |_ctx| async { Ok(()) })
///         .retry(Backoff::default())
///         .shutdown_on_error()
///         .add();
///     let resync = Trigger::new();
///     jobs.timer("gc", Duration::from_secs(60), |_ctx| async { Ok(()) })
///         .trigger(resync.clone())
///         .add();
///     resync.trigger(); // run `gc` at once, instead of in a minute
/// }
/// ```
#[derive(Clone)]
pub struct Jobs {
    group: Arc<JobGroup>,
}

impl fmt::Debug for Jobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jobs")
            .field("module", &self.group.module.id)
            .finish()
    }
}

impl Jobs {
    pub(crate) fn new(group: Arc<JobGroup>) -> Jobs {
        Jobs { group }
    }

    fn add(&self, name: &str, run: JobFn) {
        self.group.add(name, run)
    }

    pub(crate) fn shutdowner(&self) -> &Shutdowner {
        &self.group.shared.shutdowner
    }

    pub(crate) fn module_id(&self) -> &str {
        &self.group.module.id
    }
}

/// Given to job functions: cancelled when the hive stops, with a health
/// [`Reporter`] for the job's node.
#[derive(Clone, Debug)]
pub struct JobContext {
    token: CancellationToken,
    reporter: Reporter,
}

impl JobContext {
    /// Whether the job should return.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when the job should return.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// The cancellation token, to hand to other tasks.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// The reporter of the job's node `<module>.<job-name>`. The job runner
    /// reports OK/Degraded after each run unless the function reported
    /// something itself during that run; use [`Reporter::child`] for parts.
    pub fn reporter(&self) -> &Reporter {
        &self.reporter
    }
}

/// Exponential backoff between the retries of a one-shot job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The delay before the first retry.
    pub min: Duration,
    /// The longest delay.
    pub max: Duration,
    /// The growth of the delay per retry (values below 1 count as 1).
    pub factor: f64,
    /// How many retries before the job fails for good (`None`: forever).
    pub max_retries: Option<u32>,
}

impl Default for Backoff {
    /// 100ms doubling up to 1m, forever.
    fn default() -> Self {
        Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(60),
            factor: 2.0,
            max_retries: None,
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (1 for the first).
    pub fn delay(&self, retry: u32) -> Duration {
        let factor = self.factor.max(1.0);
        let exp = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
        let secs = self.min.as_secs_f64() * factor.powi(exp);
        Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max)
            .min(self.max)
            .max(self.min.min(self.max))
    }

    fn allows(&self, retry: u32) -> bool {
        self.max_retries.is_none_or(|max| retry <= max)
    }
}

/// Waits until `f` holds, polling every 10ms (of paused or real time).
#[cfg(test)]
pub(crate) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Hive, Hook, Lifecycle, Module};

    #[tokio::test]
    async fn jobs_start_after_their_module_hooks_and_stop_before_them() {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let l = log.clone();
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |lc: Lifecycle, jobs: Jobs| {
                let (a, b, c) = (l.clone(), l.clone(), l.clone());
                lc.append(
                    Hook::new("open")
                        .on_start(move |_| async move {
                            a.lock().unwrap().push("hook start".into());
                            Ok(())
                        })
                        .on_stop(move |_| async move {
                            b.lock().unwrap().push("hook stop".into());
                            Ok(())
                        }),
                );
                jobs.one_shot("work", move |ctx| {
                    let c = c.clone();
                    async move {
                        c.lock().unwrap().push("job runs".into());
                        ctx.cancelled().await;
                        c.lock().unwrap().push("job cancelled".into());
                        Ok(())
                    }
                })
                .add();
            })
            .into()]);
        hive.populate().unwrap();
        let health = hive.health();
        assert_eq!(health.node("m.work").unwrap().status.message, "not started");
        hive.start().await.unwrap();
        eventually("the job runs", || log.lock().unwrap().len() == 2).await;
        let work = health.node("m.work").unwrap();
        assert_eq!(
            (work.status.level, work.status.message.as_str()),
            (Level::Unknown, "running"),
            "a one-shot that has not returned nor reported is not known to work"
        );
        hive.stop().await.unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["hook start", "job runs", "job cancelled", "hook stop"]
        );
    }

    #[tokio::test]
    async fn dropping_a_running_hive_cancels_its_jobs() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = Mutex::new(Some(tx));
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |jobs: Jobs| {
                let mut tx = tx.lock().unwrap().take();
                jobs.one_shot("forever", move |ctx| {
                    let tx = tx.take();
                    async move {
                        ctx.cancelled().await;
                        if let Some(tx) = tx {
                            let _ = tx.send(());
                        }
                        Ok(())
                    }
                })
                .add();
            })
            .into()]);
        hive.start().await.unwrap();
        drop(hive);
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn jobs_added_after_start_run_at_once() {
        let slot: Arc<Mutex<Option<Jobs>>> = Arc::default();
        let s = slot.clone();
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(move |jobs: Jobs| *s.lock().unwrap() = Some(jobs))
            .into()]);
        hive.start().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let jobs = slot.lock().unwrap().clone().unwrap();
        let mut tx = Some(tx);
        jobs.one_shot("late", move |_| {
            let tx = tx.take();
            async move {
                if let Some(tx) = tx {
                    let _ = tx.send(());
                }
                Ok(())
            }
        })
        .add();
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .unwrap()
            .unwrap();
        hive.stop().await.unwrap();
        jobs.one_shot("after-stop", |_| async { Ok(()) }).add();
        assert!(hive.health().node("m.after-stop").is_none());
    }

    #[tokio::test]
    async fn a_bad_job_name_at_run_time_degrades_the_module() {
        let slot: Arc<Mutex<Option<Jobs>>> = Arc::default();
        let s = slot.clone();
        let mut hive = Hive::new([Module::new("m", "x")
            .cell(Module::new("sub", "x"))
            .invoke(move |jobs: Jobs| *s.lock().unwrap() = Some(jobs))
            .into()]);
        hive.start().await.unwrap();
        let jobs = slot.lock().unwrap().clone().unwrap();
        jobs.one_shot("sub", |_| async { Ok(()) }).add();
        let m = hive.health().node("m").unwrap();
        assert_eq!(m.status.level, Level::Degraded);
        assert!(
            m.status
                .message
                .contains("job name `sub` is used twice in module `m`"),
            "{}",
            m.status.message
        );
        hive.stop().await.unwrap();
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(1),
            factor: 2.0,
            max_retries: Some(3),
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
        assert!(b.allows(3) && !b.allows(4));
        assert!(Backoff::default().allows(u32::MAX));
        let flat = Backoff { factor: 0.5, ..b };
        assert_eq!(flat.delay(3), Duration::from_millis(100));
    }
}

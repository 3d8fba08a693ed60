//! The hive: validates, populates, starts and stops a list of cells.

use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::config::SectionRef;
use crate::config::{self, Config, ConfigSources, HiveConfig, LoadedConfig, SectionDecl};
use crate::error::{Error, Problem, Result};
use crate::graph::{self, Analysis};
use crate::health::{Health, Level};
use crate::job::JobsShared;
use crate::lifecycle::{self, LifecycleShared, Started};
use crate::module::Cell;
use crate::populate::{self, Runtime, Store};
use crate::shutdown::Shutdowner;
use crate::typename::TypeKey;

/// The owner name of the hive's own config section in messages.
pub(crate) const HIVE_OWNER: &str = "hive";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Declared,
    Populated,
    Started,
    Stopped,
    /// A constructor or invoke failed: some objects exist, others never will.
    Failed,
}

/// A set of cells with their config, lifecycle, jobs and health.
///
/// The usual sequence is [`validate`](Hive::validate) (in a test, to catch wiring
/// mistakes), then [`run`](Hive::run), which populates, starts, waits for a
/// shutdown and stops. [`populate`](Hive::populate), [`start`](Hive::start) and
/// [`stop`](Hive::stop) are the same steps one by one.
///
/// ```
/// use std::sync::Arc;
/// use cellium_hive::{Hive, Module};
///
/// struct Greeter(String);
/// let hive = Hive::new([
///     Module::new("greeter", "Says hello")
///         .provide(|| Arc::new(Greeter("hello".into())))
///         .invoke(|g: Arc<Greeter>| assert_eq!(g.0, "hello"))
///         .into(),
/// ]);
/// hive.validate().unwrap();
/// ```
pub struct Hive {
    pub(crate) catalog: Catalog,
    pub(crate) sources: ConfigSources,
    health: Health,
    shutdowner: Shutdowner,
    pub(crate) lifecycle: Arc<LifecycleShared>,
    jobs: Arc<JobsShared>,
    state: State,
    store: Store,
    /// Loaded at populate; `describe` shows it.
    pub(crate) config: Option<LoadedConfig>,
    hive_config: HiveConfig,
    started: Vec<Started>,
}

impl fmt::Debug for Hive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hive")
            .field("modules", &self.catalog.modules.len())
            .field("state", &self.state)
            .finish()
    }
}

impl Drop for Hive {
    fn drop(&mut self) {
        // A hive dropped without `stop` runs no stop hooks (they are async),
        // but its jobs must not outlive it.
        self.jobs.root.cancel();
    }
}

impl Hive {
    /// A hive of these cells. Declaration problems (a bad module id, say) are
    /// reported by [`validate`](Hive::validate), never by a panic here.
    pub fn new(cells: impl IntoIterator<Item = Cell>) -> Hive {
        let catalog = Catalog::new(cells);
        let health = Health::new();
        for m in &catalog.modules {
            health.set(&m.full_id, Level::Stopped, "not started".into(), false);
        }
        let shutdowner = Shutdowner::new();
        let modules: HashSet<String> = catalog
            .modules
            .iter()
            .map(|m| m.full_id.to_string())
            .collect();
        Hive {
            jobs: Arc::new(JobsShared::new(health.clone(), shutdowner.clone(), modules)),
            catalog,
            sources: ConfigSources::new(),
            health,
            shutdowner,
            lifecycle: Arc::default(),
            state: State::Declared,
            store: Store::default(),
            config: None,
            hive_config: HiveConfig::default(),
            started: Vec::new(),
        }
    }

    /// Sets where configuration comes from (by default: only the defaults).
    pub fn with_config(mut self, sources: ConfigSources) -> Hive {
        self.sources = sources;
        self
    }

    /// Checks the cells and the configuration without running any constructor:
    /// ids, duplicate and missing providers, private types, cycles, config keys
    /// and values. Every problem is in the returned [`Error::Invalid`].
    ///
    /// Missing dependencies are checked for what the invokes need (what
    /// populate would construct); declarations are checked throughout. Job
    /// names are checked when jobs are added, so by `populate`.
    pub fn validate(&self) -> Result<()> {
        self.check().map(|_| ())
    }

    pub(crate) fn section_decls(&self) -> (SectionDecl, Vec<(String, usize)>) {
        let owners = self
            .catalog
            .sections
            .iter()
            .enumerate()
            .map(|(i, s)| (self.catalog.modules[s.module].full_id.to_string(), i))
            .collect();
        (SectionDecl::of::<HiveConfig>(), owners)
    }

    /// Reads the config and analyzes the graph; both lists of problems.
    pub(crate) fn analyze(&self) -> (Analysis, std::result::Result<LoadedConfig, Vec<Problem>>) {
        let (hive_section, owners) = self.section_decls();
        let mut refs = vec![SectionRef {
            owner: HIVE_OWNER,
            decl: &hive_section,
        }];
        refs.extend(owners.iter().map(|(owner, i)| SectionRef {
            owner,
            decl: &self.catalog.sections[*i].decl,
        }));
        let available: HashMap<TypeId, TypeKey> =
            refs.iter().map(|r| (r.decl.ty.id, r.decl.ty)).collect();
        let loaded = config::load(&refs, &self.sources);
        (graph::analyze(&self.catalog, &available), loaded)
    }

    fn check(&self) -> Result<(Analysis, LoadedConfig)> {
        let (mut analysis, loaded) = self.analyze();
        let mut problems = std::mem::take(&mut analysis.problems);
        match loaded {
            Ok(config) if problems.is_empty() => Ok((analysis, config)),
            Ok(_) => Err(Error::Invalid { problems }),
            Err(config_problems) => {
                problems.extend(config_problems);
                Err(Error::Invalid { problems })
            }
        }
    }

    /// Validates, then runs the constructors the invokes need, in dependency
    /// order, once each, and the invokes in declaration order. Does nothing if
    /// the hive is already populated.
    pub fn populate(&mut self) -> Result<()> {
        match self.state {
            State::Declared => {}
            State::Populated | State::Started | State::Stopped => return Ok(()),
            State::Failed => {
                return Err(Error::State {
                    operation: "populate",
                    state: "failed to populate earlier",
                });
            }
        }
        let (analysis, config) = self.check()?;
        if let Some(c) = config
            .values
            .get(&TypeId::of::<HiveConfig>())
            .and_then(|v| v.downcast_ref::<Config<HiveConfig>>())
        {
            self.hive_config = (**c).clone();
        }
        let rt = Runtime {
            health: &self.health,
            shutdowner: &self.shutdowner,
            lifecycle: &self.lifecycle,
            jobs: &self.jobs,
        };
        let result = populate::construct(&mut self.catalog, &analysis, &config, &rt);
        self.config = Some(config);
        match result {
            Ok(store) => self.store = store,
            Err(e) => {
                self.state = State::Failed;
                return Err(e);
            }
        }
        let problems = self.jobs.take_problems();
        if !problems.is_empty() {
            self.state = State::Failed;
            return Err(Error::Invalid { problems });
        }
        self.state = State::Populated;
        Ok(())
    }

    /// Populates if needed, then runs the start hooks in order, each under
    /// `start-timeout`. On failure the hooks that started are stopped again, in
    /// reverse, and the error names the hook and its module.
    pub async fn start(&mut self) -> Result<()> {
        match self.state {
            State::Declared => self.populate()?,
            State::Populated => {}
            State::Started => {
                return Err(Error::State {
                    operation: "start",
                    state: "is already started",
                });
            }
            State::Stopped => {
                return Err(Error::State {
                    operation: "start",
                    state: "has stopped (a hive starts once)",
                });
            }
            State::Failed => {
                return Err(Error::State {
                    operation: "start",
                    state: "failed to populate",
                });
            }
        }
        let health = self.health.clone();
        let result = self
            .lifecycle
            .start(self.hive_config.start_timeout, |m| {
                health.mark_started(&m.id)
            })
            .await;
        match result {
            Ok(started) => {
                self.started = started;
                for m in &self.catalog.modules {
                    self.health.mark_started(&m.full_id);
                }
                self.state = State::Started;
                Ok(())
            }
            Err(e) => {
                self.health.stop_all("start failed");
                self.state = State::Stopped;
                Err(e)
            }
        }
    }

    /// Runs the stop hooks of everything started, in reverse order, each under
    /// `stop-timeout`; all of them run, and every failure is reported.
    /// Does nothing if the hive is not started.
    pub async fn stop(&mut self) -> Result<()> {
        // Before any stop hook: long-lived calls (followed streams) end on it, so that the
        // API server's graceful stop, which waits for calls in flight, is not held up.
        self.shutdowner.mark_stopping();
        if self.state != State::Started {
            self.lifecycle.close();
            if self.state != State::Failed {
                self.state = State::Stopped;
            }
            return Ok(());
        }
        let started = std::mem::take(&mut self.started);
        let failures = lifecycle::stop_all(started, self.hive_config.stop_timeout).await;
        self.health.stop_all("stopped");
        self.state = State::Stopped;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Stop { failures })
        }
    }

    /// Populates if needed, starts, waits for `shutdown` or a
    /// [`Shutdowner`] request, then stops. Returns the shutdowner's error if
    /// one was given (with any stop failures), else the stop result.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        self.start().await?;
        let shutdowner = self.shutdowner.clone();
        tokio::select! {
            _ = shutdown => {}
            _ = shutdowner.requested() => {}
        }
        let error = self.shutdowner.take_error();
        let stopped = self.stop().await;
        match (error, stopped) {
            (Some(source), Ok(())) => Err(Error::Shutdown {
                stop: Vec::new(),
                source,
            }),
            (Some(source), Err(Error::Stop { failures })) => Err(Error::Shutdown {
                stop: failures,
                source,
            }),
            (_, stopped) => stopped,
        }
    }

    /// The health tree (modules are Stopped("not started") before start).
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// The hive's shutdowner, to stop a running hive from outside its cells.
    pub fn shutdowner(&self) -> Shutdowner {
        self.shutdowner.clone()
    }

    /// The hive's own settings in force (`start-timeout`, `stop-timeout`):
    /// the defaults until populate has read the config.
    pub fn hive_config(&self) -> &HiveConfig {
        &self.hive_config
    }

    /// The start order so far: (hook name, module full id). Known once
    /// populated, since constructors append the hooks.
    pub fn start_order(&self) -> Vec<(String, String)> {
        self.lifecycle
            .order()
            .into_iter()
            .map(|(h, m)| (h, m.to_string()))
            .collect()
    }

    pub(crate) fn is_populated(&self) -> bool {
        !matches!(self.state, State::Declared)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{Hook, Lifecycle, Module};

    struct A;
    struct B(#[allow(dead_code)] Arc<A>);

    #[tokio::test]
    async fn populate_start_stop_in_dependency_order() {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (l1, l2) = (log.clone(), log.clone());
        let mut hive = Hive::new([
            Module::new("b", "needs a")
                .provide(move |a: Arc<A>, lc: Lifecycle| {
                    let l = l1.clone();
                    lc.append(Hook::new("b-hook").on_start(move |_| async move {
                        l.lock().unwrap().push("start b".into());
                        Ok(())
                    }));
                    Arc::new(B(a))
                })
                .invoke(|_: Arc<B>| {})
                .into(),
            Module::new("a", "first")
                .provide(move |lc: Lifecycle| {
                    let l = l2.clone();
                    lc.append(Hook::new("a-hook").on_start(move |_| async move {
                        l.lock().unwrap().push("start a".into());
                        Ok(())
                    }));
                    Arc::new(A)
                })
                .into(),
        ]);
        hive.populate().unwrap();
        assert_eq!(
            hive.start_order(),
            [
                ("a-hook".to_string(), "a".to_string()),
                ("b-hook".to_string(), "b".to_string())
            ]
        );
        hive.start().await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["start a", "start b"]);
        assert_eq!(hive.health().node("a").unwrap().status.message, "started");
        hive.stop().await.unwrap();
        assert_eq!(hive.health().level(), Level::Stopped);
    }

    #[test]
    fn a_hive_and_its_run_future_can_move_between_threads() {
        fn send<T: Send>(_: &T) {}
        let hive = Hive::new([]);
        send(&hive);
        send(&hive.run(async {}));
        fn send_sync<T: Send + Sync>() {}
        send_sync::<crate::Lifecycle>();
        send_sync::<crate::Jobs>();
        send_sync::<crate::Reporter>();
        send_sync::<crate::Health>();
        send_sync::<crate::Shutdowner>();
        send_sync::<crate::Config<String>>();
    }

    #[tokio::test]
    async fn module_health_goes_not_started_started_stopped() {
        let silent: Arc<Mutex<Option<crate::Reporter>>> = Arc::default();
        let s = silent.clone();
        let mut hive = Hive::new([
            Module::new("quiet", "x").into(),
            Module::new("talks", "x")
                .invoke(|r: crate::Reporter| r.degraded("no peers yet"))
                .into(),
            Module::new("silent", "x")
                .invoke(move |r: crate::Reporter| *s.lock().unwrap() = Some(r))
                .into(),
        ]);
        let health = hive.health();
        let status = |id: &str| {
            let n = health.node(id).unwrap();
            (n.status.level, n.status.message)
        };
        assert_eq!(status("quiet"), (Level::Stopped, "not started".into()));
        hive.start().await.unwrap();
        assert_eq!(status("quiet"), (Level::Ok, "started".into()));
        assert_eq!(status("talks"), (Level::Degraded, "no peers yet".into()));
        assert_eq!(
            status("silent"),
            (Level::Unknown, "started; no report yet".into()),
            "took a reporter and never reported: not OK"
        );
        silent.lock().unwrap().as_ref().unwrap().ok("synced");
        assert_eq!(status("silent"), (Level::Ok, "synced".into()));
        hive.stop().await.unwrap();
        assert_eq!(status("quiet"), (Level::Stopped, "stopped".into()));
        assert_eq!(status("talks"), (Level::Stopped, "stopped".into()));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("port 4240 in use")]
    struct InUse;

    #[tokio::test]
    async fn a_failed_start_names_hook_module_and_cause_and_undoes_the_start() {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (l1, l2) = (log.clone(), log.clone());
        let mut hive = Hive::new([
            Module::new("store", "x")
                .invoke(move |lc: Lifecycle| {
                    lc.append(Hook::new("open").on_stop(move |_| async move {
                        l1.lock().unwrap().push("store stopped".into());
                        Ok(())
                    }))
                })
                .into(),
            Module::new("cp", "x")
                .cell(Module::new("api", "x").invoke(move |lc: Lifecycle| {
                    let l = l2.clone();
                    lc.append(
                        Hook::new("listen")
                            .on_start(|_| async { Err(Box::new(InUse) as crate::BoxError) })
                            .on_stop(move |_| async move {
                                l.lock().unwrap().push("api stopped".into());
                                Ok(())
                            }),
                    )
                }))
                .into(),
        ]);
        let err = hive.start().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "start hook `listen` of module `cp.api` failed"
        );
        assert_eq!(
            std::error::Error::source(&err).unwrap().to_string(),
            "port 4240 in use"
        );
        assert_eq!(*log.lock().unwrap(), ["store stopped"]);
        assert_eq!(hive.health().level(), Level::Stopped);
        assert!(matches!(hive.start().await, Err(Error::State { .. })));
    }

    #[tokio::test]
    async fn start_twice_and_start_after_stop_are_state_errors() {
        let mut hive = Hive::new([]);
        hive.start().await.unwrap();
        let again = hive.start().await.unwrap_err();
        assert_eq!(
            again.to_string(),
            "cannot start: the hive is already started"
        );
        hive.stop().await.unwrap();
        hive.stop().await.unwrap();
        assert!(
            hive.start()
                .await
                .unwrap_err()
                .to_string()
                .contains("has stopped")
        );
    }

    #[tokio::test]
    async fn stop_runs_every_hook_and_reports_every_failure() {
        let mut hive = Hive::new([Module::new("m", "x")
            .invoke(|lc: Lifecycle| {
                for name in ["one", "two", "three"] {
                    lc.append(Hook::new(name).on_stop(move |_| async move {
                        if name == "two" {
                            Ok(())
                        } else {
                            Err(format!("{name} failed").into())
                        }
                    }));
                }
            })
            .into()]);
        hive.start().await.unwrap();
        let err = hive.stop().await.unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("2 stop hook(s) failed:"), "{text}");
        assert!(text.contains("stop hook `three` of module `m`: three failed\n  - stop hook `one` of module `m`: one failed"), "{text}");
    }

    #[tokio::test]
    async fn run_stops_on_the_shutdown_future_or_a_shutdowner() {
        let hive = Hive::new([Module::new("m", "x").into()]);
        let health = hive.health();
        hive.run(async {}).await.unwrap();
        assert_eq!(health.node("m").unwrap().status.message, "stopped");

        let clean = Hive::new([Module::new("m", "x")
            .invoke(|lc: Lifecycle, s: Shutdowner| {
                lc.append(Hook::new("quit").on_start(move |_| async move {
                    s.shutdown(None);
                    Ok(())
                }))
            })
            .into()]);
        clean.run(std::future::pending()).await.unwrap();

        let failing = Hive::new([Module::new("m", "x")
            .invoke(|lc: Lifecycle, s: Shutdowner| {
                lc.append(
                    Hook::new("quit")
                        .on_start(move |_| async move {
                            s.shutdown(Some("lost the datapath".into()));
                            Ok(())
                        })
                        .on_stop(|_| async { Err("cleanup failed".into()) }),
                )
            })
            .into()]);
        let err = failing.run(std::future::pending()).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("shutdown requested with an error; then 1 stop hook(s) failed"),
            "{text}"
        );
        assert!(
            text.contains("stop hook `quit` of module `m`: cleanup failed"),
            "{text}"
        );
        assert_eq!(
            std::error::Error::source(&err).unwrap().to_string(),
            "lost the datapath"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_start_timeout_comes_from_the_config() {
        let mut hive = Hive::new([Module::new("slow", "x")
            .invoke(|lc: Lifecycle| {
                lc.append(Hook::new("hang").on_start(|ctx| async move {
                    ctx.cancelled().await;
                    Err("cancelled".into())
                }))
            })
            .into()])
        .with_config(crate::ConfigSources::new().flag("start-timeout", "3s"));
        let err = hive.start().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "start hook `hang` of module `slow` timed out after 3s"
        );
    }

    /// Records each event with the fields of the spans it is inside.
    #[derive(Default)]
    struct Capture {
        next: std::sync::atomic::AtomicU64,
        spans: Mutex<HashMap<u64, String>>,
        stack: Mutex<Vec<u64>>,
        lines: Arc<Mutex<Vec<String>>>,
    }

    struct Fields(String);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", field.name(), value));
        }
    }

    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let id = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let mut f = Fields(String::new());
            attrs.record(&mut f);
            self.spans.lock().unwrap().insert(id, f.0);
            tracing::span::Id::from_u64(id)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut f = Fields(String::new());
            event.record(&mut f);
            let spans = self.spans.lock().unwrap();
            let ctx: Vec<String> = self
                .stack
                .lock()
                .unwrap()
                .iter()
                .filter_map(|id| spans.get(id).cloned())
                .collect();
            self.lines
                .lock()
                .unwrap()
                .push(format!("{}| {}", ctx.join(""), f.0));
        }
        fn enter(&self, id: &tracing::span::Id) {
            self.stack.lock().unwrap().push(id.into_u64());
        }
        fn exit(&self, id: &tracing::span::Id) {
            let mut stack = self.stack.lock().unwrap();
            if let Some(pos) = stack.iter().rposition(|s| *s == id.into_u64()) {
                stack.remove(pos);
            }
        }
    }

    /// Runs in a child process of its own: `tracing` caches per call site
    /// whether anyone listens, and other tests running in parallel threads
    /// without a subscriber race with the one installed here.
    #[test]
    fn logs_of_hooks_and_jobs_carry_the_module_id() {
        if std::env::var("HIVE_LOG_CHILD").is_err() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "hive::tests::logs_of_hooks_and_jobs_carry_the_module_id",
                ])
                .env("HIVE_LOG_CHILD", "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains("1 passed"), "{stdout}");
            return;
        }
        let capture = Capture::default();
        let lines = capture.lines.clone();
        let _guard = tracing::subscriber::set_default(capture);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let tx = Mutex::new(Some(tx));
            let mut hive = Hive::new([Module::new("cp", "x")
                .cell(
                    Module::new("ipam", "x").invoke(move |lc: Lifecycle, jobs: crate::Jobs| {
                        lc.append(Hook::new("restore").on_start(|_| async {
                            tracing::info!("hello from a hook");
                            Ok(())
                        }));
                        let tx = tx.lock().unwrap().take();
                        let mut tx = tx;
                        jobs.one_shot("sync", move |_| {
                            let tx = tx.take();
                            async move {
                                tracing::info!("hello from a job");
                                if let Some(tx) = tx {
                                    let _ = tx.send(());
                                }
                                Ok(())
                            }
                        })
                        .add();
                    }),
                )
                .into()]);
            hive.start().await.unwrap();
            rx.await.unwrap();
            hive.stop().await.unwrap();
        });
        let lines = lines.lock().unwrap();
        let hook = lines
            .iter()
            .find(|l| l.contains("hello from a hook"))
            .unwrap();
        assert!(
            hook.contains("module=cp.ipam") && hook.contains("hook=restore"),
            "{hook}"
        );
        let done = lines
            .iter()
            .find(|l| l.contains("start hook done"))
            .unwrap();
        assert!(
            done.contains("module=cp.ipam") && done.contains("hook=restore"),
            "{done}"
        );
        let job = lines
            .iter()
            .find(|l| l.contains("hello from a job"))
            .unwrap();
        assert!(
            job.contains("module=cp.ipam") && job.contains("job=sync"),
            "{job}"
        );
    }
}

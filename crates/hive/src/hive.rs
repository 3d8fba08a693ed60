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
    /// populate would construct); declarations are checked throughout.
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
}

//! Running the plan: constructors, decorators and invokes, in order, once.

use std::any::Any;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::config::LoadedConfig;
use crate::constructor::CallError;
use crate::dependency::{DepKind, Resolved};
use crate::error::{BoxError, Error};
use crate::graph::{Analysis, NodeId, Source};
use crate::health::Health;
use crate::job::{JobGroup, Jobs, JobsShared};
use crate::lifecycle::{Hook, LifecycleShared};
use crate::module::ValueBox;
use crate::shutdown::Shutdowner;
use crate::typename::prettify;

/// The constructed values, kept alive as long as the hive.
#[derive(Default)]
pub(crate) struct Store {
    pub(crate) providers: Vec<Option<ValueBox>>,
    pub(crate) decorators: Vec<Option<ValueBox>>,
}

/// What populate hands to the functions besides the stored values.
pub(crate) struct Runtime<'a> {
    pub(crate) health: &'a Health,
    pub(crate) shutdowner: &'a Shutdowner,
    pub(crate) lifecycle: &'a Arc<LifecycleShared>,
    pub(crate) jobs: &'a Arc<JobsShared>,
}

fn internal(what: String) -> Error {
    Error::Internal { what }
}

fn stored<'a>(v: &'a Option<ValueBox>, name: &str) -> Result<&'a (dyn Any + Send + Sync), Error> {
    v.as_deref()
        .ok_or_else(|| internal(format!("a dependency of `{name}` was not built before it")))
}

/// Calls every function of the plan. Validation ran before, so a parameter
/// that cannot be produced is an internal error, not a user's.
pub(crate) fn construct(
    cat: &mut Catalog,
    analysis: &Analysis,
    config: &LoadedConfig,
    rt: &Runtime<'_>,
) -> Result<Store, Error> {
    let mut store = Store {
        providers: (0..cat.providers.len()).map(|_| None).collect(),
        decorators: (0..cat.decorators.len()).map(|_| None).collect(),
    };
    for &node in &analysis.order {
        let (module, sources) = match node {
            NodeId::Provider(p) => (cat.providers[p].module, &analysis.provider_deps[p]),
            NodeId::Decorator(d) => (cat.decorators[d].module, &analysis.decorator_deps[d]),
            NodeId::Invoke(i) => (cat.invokes[i].module, &analysis.invoke_deps[i]),
        };
        let module_ref = cat.module_ref(module);
        // Names are prettified only for errors: populate stays cheap.
        let raw: &'static str = match node {
            NodeId::Provider(p) => cat.providers[p].decl.name,
            NodeId::Decorator(d) => cat.decorators[d].name,
            NodeId::Invoke(i) => cat.invokes[i].decl.name,
        };
        let module_id = module_ref.id.clone();
        let name = || prettify(raw);
        let mut groups = Vec::new();
        let mut resolved = Vec::with_capacity(sources.len());
        for src in sources {
            let value = |v| stored(v, raw).map(Resolved::Value);
            resolved.push(match src {
                Source::Provider(p) => value(&store.providers[*p])?,
                Source::Decorator(d) => value(&store.decorators[*d])?,
                Source::Group(ps) => Resolved::Group(
                    ps.iter()
                        .map(|p| stored(&store.providers[*p], raw))
                        .collect::<Result<_, Error>>()?,
                ),
                Source::Config(t) => {
                    Resolved::Value(config.values.get(t).map(|v| v.as_ref()).ok_or_else(|| {
                        internal(format!("a config section of `{}` was not loaded", name()))
                    })?)
                }
                Source::Absent => Resolved::Absent,
                Source::BuiltIn(kind) => match kind {
                    DepKind::Lifecycle => {
                        Resolved::Lifecycle(rt.lifecycle.handle(module_ref.clone()))
                    }
                    DepKind::Jobs => {
                        let group = JobGroup::new(rt.jobs.clone(), module_ref.clone());
                        groups.push(group.clone());
                        Resolved::Jobs(Jobs::new(group))
                    }
                    DepKind::Reporter => {
                        // Taking a reporter is a promise to report: until it does, the
                        // started module is Unknown rather than OK.
                        rt.health.expect_report(&module_ref.id);
                        Resolved::Reporter(rt.health.reporter(&module_ref.id))
                    }
                    DepKind::Health => Resolved::Health(rt.health.clone()),
                    DepKind::Shutdowner => Resolved::Shutdowner(rt.shutdowner.clone()),
                    other => return Err(internal(format!("{other:?} is not a built-in"))),
                },
                Source::Missing(m) => {
                    return Err(internal(format!(
                        "`{}` has an unresolved parameter ({m:?})",
                        name()
                    )));
                }
            });
        }
        let span = tracing::info_span!("populate", module = %module_id);
        let _entered = span.enter();
        let called = |what: &str| internal(format!("{what} `{}` was called twice", name()));
        let fail = |e: CallError, wrap: &dyn Fn(BoxError) -> Error| match e {
            CallError::Failed(source) => wrap(source),
            CallError::Dependency { index } => internal(format!(
                "parameter {index} of `{}` did not match its declaration",
                name()
            )),
        };
        match node {
            NodeId::Provider(p) => {
                let call = cat.providers[p]
                    .decl
                    .call
                    .take()
                    .ok_or_else(|| called("constructor"))?;
                tracing::debug!(ctor = raw, "constructing");
                let output = cat.providers[p].decl.output;
                let value = call(resolved).map_err(|e| {
                    fail(e, &|source| Error::Construct {
                        ctor: name(),
                        output: format!("Arc<{}>", output.pretty()),
                        module: module_id.to_string(),
                        source,
                    })
                })?;
                store.providers[p] = Some(value);
            }
            NodeId::Decorator(d) => {
                let call = cat.decorators[d]
                    .call
                    .take()
                    .ok_or_else(|| called("decorator"))?;
                let target = cat.decorators[d].target;
                let value = call(resolved).map_err(|e| {
                    fail(e, &|source| Error::Decorate {
                        decorator: name(),
                        target: format!("Arc<{}>", target.pretty()),
                        module: module_id.to_string(),
                        source,
                    })
                })?;
                store.decorators[d] = Some(value);
            }
            NodeId::Invoke(i) => {
                let call = cat.invokes[i]
                    .decl
                    .call
                    .take()
                    .ok_or_else(|| called("invoke"))?;
                tracing::debug!(invoke = raw, "invoking");
                call(resolved).map_err(|e| {
                    fail(e, &|source| Error::Invoke {
                        invoke: name(),
                        module: module_id.to_string(),
                        source,
                    })
                })?;
            }
        }
        // The jobs of this function start right after its own hooks, so they
        // see what those hooks set up, and stop before those hooks stop.
        for group in groups {
            let (g1, g2) = (group.clone(), group);
            rt.lifecycle.handle(module_ref.clone()).append(
                Hook::new("jobs")
                    .on_start(move |_| async move {
                        g1.start();
                        Ok(())
                    })
                    .on_stop(move |_| async move {
                        g2.stop().await;
                        Ok(())
                    }),
            );
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::{Error, Hive, Jobs, Lifecycle, Module, Reporter, group};

    type Log = Arc<Mutex<Vec<String>>>;

    fn push(log: &Log, s: &str) {
        log.lock().unwrap().push(s.to_string());
    }

    struct A;
    struct B;
    struct C;

    #[test]
    fn only_what_invokes_need_is_built_once_dependencies_first() {
        let log = Log::default();
        let (l1, l2, l3, l4, l5) = (
            log.clone(),
            log.clone(),
            log.clone(),
            log.clone(),
            log.clone(),
        );
        let mut hive = Hive::new([Module::new("m", "x")
            .provide(move |_a: Arc<A>| {
                push(&l1, "new B");
                Arc::new(B)
            })
            .provide(move || {
                push(&l2, "new A");
                Arc::new(A)
            })
            .provide(move || {
                push(&l3, "new C (unused)");
                Arc::new(C)
            })
            .invoke(move |_b: Arc<B>, _a: Arc<A>| push(&l4, "invoke 1"))
            .invoke(move |_a: Arc<A>| push(&l5, "invoke 2"))
            .into()]);
        hive.populate().unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["new A", "new B", "invoke 1", "invoke 2"]
        );
        hive.populate().unwrap();
        assert_eq!(log.lock().unwrap().len(), 4, "populate is idempotent");
    }

    trait Greeter: Send + Sync {
        fn hello(&self) -> String;
    }
    struct English;
    impl Greeter for English {
        fn hello(&self) -> String {
            "hello".into()
        }
    }
    struct Loud(Arc<dyn Greeter>);
    impl Greeter for Loud {
        fn hello(&self) -> String {
            self.0.hello().to_uppercase()
        }
    }

    #[test]
    fn trait_objects_and_decorators_for_a_sub_tree() {
        let seen = Log::default();
        let (inside, outside) = (seen.clone(), seen.clone());
        let mut hive = Hive::new([
            Module::new("greeting", "x")
                .provide(|| Arc::new(English) as Arc<dyn Greeter>)
                .into(),
            Module::new("app", "x")
                .decorate(
                    |g: Arc<dyn Greeter>| Arc::new(Loud(g)) as Arc<dyn Greeter>,
                    [group([Module::new("loud", "x")
                        .invoke(move |g: Arc<dyn Greeter>| push(&inside, &g.hello()))
                        .into()])
                    .into()],
                )
                .invoke(move |g: Arc<dyn Greeter>| push(&outside, &g.hello()))
                .into(),
        ]);
        hive.populate().unwrap();
        assert_eq!(*seen.lock().unwrap(), ["HELLO", "hello"]);
        assert!(
            hive.health().node("app.loud").is_some(),
            "decorated cells are children"
        );
    }

    #[test]
    fn optional_and_group_dependencies() {
        struct Member(&'static str);
        let seen = Log::default();
        let s = seen.clone();
        let mut hive = Hive::new([
            Module::new("one", "x")
                .contribute(|| Arc::new(Member("one")))
                .into(),
            Module::new("two", "x")
                .contribute(|| Arc::new(Member("two")))
                .provide(|| Arc::new(A))
                .into(),
            Module::new("user", "x")
                .invoke(
                    move |members: Vec<Arc<Member>>,
                          a: Option<Arc<A>>,
                          b: Option<Arc<B>>,
                          none: Vec<Arc<C>>| {
                        let names: Vec<&str> = members.iter().map(|m| m.0).collect();
                        push(
                            &s,
                            &format!("{names:?} {} {} {}", a.is_some(), b.is_some(), none.len()),
                        );
                    },
                )
                .into(),
        ]);
        hive.populate().unwrap();
        assert_eq!(*seen.lock().unwrap(), ["[\"one\", \"two\"] true false 0"]);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("disk is full")]
    struct DiskFull;

    #[test]
    fn a_failing_constructor_names_itself_its_module_and_the_cause() {
        fn new_store() -> Result<Arc<A>, DiskFull> {
            Err(DiskFull)
        }
        let built = Arc::new(AtomicUsize::new(0));
        let b = built.clone();
        let mut hive = Hive::new([Module::new("cp", "x")
            .cell(Module::new("store", "x").provide(new_store))
            .invoke(move |_a: Arc<A>| {
                b.fetch_add(1, Ordering::SeqCst);
            })
            .into()]);
        let err = hive.populate().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("constructor `cellium_hive::populate::tests::a_failing_constructor_names_itself_its_module_and_the_cause::new_store`"), "{text}");
        assert!(
            text.contains("of `Arc<cellium_hive::populate::tests::A>` in module `cp.store` failed"),
            "{text}"
        );
        assert_eq!(
            std::error::Error::source(&err).unwrap().to_string(),
            "disk is full"
        );
        assert_eq!(built.load(Ordering::SeqCst), 0);
        assert!(matches!(hive.populate(), Err(Error::State { .. })));
    }

    #[test]
    fn a_failing_invoke_is_named() {
        let mut hive = Hive::new([Module::new("api", "x")
            .invoke(|| -> Result<(), DiskFull> { Err(DiskFull) })
            .into()]);
        let err = hive.populate().unwrap_err();
        assert!(err.to_string().starts_with("invoke `"), "{err}");
        assert!(err.to_string().contains("in module `api` failed"), "{err}");
    }

    #[test]
    fn built_ins_are_scoped_to_the_consuming_module() {
        let seen = Log::default();
        let s = seen.clone();
        let mut hive = Hive::new([Module::new("cp", "x")
            .cell(
                Module::new("ipam", "x").invoke(move |lc: Lifecycle, r: Reporter, _j: Jobs| {
                    push(&s, lc.module_id());
                    push(&s, r.id());
                }),
            )
            .into()]);
        hive.populate().unwrap();
        assert_eq!(*seen.lock().unwrap(), ["cp.ipam", "cp.ipam"]);
    }

    #[test]
    fn bad_job_names_added_while_populating_are_populate_errors() {
        let mut hive = Hive::new([Module::new("sync", "x")
            .invoke(|jobs: Jobs| {
                jobs.one_shot("Bad_Name", |_| async { Ok(()) }).add();
                jobs.one_shot("twice", |_| async { Ok(()) }).add();
                jobs.one_shot("twice", |_| async { Ok(()) }).add();
            })
            .into()]);
        let err = hive.populate().unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("invalid job name `Bad_Name` in module `sync`"),
            "{text}"
        );
        assert!(
            text.contains("job name `twice` is used twice in module `sync`"),
            "{text}"
        );
    }
}

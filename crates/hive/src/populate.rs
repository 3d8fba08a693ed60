//! Running the plan: constructors, decorators and invokes, in order, once.

use std::any::Any;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::config::LoadedConfig;
use crate::constructor::CallError;
use crate::dependency::{DepKind, Resolved};
use crate::error::{BoxError, Error};
use crate::graph::{Analysis, NodeId, Source, node_owner};
use crate::health::Health;
use crate::job::{JobGroup, Jobs, JobsShared};
use crate::lifecycle::{Hook, LifecycleShared};
use crate::module::ValueBox;
use crate::shutdown::Shutdowner;

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
        let (name, module_id) = node_owner(cat, node);
        let mut groups = Vec::new();
        let mut resolved = Vec::with_capacity(sources.len());
        for src in sources {
            let value = |v| stored(v, &name).map(Resolved::Value);
            resolved.push(match src {
                Source::Provider(p) => value(&store.providers[*p])?,
                Source::Decorator(d) => value(&store.decorators[*d])?,
                Source::Group(ps) => Resolved::Group(
                    ps.iter()
                        .map(|p| stored(&store.providers[*p], &name))
                        .collect::<Result<_, Error>>()?,
                ),
                Source::Config(t) => {
                    Resolved::Value(config.values.get(t).map(|v| v.as_ref()).ok_or_else(|| {
                        internal(format!("a config section of `{name}` was not loaded"))
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
                    DepKind::Reporter => Resolved::Reporter(rt.health.reporter(&module_ref.id)),
                    DepKind::Health => Resolved::Health(rt.health.clone()),
                    DepKind::Shutdowner => Resolved::Shutdowner(rt.shutdowner.clone()),
                    other => return Err(internal(format!("{other:?} is not a built-in"))),
                },
                Source::Missing(m) => {
                    return Err(internal(format!(
                        "`{name}` has an unresolved parameter ({m:?})"
                    )));
                }
            });
        }
        let span = tracing::info_span!("populate", module = %module_id);
        let _entered = span.enter();
        let called = |what: &str| internal(format!("{what} `{name}` was called twice"));
        let fail = |e: CallError, wrap: &dyn Fn(BoxError) -> Error| match e {
            CallError::Failed(source) => wrap(source),
            CallError::Dependency { index } => internal(format!(
                "parameter {index} of `{name}` did not match its declaration"
            )),
        };
        match node {
            NodeId::Provider(p) => {
                let call = cat.providers[p]
                    .decl
                    .call
                    .take()
                    .ok_or_else(|| called("constructor"))?;
                tracing::debug!(ctor = %name, "constructing");
                let output = format!("Arc<{}>", cat.providers[p].decl.output.pretty());
                let value = call(resolved).map_err(|e| {
                    fail(e, &|source| Error::Construct {
                        ctor: name.clone(),
                        output: output.clone(),
                        module: module_id.clone(),
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
                let target = format!("Arc<{}>", cat.decorators[d].target.pretty());
                let value = call(resolved).map_err(|e| {
                    fail(e, &|source| Error::Decorate {
                        decorator: name.clone(),
                        target: target.clone(),
                        module: module_id.clone(),
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
                tracing::debug!(invoke = %name, "invoking");
                call(resolved).map_err(|e| {
                    fail(e, &|source| Error::Invoke {
                        invoke: name.clone(),
                        module: module_id.clone(),
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

//! Validation: resolving every parameter, checking the graph, planning the order.
//!
//! Nodes are constructors, decorators and invokes; an edge goes from a consumer
//! to each node its parameters resolve to. Everything is checked before any
//! function runs, and every problem is reported at once:
//!
//! - declarations, always: duplicate providers, a type both provided and
//!   contributed;
//! - the part of the graph the invokes need (what populate would construct):
//!   missing providers, private types used outside their module, wrong kinds
//!   (`Arc<T>` of a value group, `Vec<Arc<T>>` of a provided type), missing
//!   config sections and cycles, each with the path from an invoke.
//!
//! Constructors nobody needs are not checked for missing dependencies: a crate
//! may offer more than a given agent embeds.

use std::any::TypeId;
use std::collections::{HashMap, HashSet};

mod dag;
mod report;

use crate::catalog::{Catalog, ScopeKind};
use crate::dependency::{DepKind, DepSpec};
use crate::error::Problem;
use crate::module::ProvideKind;
use crate::typename::{TypeKey, prettify};

use dag::Graph;
pub(crate) use report::node_label;

/// A function of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NodeId {
    Provider(usize),
    Decorator(usize),
    Invoke(usize),
}

/// Why a parameter has no value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Missing {
    NoProvider,
    /// Only a private provider exists, outside the consumer's scope chain.
    Private(usize),
    /// `Arc<T>` or `Option<Arc<T>>` of a contributed type.
    Contributed(usize),
    /// `Vec<Arc<T>>` of a provided type.
    Provided(usize),
    NoSection,
}

/// What a parameter resolves to.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Provider(usize),
    Decorator(usize),
    Group(Vec<usize>),
    Config(TypeId),
    BuiltIn(DepKind),
    Absent,
    Missing(Missing),
}

/// The result of validation.
pub(crate) struct Analysis {
    /// Resolved parameters of each provider, decorator and invoke.
    pub(crate) provider_deps: Vec<Vec<Source>>,
    pub(crate) decorator_deps: Vec<Vec<Source>>,
    pub(crate) invoke_deps: Vec<Vec<Source>>,
    /// Construction order: dependencies first, invokes in declaration order.
    pub(crate) order: Vec<NodeId>,
    pub(crate) problems: Vec<Problem>,
}

struct Index {
    public: HashMap<TypeId, Vec<usize>>,
    private_by_module: HashMap<(usize, TypeId), usize>,
    private: HashMap<TypeId, Vec<usize>>,
    contributed: HashMap<TypeId, Vec<usize>>,
}

/// Validates the catalog; `sections` are the config section types available.
pub(crate) fn analyze(cat: &Catalog, sections: &HashMap<TypeId, TypeKey>) -> Analysis {
    let mut problems = cat.problems.clone();
    let index = build_index(cat, &mut problems);

    let resolve_all = |inputs: &[DepSpec], module: usize| -> Vec<Source> {
        let scope = cat.modules[module].scope;
        inputs
            .iter()
            .map(|spec| resolve(cat, &index, sections, scope, spec))
            .collect()
    };
    let provider_deps: Vec<Vec<Source>> = cat
        .providers
        .iter()
        .map(|p| resolve_all(&p.decl.inputs, p.module))
        .collect();
    let decorator_deps: Vec<Vec<Source>> = cat
        .decorators
        .iter()
        .map(|d| resolve_all(&d.inputs, d.module))
        .collect();
    let invoke_deps: Vec<Vec<Source>> = cat
        .invokes
        .iter()
        .map(|i| resolve_all(&i.decl.inputs, i.module))
        .collect();

    let mut a = Analysis {
        provider_deps,
        decorator_deps,
        invoke_deps,
        order: Vec::new(),
        problems: Vec::new(),
    };
    let g = Graph::new(cat, &a);
    let parents = g.reachable();
    report::check_reachable(cat, &a, &g, &parents, sections, &mut problems);
    let cycles = g.cycles(&parents);
    for cycle in &cycles {
        problems.push(Problem::Cycle {
            cycle: cycle
                .iter()
                .map(|&n| g.label(cat, n))
                .collect::<Vec<_>>()
                .join(" -> "),
        });
    }
    if problems.is_empty() {
        a.order = g.plan();
    }
    a.problems = problems;
    a
}

fn build_index(cat: &Catalog, problems: &mut Vec<Problem>) -> Index {
    let mut index = Index {
        public: HashMap::new(),
        private_by_module: HashMap::new(),
        private: HashMap::new(),
        contributed: HashMap::new(),
    };
    for (i, p) in cat.providers.iter().enumerate() {
        let t = p.decl.output.id;
        match p.decl.kind {
            ProvideKind::Public => index.public.entry(t).or_default().push(i),
            ProvideKind::Private => {
                index.private.entry(t).or_default().push(i);
                index.private_by_module.entry((p.module, t)).or_insert(i);
            }
            ProvideKind::Contribute => index.contributed.entry(t).or_default().push(i),
        }
    }
    let dup = |a: usize, b: usize| {
        let (pa, pb) = (&cat.providers[a], &cat.providers[b]);
        Problem::DuplicateProvider {
            ty: format!("Arc<{}>", pa.decl.output.pretty()),
            first: prettify(pa.decl.name),
            first_module: cat.modules[pa.module].full_id.to_string(),
            second: prettify(pb.decl.name),
            second_module: cat.modules[pb.module].full_id.to_string(),
        }
    };
    // Walk types in declaration order so problems come in a stable order.
    let mut seen = HashSet::new();
    for p in &cat.providers {
        let t = p.decl.output.id;
        if !seen.insert(t) {
            continue;
        }
        let public = index.public.get(&t).map(Vec::as_slice).unwrap_or_default();
        let private = index.private.get(&t).map(Vec::as_slice).unwrap_or_default();
        for &other in public.iter().skip(1) {
            problems.push(dup(public[0], other));
        }
        for (k, &a) in private.iter().enumerate() {
            // A public provider is visible everywhere, so it clashes with any
            // private one; two private ones clash when one's module can see
            // the other's.
            if let Some(&p0) = public.first() {
                problems.push(dup(p0, a));
            }
            for &b in &private[k + 1..] {
                let (ma, mb) = (cat.providers[a].module, cat.providers[b].module);
                if cat.is_ancestor_or_self(ma, mb) || cat.is_ancestor_or_self(mb, ma) {
                    problems.push(dup(a, b));
                }
            }
        }
        if let Some(&c) = index.contributed.get(&t).and_then(|c| c.first())
            && let Some(&p) = public.first().or(private.first())
        {
            let (pp, pc) = (&cat.providers[p], &cat.providers[c]);
            problems.push(Problem::ProvideAndContribute {
                ty: format!("Arc<{}>", pp.decl.output.pretty()),
                provider: prettify(pp.decl.name),
                provider_module: cat.modules[pp.module].full_id.to_string(),
                contributor: prettify(pc.decl.name),
                contributor_module: cat.modules[pc.module].full_id.to_string(),
            });
        }
    }
    index
}

fn resolve(
    cat: &Catalog,
    index: &Index,
    sections: &HashMap<TypeId, TypeKey>,
    scope: usize,
    spec: &DepSpec,
) -> Source {
    let Some(ty) = spec.ty else {
        return Source::BuiltIn(spec.kind);
    };
    let t = ty.id;
    let provided = || index.public.get(&t).or(index.private.get(&t)).map(|v| v[0]);
    match spec.kind {
        DepKind::Config => {
            if sections.contains_key(&t) {
                Source::Config(t)
            } else {
                Source::Missing(Missing::NoSection)
            }
        }
        DepKind::Group => match index.contributed.get(&t) {
            Some(members) => Source::Group(members.clone()),
            None => match provided() {
                Some(p) => Source::Missing(Missing::Provided(p)),
                None => Source::Group(Vec::new()),
            },
        },
        DepKind::Required | DepKind::Optional => {
            let mut cur = Some(scope);
            while let Some(s) = cur {
                match cat.scopes[s].kind {
                    ScopeKind::Decorate(d) if cat.decorators[d].target.id == t => {
                        return Source::Decorator(d);
                    }
                    ScopeKind::Module(m) => {
                        if let Some(&p) = index.private_by_module.get(&(m, t)) {
                            return Source::Provider(p);
                        }
                    }
                    _ => {}
                }
                cur = cat.scopes[s].parent;
            }
            if let Some(ps) = index.public.get(&t) {
                return Source::Provider(ps[0]);
            }
            if let Some(cs) = index.contributed.get(&t) {
                return Source::Missing(Missing::Contributed(cs[0]));
            }
            match (spec.kind, index.private.get(&t)) {
                (DepKind::Optional, _) => Source::Absent,
                (_, Some(ps)) => Source::Missing(Missing::Private(ps[0])),
                _ => Source::Missing(Missing::NoProvider),
            }
        }
        _ => Source::BuiltIn(spec.kind),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{Config, Error, Hive, Module, Problem};

    struct Store;
    struct EndpointManager;
    struct Api;
    struct Unused;
    mod elsewhere {
        pub struct Store;
    }

    fn problems(hive: &Hive) -> Vec<Problem> {
        match hive.validate() {
            Err(Error::Invalid { problems }) => problems,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    /// The problems' texts, without this module's path in type names.
    fn texts(hive: &Hive) -> Vec<String> {
        problems(hive)
            .iter()
            .map(|p| p.to_string().replace("cellium_hive::graph::tests::", ""))
            .collect()
    }

    #[test]
    fn a_missing_provider_names_type_consumer_module_path_and_a_suggestion() {
        let hive = Hive::new([
            Module::new("store", "Keeps state")
                .provide(|| Arc::new(elsewhere::Store))
                .into(),
            Module::new("endpoint-manager", "Manages endpoints")
                .provide(|_s: Arc<Store>| Arc::new(EndpointManager))
                .into(),
            Module::new("api-server", "Serves")
                .provide(|_e: Arc<EndpointManager>| Arc::new(Api))
                .invoke(|_a: Arc<Api>| {})
                .into(),
        ]);
        let problems = texts(&hive);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let text = &problems[0];
        for part in [
            "missing provider: `Arc<Store>`",
            "in module `endpoint-manager`",
            "path: invoke in api-server -> Arc<Api> (api-server) -> Arc<EndpointManager> (endpoint-manager) -> Arc<Store>",
            "did you mean `Arc<elsewhere::Store>` (provided by module `store`)?",
        ] {
            assert!(text.contains(part), "missing {part:?} in\n{text}");
        }
        assert!(!text.contains("alloc::sync"), "{text}");
    }

    #[test]
    fn a_typo_gets_a_suggestion_and_an_unrelated_type_none() {
        struct EndpointManagr;
        struct Zebra;
        let hive = Hive::new([
            Module::new("em", "x")
                .provide(|| Arc::new(EndpointManager))
                .into(),
            Module::new("user", "x")
                .invoke(|_a: Arc<EndpointManagr>, _z: Arc<Zebra>| {})
                .into(),
        ]);
        let texts = texts(&hive);
        assert_eq!(texts.len(), 2);
        assert!(
            texts[0].contains("did you mean `Arc<EndpointManager>` (provided by module `em`)"),
            "{}",
            texts[0]
        );
        assert!(!texts[1].contains("did you mean"), "{}", texts[1]);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let hive = Hive::new([
            Module::new("Bad", "x").into(),
            Module::new("a", "x").provide(|| Arc::new(Store)).into(),
            Module::new("b", "x").provide(|| Arc::new(Store)).into(),
            Module::new("c", "x")
                .invoke(|_a: Arc<Api>, _e: Arc<EndpointManager>| {})
                .into(),
        ]);
        let texts = texts(&hive);
        assert_eq!(texts.len(), 4, "{texts:#?}");
        assert!(texts[0].starts_with("invalid module id `Bad`"));
        assert!(texts[1].starts_with("duplicate provider: `Arc<Store>`"));
        assert!(texts[1].contains("in module `a`") && texts[1].contains("in module `b`"));
        assert!(texts[2].contains("`Arc<Api>`"));
        assert!(texts[3].contains("`Arc<EndpointManager>`"));
    }

    #[test]
    fn private_types_are_visible_below_their_module_only() {
        let ok = Hive::new([Module::new("cp", "x")
            .provide_private(|| Arc::new(Store))
            .cell(Module::new("inner", "x").invoke(|_s: Arc<Store>| {}))
            .invoke(|_s: Arc<Store>| {})
            .into()]);
        ok.validate().unwrap();

        let bad = Hive::new([
            Module::new("cp", "x")
                .provide_private(|| Arc::new(Store))
                .into(),
            Module::new("api", "x").invoke(|_s: Arc<Store>| {}).into(),
        ]);
        let texts = texts(&bad);
        assert_eq!(texts.len(), 1);
        assert!(
            texts[0].contains("is private to module `cp`")
                && texts[0].contains("needed by")
                && texts[0].contains("in module `api`")
                && texts[0].contains("path: invoke in api -> Arc<"),
            "{}",
            texts[0]
        );
    }

    #[test]
    fn private_providers_in_sibling_modules_do_not_clash_but_nested_ones_do() {
        let siblings = Hive::new([
            Module::new("a", "x")
                .provide_private(|| Arc::new(Store))
                .invoke(|_s: Arc<Store>| {})
                .into(),
            Module::new("b", "x")
                .provide_private(|| Arc::new(Store))
                .invoke(|_s: Arc<Store>| {})
                .into(),
        ]);
        siblings.validate().unwrap();
        let nested = Hive::new([Module::new("a", "x")
            .provide_private(|| Arc::new(Store))
            .cell(Module::new("b", "x").provide_private(|| Arc::new(Store)))
            .into()]);
        let texts = texts(&nested);
        assert!(
            texts[0].contains("duplicate provider") && texts[0].contains("module `a.b`"),
            "{texts:?}"
        );
        let with_public = Hive::new([
            Module::new("a", "x")
                .provide_private(|| Arc::new(Store))
                .into(),
            Module::new("b", "x").provide(|| Arc::new(Store)).into(),
        ]);
        assert!(texts_of(&with_public)[0].contains("duplicate provider"));
    }

    fn texts_of(hive: &Hive) -> Vec<String> {
        texts(hive)
    }

    struct CycA;
    struct CycB;
    struct CycC;

    #[test]
    fn a_cycle_is_reported_whole_with_modules() {
        let hive = Hive::new([
            Module::new("a", "x")
                .provide(|_b: Arc<CycB>| Arc::new(CycA))
                .into(),
            Module::new("b", "x")
                .provide(|_c: Arc<CycC>| Arc::new(CycB))
                .into(),
            Module::new("c", "x")
                .provide(|_a: Arc<CycA>| Arc::new(CycC))
                .invoke(|_a: Arc<CycA>| {})
                .into(),
        ]);
        let texts = texts(&hive);
        assert_eq!(texts.len(), 1, "{texts:?}");
        let t = &texts[0];
        assert!(t.starts_with("dependency cycle: "), "{t}");
        let cycle = t.trim_start_matches("dependency cycle: ");
        assert_eq!(
            cycle,
            "Arc<CycA> (a) -> Arc<CycB> (b) -> Arc<CycC> (c) -> Arc<CycA> (a)"
        );
    }

    #[test]
    fn a_self_dependency_is_a_cycle() {
        let hive = Hive::new([Module::new("a", "x")
            .provide(|_a: Option<Arc<CycA>>| Arc::new(CycA))
            .invoke(|_a: Arc<CycA>| {})
            .into()]);
        assert!(texts(&hive)[0].contains("Arc<CycA> (a) -> Arc<CycA> (a)"));
    }

    #[test]
    fn unneeded_constructors_are_not_checked_for_missing_dependencies() {
        let hive = Hive::new([Module::new("a", "x")
            .provide(|_m: Arc<EndpointManager>| Arc::new(Unused))
            .provide(|| Arc::new(Store))
            .invoke(|_s: Arc<Store>| {})
            .into()]);
        hive.validate().unwrap();
    }

    #[test]
    fn value_groups_are_not_mixed_with_single_values() {
        let mixed = Hive::new([
            Module::new("a", "x").provide(|| Arc::new(Store)).into(),
            Module::new("b", "x").contribute(|| Arc::new(Store)).into(),
        ]);
        let t = &texts(&mixed)[0];
        assert!(
            t.contains("provided by")
                && t.contains("module `a`")
                && t.contains("contributed to a value group")
                && t.contains("module `b`"),
            "{t}"
        );

        let single_of_group = Hive::new([
            Module::new("b", "x").contribute(|| Arc::new(Store)).into(),
            Module::new("c", "x").invoke(|_s: Arc<Store>| {}).into(),
        ]);
        let t = &texts(&single_of_group)[0];
        assert!(
            t.contains("is a value group") && t.contains("depend on `Vec<Arc<Store>>`"),
            "{t}"
        );

        let group_of_single = Hive::new([
            Module::new("a", "x").provide(|| Arc::new(Store)).into(),
            Module::new("c", "x")
                .invoke(|_s: Vec<Arc<Store>>| {})
                .into(),
        ]);
        let t = &texts(&group_of_single)[0];
        assert!(
            t.contains("is provided (not contributed)") && t.contains("module `a`"),
            "{t}"
        );
    }

    #[test]
    fn a_missing_config_section_is_named_with_a_suggestion() {
        #[derive(Default, serde::Serialize, serde::Deserialize)]
        struct IpamConfig {
            x: u8,
        }
        #[derive(Default, serde::Serialize, serde::Deserialize)]
        struct IpamConfg {
            y: u8,
        }
        let hive = Hive::new([
            Module::new("ipam", "x").config::<IpamConfig>().into(),
            Module::new("user", "x")
                .invoke(|_c: Config<IpamConfg>| {})
                .into(),
        ]);
        let t = &texts(&hive)[0];
        assert!(
            t.contains("missing config section: `Config<")
                && t.contains(".config::<")
                && t.contains("did you mean `Config<"),
            "{t}"
        );
    }
}

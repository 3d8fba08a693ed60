//! Turning unresolved parameters into problems: paths and suggestions.

use std::any::TypeId;
use std::collections::HashMap;

use super::dag::Graph;
use super::{Analysis, Missing, NodeId, Source};
use crate::catalog::Catalog;
use crate::dependency::DepSpec;
use crate::error::Problem;
use crate::typename::{TypeKey, last_segment, prettify};

/// How a node reads in a path or cycle.
pub(crate) fn node_label(cat: &Catalog, id: NodeId) -> String {
    match id {
        NodeId::Provider(p) => {
            let p = &cat.providers[p];
            format!(
                "Arc<{}> ({})",
                p.decl.output.pretty(),
                cat.modules[p.module].full_id
            )
        }
        NodeId::Decorator(d) => {
            let d = &cat.decorators[d];
            format!(
                "Arc<{}> (decorated in {})",
                d.target.pretty(),
                cat.modules[d.module].full_id
            )
        }
        NodeId::Invoke(i) => format!("invoke in {}", cat.modules[cat.invokes[i].module].full_id),
    }
}

/// The function name and module of a node.
fn node_owner(cat: &Catalog, id: NodeId) -> (String, String) {
    let (name, module) = match id {
        NodeId::Provider(p) => (cat.providers[p].decl.name, cat.providers[p].module),
        NodeId::Decorator(d) => (cat.decorators[d].name, cat.decorators[d].module),
        NodeId::Invoke(i) => (cat.invokes[i].decl.name, cat.invokes[i].module),
    };
    (prettify(name), cat.modules[module].full_id.to_string())
}

fn inputs_of(cat: &Catalog, id: NodeId) -> &[DepSpec] {
    match id {
        NodeId::Provider(p) => &cat.providers[p].decl.inputs,
        NodeId::Decorator(d) => &cat.decorators[d].inputs,
        NodeId::Invoke(i) => &cat.invokes[i].decl.inputs,
    }
}

pub(crate) fn check_reachable(
    cat: &Catalog,
    a: &Analysis,
    g: &Graph,
    parents: &HashMap<usize, usize>,
    sections: &HashMap<TypeId, TypeKey>,
    problems: &mut Vec<Problem>,
) {
    let mut needed: Vec<usize> = parents.keys().copied().collect();
    needed.sort();
    for n in needed {
        let id = g.id(n);
        let deps = match id {
            NodeId::Provider(p) => &a.provider_deps[p],
            NodeId::Decorator(d) => &a.decorator_deps[d],
            NodeId::Invoke(i) => &a.invoke_deps[i],
        };
        for (spec, src) in inputs_of(cat, id).iter().zip(deps) {
            let Source::Missing(missing) = src else {
                continue;
            };
            let (consumer, module) = node_owner(cat, id);
            let needed = spec.display();
            let path = || {
                let mut parts: Vec<String> = g
                    .path_to(n, parents)
                    .into_iter()
                    .map(|m| g.label(cat, m))
                    .collect();
                parts.push(needed.clone());
                parts.join(" -> ")
            };
            let provider = |p: usize| {
                let p = &cat.providers[p];
                (
                    prettify(p.decl.name),
                    cat.modules[p.module].full_id.to_string(),
                )
            };
            let inner = spec.ty.map(|t| t.pretty()).unwrap_or_default();
            problems.push(match *missing {
                Missing::NoProvider => Problem::MissingProvider {
                    hint: suggest_provider(cat, &inner),
                    needed: needed.clone(),
                    consumer,
                    module,
                    path: path(),
                },
                Missing::NoSection => Problem::MissingConfig {
                    hint: suggest_section(sections, &inner),
                    needed: needed.clone(),
                    section: inner,
                    consumer,
                    module,
                    path: path(),
                },
                Missing::Private(p) => {
                    let (provider, provider_module) = provider(p);
                    Problem::PrivateType {
                        ty: needed.clone(),
                        provider,
                        provider_module,
                        consumer,
                        module,
                        path: path(),
                    }
                }
                Missing::Contributed(p) => Problem::WrongKind {
                    note: format!(
                        "`{inner}` is a value group (contributed by `{}` in module `{}`): depend on `Vec<Arc<{inner}>>`",
                        provider(p).0,
                        provider(p).1
                    ),
                    needed: needed.clone(),
                    consumer,
                    module,
                },
                Missing::Provided(p) => Problem::WrongKind {
                    note: format!(
                        "`{inner}` is provided (not contributed) by `{}` in module `{}`: depend on `Arc<{inner}>`, or declare the members with `contribute`",
                        provider(p).0,
                        provider(p).1
                    ),
                    needed: needed.clone(),
                    consumer,
                    module,
                },
            });
        }
    }
}

/// Similarity of two type names for "did you mean": by the last path segment
/// (a type of the same name in another crate scores 1), ties broken by the
/// whole name.
fn similarity(wanted: &str, candidate: &str) -> (f64, f64) {
    let (a, b) = (
        last_segment(wanted).to_lowercase(),
        last_segment(candidate).to_lowercase(),
    );
    (
        strsim::jaro_winkler(&a, &b),
        strsim::normalized_levenshtein(wanted, candidate),
    )
}

const SUGGEST: f64 = 0.85;

fn best<'a>(
    wanted: &str,
    candidates: impl Iterator<Item = (String, &'a str)>,
) -> Option<(String, String)> {
    candidates
        .filter(|(name, _)| name != wanted)
        .map(|(name, module)| (similarity(wanted, &name), name, module))
        .filter(|(score, _, _)| score.0 >= SUGGEST)
        .max_by(|a, b| {
            a.0.0
                .total_cmp(&b.0.0)
                .then(a.0.1.total_cmp(&b.0.1))
                .then_with(|| b.1.cmp(&a.1))
        })
        .map(|(_, name, module)| (name, module.to_string()))
}

fn suggest_provider(cat: &Catalog, wanted: &str) -> Option<String> {
    let candidates = cat
        .providers
        .iter()
        .map(|p| (p.decl.output.pretty(), &*cat.modules[p.module].full_id));
    best(wanted, candidates).map(|(name, module)| {
        format!("did you mean `Arc<{name}>` (provided by module `{module}`)?")
    })
}

fn suggest_section(sections: &HashMap<TypeId, TypeKey>, wanted: &str) -> Option<String> {
    let candidates = sections.values().map(|t| (t.pretty(), ""));
    best(wanted, candidates).map(|(name, _)| format!("did you mean `Config<{name}>`?"))
}

//! Introspection: `describe` (text) and `dot` (Graphviz).

use std::any::TypeId;
use std::fmt::Write;

use crate::catalog::Catalog;
use crate::dependency::DepSpec;
use crate::graph::{NodeId, Source, node_label};
use crate::hive::{HIVE_OWNER, Hive};
use crate::module::ProvideKind;
use crate::typename::prettify;

fn inputs(specs: &[DepSpec]) -> String {
    specs
        .iter()
        .map(DepSpec::display)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Items of each module, by module index.
struct ByModule {
    providers: Vec<Vec<usize>>,
    decorators: Vec<Vec<usize>>,
    invokes: Vec<Vec<usize>>,
    sections: Vec<Vec<usize>>,
    children: Vec<Vec<usize>>,
    roots: Vec<usize>,
}

impl ByModule {
    fn new(cat: &Catalog) -> ByModule {
        let n = cat.modules.len();
        let mut b = ByModule {
            providers: vec![Vec::new(); n],
            decorators: vec![Vec::new(); n],
            invokes: vec![Vec::new(); n],
            sections: vec![Vec::new(); n],
            children: vec![Vec::new(); n],
            roots: Vec::new(),
        };
        for (i, p) in cat.providers.iter().enumerate() {
            b.providers[p.module].push(i);
        }
        for (i, d) in cat.decorators.iter().enumerate() {
            b.decorators[d.module].push(i);
        }
        for (i, v) in cat.invokes.iter().enumerate() {
            b.invokes[v.module].push(i);
        }
        for (i, s) in cat.sections.iter().enumerate() {
            b.sections[s.module].push(i);
        }
        for (i, m) in cat.modules.iter().enumerate() {
            match m.parent {
                Some(p) => b.children[p].push(i),
                None => b.roots.push(i),
            }
        }
        b
    }
}

impl Hive {
    /// A readable description: the module tree with descriptions, each
    /// module's config values, providers (inputs and output), decorators and
    /// invokes; then the construction order and the start order (hooks with
    /// their module, known once populated).
    pub fn describe(&self) -> String {
        let cat = &self.catalog;
        let (analysis, loaded) = self.analyze();
        let config = self.config.as_ref().or(loaded.as_ref().ok());
        let by = ByModule::new(cat);
        let mut out = String::from("modules:\n");
        let mut stack: Vec<(usize, usize)> = by.roots.iter().rev().map(|&r| (r, 1)).collect();
        while let Some((m, depth)) = stack.pop() {
            let info = &cat.modules[m];
            let pad = "  ".repeat(depth);
            let id = info.full_id.rsplit('.').next().unwrap_or(&info.full_id);
            let _ = writeln!(out, "{pad}{id}: {}", info.description);
            for &s in &by.sections[m] {
                let ty = cat.sections[s].decl.ty;
                let _ = writeln!(out, "{pad}  config {}:", ty.pretty());
                render_values(&mut out, &pad, config.and_then(|c| c.rendered.get(&ty.id)));
            }
            for &p in &by.providers[m] {
                let d = &cat.providers[p].decl;
                let verb = match d.kind {
                    ProvideKind::Public => "provide",
                    ProvideKind::Private => "provide (private)",
                    ProvideKind::Contribute => "contribute",
                };
                let _ = writeln!(
                    out,
                    "{pad}  {verb} {}({}) -> Arc<{}>",
                    prettify(d.name),
                    inputs(&d.inputs),
                    d.output.pretty()
                );
            }
            for &d in &by.decorators[m] {
                let d = &cat.decorators[d];
                let _ = writeln!(
                    out,
                    "{pad}  decorate Arc<{}> with {}({})",
                    d.target.pretty(),
                    prettify(d.name),
                    inputs(&d.inputs)
                );
            }
            for &i in &by.invokes[m] {
                let d = &cat.invokes[i].decl;
                let _ = writeln!(
                    out,
                    "{pad}  invoke {}({})",
                    prettify(d.name),
                    inputs(&d.inputs)
                );
            }
            for &c in by.children[m].iter().rev() {
                stack.push((c, depth + 1));
            }
        }
        let _ = writeln!(out, "{HIVE_OWNER} config:");
        let hive_values = config.and_then(|c| c.rendered.get(&TypeId::of::<crate::HiveConfig>()));
        render_values(&mut out, "", hive_values);
        if let Err(problems) = &loaded {
            let _ = writeln!(
                out,
                "  ({} config problem(s); see validate)",
                problems.len()
            );
        }

        out.push_str("construction order:\n");
        if analysis.problems.is_empty() {
            for (n, &id) in analysis.order.iter().enumerate() {
                let what = match id {
                    NodeId::Invoke(i) => format!(
                        "{} ({})",
                        node_label(cat, id),
                        prettify(cat.invokes[i].decl.name)
                    ),
                    NodeId::Provider(p) => {
                        format!(
                            "{} by {}",
                            node_label(cat, id),
                            prettify(cat.providers[p].decl.name)
                        )
                    }
                    NodeId::Decorator(d) => {
                        format!(
                            "{} by {}",
                            node_label(cat, id),
                            prettify(cat.decorators[d].name)
                        )
                    }
                };
                let _ = writeln!(out, "  {}. {what}", n + 1);
            }
        } else {
            let _ = writeln!(
                out,
                "  (unknown: {} problem(s); see validate)",
                analysis.problems.len()
            );
        }
        out.push_str("start order:\n");
        if self.is_populated() {
            for (n, (hook, module)) in self.start_order().iter().enumerate() {
                let _ = writeln!(out, "  {}. {hook} ({module})", n + 1);
            }
        } else {
            out.push_str("  (known once populated: constructors append the hooks)\n");
        }
        out
    }

    /// The graph in Graphviz DOT: a cluster per module (nested as the modules
    /// are), a node per constructor, decorator, invoke and config section, and
    /// an edge from each function to what each of its parameters resolves to.
    /// Missing dependencies are red dashed nodes. Render with
    /// `dot -Tsvg hive.dot > hive.svg`.
    pub fn dot(&self) -> String {
        let cat = &self.catalog;
        let (analysis, _) = self.analyze();
        let by = ByModule::new(cat);
        // newrank: dot's older ranking fails ("trouble in init_rank") on edges into nested
        // clusters, which a graph of enough cells has.
        let mut out = String::from(
            "digraph hive {\n  rankdir=LR;\n  compound=true;\n  newrank=true;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n",
        );
        fn cluster(cat: &Catalog, by: &ByModule, m: usize, depth: usize, out: &mut String) {
            let pad = "  ".repeat(depth);
            let info = &cat.modules[m];
            let _ = writeln!(out, "{pad}subgraph cluster_{m} {{");
            let _ = writeln!(
                out,
                "{pad}  label=\"{}\\n{}\";",
                esc(&info.full_id),
                esc(info.description)
            );
            for &s in &by.sections[m] {
                let _ = writeln!(
                    out,
                    "{pad}  s{s} [shape=note, label=\"config\\n{}\"];",
                    esc(&cat.sections[s].decl.ty.pretty())
                );
            }
            for &p in &by.providers[m] {
                let d = &cat.providers[p].decl;
                let style = match d.kind {
                    ProvideKind::Public => "",
                    ProvideKind::Private => ", style=dashed",
                    ProvideKind::Contribute => ", style=rounded",
                };
                let _ = writeln!(
                    out,
                    "{pad}  p{p} [label=\"{}\\n-> Arc<{}>\"{style}];",
                    esc(&prettify(d.name)),
                    esc(&d.output.pretty())
                );
            }
            for &d in &by.decorators[m] {
                let d_ = &cat.decorators[d];
                let _ = writeln!(
                    out,
                    "{pad}  d{d} [shape=hexagon, label=\"decorate Arc<{}>\\n{}\"];",
                    esc(&d_.target.pretty()),
                    esc(&prettify(d_.name))
                );
            }
            for &i in &by.invokes[m] {
                let _ = writeln!(
                    out,
                    "{pad}  i{i} [shape=ellipse, label=\"invoke\\n{}\"];",
                    esc(&prettify(cat.invokes[i].decl.name))
                );
            }
            for &c in &by.children[m] {
                cluster(cat, by, c, depth + 1, out);
            }
            let _ = writeln!(out, "{pad}}}");
        }
        for &r in &by.roots {
            cluster(cat, &by, r, 1, &mut out);
        }
        let section_node: std::collections::HashMap<TypeId, usize> = cat
            .sections
            .iter()
            .enumerate()
            .map(|(i, s)| (s.decl.ty.id, i))
            .collect();
        let mut missing = 0;
        let lists = analysis
            .provider_deps
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("p{i}"), &cat.providers[i].decl.inputs, d))
            .chain(
                analysis
                    .decorator_deps
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (format!("d{i}"), &cat.decorators[i].inputs, d)),
            )
            .chain(
                analysis
                    .invoke_deps
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (format!("i{i}"), &cat.invokes[i].decl.inputs, d)),
            );
        for (from, specs, deps) in lists {
            for (spec, src) in specs.iter().zip(deps) {
                let label = esc(&spec.display());
                let targets: Vec<String> = match src {
                    Source::Provider(p) => vec![format!("p{p}")],
                    Source::Decorator(d) => vec![format!("d{d}")],
                    Source::Group(ps) => ps.iter().map(|p| format!("p{p}")).collect(),
                    Source::Config(t) => section_node
                        .get(t)
                        .map(|s| vec![format!("s{s}")])
                        .unwrap_or_default(),
                    Source::Missing(_) => {
                        missing += 1;
                        let _ = writeln!(
                            out,
                            "  missing{missing} [label=\"{label}\\n(missing)\", color=red, fontcolor=red, style=dashed];"
                        );
                        vec![format!("missing{missing}")]
                    }
                    Source::BuiltIn(_) | Source::Absent => Vec::new(),
                };
                for t in targets {
                    let _ = writeln!(out, "  {from} -> {t} [label=\"{label}\"];");
                }
            }
        }
        out.push_str("}\n");
        out
    }
}

fn render_values(out: &mut String, pad: &str, values: Option<&Vec<(String, String)>>) {
    match values {
        Some(values) => {
            for (k, v) in values {
                let _ = writeln!(out, "{pad}    {k} = {v}");
            }
        }
        None => {
            let _ = writeln!(out, "{pad}    (not loaded: the config has problems)");
        }
    }
}

/// Escapes a DOT string literal.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::{Deserialize, Serialize};

    use crate::{Config, Hive, Hook, Lifecycle, Module};

    #[derive(Default, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct StoreConfig {
        state_dir: String,
    }
    struct Store;
    struct Api;
    struct Missing;

    fn new_store(_c: Config<StoreConfig>, lc: Lifecycle) -> Arc<Store> {
        lc.append(Hook::new("open-store"));
        Arc::new(Store)
    }

    fn new_api(_s: Arc<Store>, lc: Lifecycle) -> Arc<Api> {
        lc.append(Hook::new("listen"));
        Arc::new(Api)
    }

    fn hive() -> Hive {
        Hive::new([Module::new("agent", "The whole agent")
            .cell(
                Module::new("store", "Keeps state on disk")
                    .config::<StoreConfig>()
                    .provide(new_store),
            )
            .cell(
                Module::new("api", "Serves the state")
                    .provide(new_api)
                    .invoke(|_a: Arc<Api>| {}),
            )
            .into()])
        .with_config(crate::ConfigSources::new().flag("state-dir", "/run/x"))
    }

    #[test]
    fn describe_shows_modules_config_providers_invokes_and_orders() {
        let mut hive = hive();
        let before = hive.describe();
        assert!(
            before.contains("start order:\n  (known once populated"),
            "{before}"
        );
        hive.populate().unwrap();
        let text = hive.describe();
        for part in [
            "modules:\n  agent: The whole agent\n    store: Keeps state on disk\n",
            "      config cellium_hive::introspect::tests::StoreConfig:\n        state-dir = \"/run/x\"\n",
            "      provide cellium_hive::introspect::tests::new_store(Config<cellium_hive::introspect::tests::StoreConfig>, Lifecycle) -> Arc<cellium_hive::introspect::tests::Store>\n",
            "    api: Serves the state\n",
            "      invoke cellium_hive::introspect::tests::hive::{{closure}}(Arc<cellium_hive::introspect::tests::Api>)\n",
            "hive config:\n    start-timeout = \"5m\"\n    stop-timeout = \"1m\"\n",
            "construction order:\n  1. Arc<cellium_hive::introspect::tests::Store> (agent.store) by cellium_hive::introspect::tests::new_store\n  2. Arc<cellium_hive::introspect::tests::Api> (agent.api) by",
            "  3. invoke in agent.api (",
            "start order:\n  1. open-store (agent.store)\n  2. listen (agent.api)\n",
        ] {
            assert!(text.contains(part), "missing {part:?} in\n{text}");
        }
    }

    #[test]
    fn dot_has_nested_clusters_nodes_edges_and_missing_nodes() {
        let text = hive().dot();
        assert!(text.starts_with("digraph hive {"), "{text}");
        assert!(text.contains("subgraph cluster_0 {"), "{text}");
        assert!(
            text.contains(
                "  subgraph cluster_1 {\n      label=\"agent.store\\nKeeps state on disk\";"
            ),
            "{text}"
        );
        assert!(
            text.contains("p1 -> p0 [label=\"Arc<cellium_hive::introspect::tests::Store>\"];"),
            "{text}"
        );
        assert!(text.contains("p0 -> s0 [label=\"Config<"), "{text}");
        assert!(text.contains("i0 -> p1"), "{text}");
        assert_eq!(text.matches('{').count(), text.matches('}').count());

        let broken = Hive::new([Module::new("a", "x").invoke(|_m: Arc<Missing>| {}).into()]);
        let text = broken.dot();
        assert!(text.contains("missing1 [label=\"Arc<cellium_hive::introspect::tests::Missing>\\n(missing)\", color=red"), "{text}");
        assert!(text.contains("i0 -> missing1"), "{text}");
        assert!(
            broken
                .describe()
                .contains("(unknown: 1 problem(s); see validate)")
        );
    }
}

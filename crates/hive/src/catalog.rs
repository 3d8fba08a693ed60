//! The declared cells, flattened into tables with scopes.
//!
//! Scopes form a tree: the root, one scope per module, and one per `decorate`
//! (a child of the declaring module's scope, holding the decorated cells).
//! Groups add no scope. A consumer resolves `Arc<T>` by walking up from its
//! module's scope: the nearest decorator of `T`, else the nearest private
//! provider of `T`, else the public one.

use std::collections::HashSet;
use std::sync::Arc;

use crate::config::SectionDecl;
use crate::dependency::DepSpec;
use crate::error::{Problem, check_name};
use crate::module::{CallFn, Cell, InvokeDecl, Item, ProviderDecl, ValueBox};
use crate::typename::TypeKey;

/// A module as handed to lifecycles, jobs and logs: its index and full id.
#[derive(Clone, Debug)]
pub(crate) struct ModuleRef {
    pub(crate) idx: usize,
    pub(crate) id: Arc<str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScopeKind {
    Root,
    Module(usize),
    Decorate(usize),
}

pub(crate) struct Scope {
    pub(crate) parent: Option<usize>,
    pub(crate) kind: ScopeKind,
}

pub(crate) struct ModuleInfo {
    pub(crate) full_id: Arc<str>,
    pub(crate) description: &'static str,
    pub(crate) parent: Option<usize>,
    pub(crate) scope: usize,
}

pub(crate) struct ProviderEntry {
    pub(crate) decl: ProviderDecl,
    pub(crate) module: usize,
}

pub(crate) struct InvokeEntry {
    pub(crate) decl: InvokeDecl,
    pub(crate) module: usize,
}

pub(crate) struct DecoratorEntry {
    pub(crate) name: &'static str,
    pub(crate) target: TypeKey,
    pub(crate) inputs: Vec<DepSpec>,
    pub(crate) call: Option<CallFn<ValueBox>>,
    pub(crate) module: usize,
}

pub(crate) struct SectionEntry {
    pub(crate) decl: SectionDecl,
    pub(crate) module: usize,
}

/// Everything declared, in declaration order.
#[derive(Default)]
pub(crate) struct Catalog {
    pub(crate) scopes: Vec<Scope>,
    pub(crate) modules: Vec<ModuleInfo>,
    pub(crate) providers: Vec<ProviderEntry>,
    pub(crate) invokes: Vec<InvokeEntry>,
    pub(crate) decorators: Vec<DecoratorEntry>,
    pub(crate) sections: Vec<SectionEntry>,
    /// Bad or duplicate module ids.
    pub(crate) problems: Vec<Problem>,
}

impl Catalog {
    pub(crate) fn new(cells: impl IntoIterator<Item = Cell>) -> Catalog {
        let mut c = Catalog {
            scopes: vec![Scope {
                parent: None,
                kind: ScopeKind::Root,
            }],
            ..Catalog::default()
        };
        let mut ids = HashSet::new();
        for cell in cells {
            c.add_cell(cell, 0, None, &mut ids);
        }
        c
    }

    fn add_cell(
        &mut self,
        cell: Cell,
        scope: usize,
        parent: Option<usize>,
        ids: &mut HashSet<Arc<str>>,
    ) {
        let m = match cell {
            Cell::Group(g) => {
                for c in g.cells {
                    self.add_cell(c, scope, parent, ids);
                }
                return;
            }
            Cell::Module(m) => m,
        };
        let parent_id = parent.map(|p| self.modules[p].full_id.clone());
        if let Err(reason) = check_name(m.id) {
            self.problems.push(Problem::InvalidModuleId {
                id: m.id.to_string(),
                parent: parent_id.as_deref().map(str::to_string),
                reason,
            });
        }
        let full_id: Arc<str> = match &parent_id {
            Some(p) => Arc::from(format!("{p}.{}", m.id)),
            None => Arc::from(m.id),
        };
        if !ids.insert(full_id.clone()) {
            self.problems.push(Problem::DuplicateModule {
                id: full_id.to_string(),
            });
        }
        let idx = self.modules.len();
        let own_scope = self.scopes.len();
        self.scopes.push(Scope {
            parent: Some(scope),
            kind: ScopeKind::Module(idx),
        });
        self.modules.push(ModuleInfo {
            full_id,
            description: m.description,
            parent,
            scope: own_scope,
        });
        for item in m.items {
            match item {
                Item::Config(decl) => self.sections.push(SectionEntry { decl, module: idx }),
                Item::Provide(decl) => self.providers.push(ProviderEntry { decl, module: idx }),
                Item::Invoke(decl) => self.invokes.push(InvokeEntry { decl, module: idx }),
                Item::Decorate(d) => {
                    let didx = self.decorators.len();
                    let dscope = self.scopes.len();
                    self.scopes.push(Scope {
                        parent: Some(own_scope),
                        kind: ScopeKind::Decorate(didx),
                    });
                    self.decorators.push(DecoratorEntry {
                        name: d.name,
                        target: d.target,
                        inputs: d.inputs,
                        call: d.call,
                        module: idx,
                    });
                    for c in d.cells {
                        self.add_cell(c, dscope, Some(idx), ids);
                    }
                }
                Item::Cell(c) => self.add_cell(c, own_scope, Some(idx), ids),
            }
        }
    }

    pub(crate) fn module_ref(&self, idx: usize) -> ModuleRef {
        ModuleRef {
            idx,
            id: self.modules[idx].full_id.clone(),
        }
    }

    /// Whether module `a` is module `b` or one of its ancestors.
    pub(crate) fn is_ancestor_or_self(&self, a: usize, b: usize) -> bool {
        let mut cur = Some(b);
        while let Some(m) = cur {
            if m == a {
                return true;
            }
            cur = self.modules[m].parent;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::{Module, group};

    #[test]
    fn full_ids_are_dotted_paths_and_groups_add_no_level() {
        let c = Catalog::new([
            Module::new("cp", "control plane")
                .cell(group([
                    Module::new("ipam", "allocates").into(),
                    Module::new("api", "serves").into(),
                ]))
                .into(),
            Module::new("loader", "loads").into(),
        ]);
        let ids: Vec<&str> = c.modules.iter().map(|m| &*m.full_id).collect();
        assert_eq!(ids, ["cp", "cp.ipam", "cp.api", "loader"]);
        assert!(c.problems.is_empty());
        assert!(c.is_ancestor_or_self(0, 1));
        assert!(!c.is_ancestor_or_self(1, 0));
        assert!(!c.is_ancestor_or_self(3, 1));
    }

    #[test]
    fn bad_and_duplicate_ids_are_problems_not_panics() {
        let c = Catalog::new([
            Module::new("cp", "x")
                .cell(Module::new("Bad_Id", "x"))
                .into(),
            Module::new("a", "x").into(),
            Module::new("a", "x").into(),
        ]);
        let text: Vec<String> = c.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text[0].contains("invalid module id `Bad_Id` in module `cp`"),
            "{text:?}"
        );
        assert!(
            text[1].contains("module id `a` is declared twice"),
            "{text:?}"
        );
    }
}

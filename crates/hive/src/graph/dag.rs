//! The dependency graph: reachability from the invokes, cycles, the plan.

use std::collections::{HashMap, HashSet, VecDeque};

use petgraph::graph::{DiGraph, NodeIndex};

use super::{Analysis, NodeId, Source, node_label};
use crate::catalog::Catalog;

/// The dependency graph over numbered nodes: providers, then decorators, then
/// invokes.
pub(crate) struct Graph {
    providers: usize,
    decorators: usize,
    invokes: usize,
    /// Edges in parameter order, consumer to dependency.
    adj: Vec<Vec<usize>>,
    pg: DiGraph<usize, ()>,
}

impl Graph {
    pub(crate) fn new(cat: &Catalog, a: &Analysis) -> Graph {
        let (np, nd, ni) = (cat.providers.len(), cat.decorators.len(), cat.invokes.len());
        let mut g = Graph {
            providers: np,
            decorators: nd,
            invokes: ni,
            adj: vec![Vec::new(); np + nd + ni],
            pg: DiGraph::with_capacity(np + nd + ni, 0),
        };
        for n in 0..np + nd + ni {
            g.pg.add_node(n);
        }
        let lists = a
            .provider_deps
            .iter()
            .chain(&a.decorator_deps)
            .chain(&a.invoke_deps);
        for (n, deps) in lists.enumerate() {
            for src in deps {
                let targets: Vec<usize> = match src {
                    Source::Provider(p) => vec![*p],
                    Source::Decorator(d) => vec![np + d],
                    Source::Group(ps) => ps.clone(),
                    _ => Vec::new(),
                };
                for t in targets {
                    g.adj[n].push(t);
                    g.pg.add_edge(NodeIndex::new(n), NodeIndex::new(t), ());
                }
            }
        }
        g
    }

    pub(crate) fn id(&self, n: usize) -> NodeId {
        if n < self.providers {
            NodeId::Provider(n)
        } else if n < self.providers + self.decorators {
            NodeId::Decorator(n - self.providers)
        } else {
            NodeId::Invoke(n - self.providers - self.decorators)
        }
    }

    fn invoke_nodes(&self) -> std::ops::Range<usize> {
        let first = self.providers + self.decorators;
        first..first + self.invokes
    }

    /// Breadth-first from the invokes in declaration order: for each node the
    /// invoke needs, the node it was first reached from (`usize::MAX` for roots),
    /// so each path is a shortest one from the earliest invoke.
    pub(crate) fn reachable(&self) -> HashMap<usize, usize> {
        let mut parent = HashMap::new();
        let mut queue = VecDeque::new();
        for i in self.invoke_nodes() {
            parent.insert(i, usize::MAX);
            queue.push_back(i);
        }
        while let Some(n) = queue.pop_front() {
            for &t in &self.adj[n] {
                if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(t) {
                    e.insert(n);
                    queue.push_back(t);
                }
            }
        }
        parent
    }

    /// The path from an invoke down to node `n`, invoke first.
    pub(crate) fn path_to(&self, n: usize, parents: &HashMap<usize, usize>) -> Vec<usize> {
        let mut path = vec![n];
        let mut cur = n;
        while let Some(&p) = parents.get(&cur) {
            if p == usize::MAX || path.contains(&p) {
                break;
            }
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }

    /// Every cycle among the needed nodes, one per strongly connected component.
    pub(crate) fn cycles(&self, parents: &HashMap<usize, usize>) -> Vec<Vec<usize>> {
        let mut cycles = Vec::new();
        let mut sccs = petgraph::algo::tarjan_scc(&self.pg);
        for scc in &mut sccs {
            scc.sort();
        }
        sccs.sort();
        for scc in sccs {
            let members: Vec<usize> = scc.iter().map(|i| i.index()).collect();
            let first = members[0];
            let looped = members.len() > 1 || self.adj[first].contains(&first);
            if !looped || !members.iter().any(|m| parents.contains_key(m)) {
                continue;
            }
            let set: HashSet<usize> = members.iter().copied().collect();
            if let Some(cycle) = self.cycle_through(first, &set) {
                cycles.push(cycle);
            }
        }
        cycles
    }

    /// A cycle from `start` back to itself within `set`, as a node list ending
    /// with `start` again.
    fn cycle_through(&self, start: usize, set: &HashSet<usize>) -> Option<Vec<usize>> {
        let mut parent: HashMap<usize, usize> = HashMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(n) = queue.pop_front() {
            for &t in &self.adj[n] {
                if !set.contains(&t) {
                    continue;
                }
                if t == start {
                    let mut path = vec![n];
                    let mut cur = n;
                    while cur != start {
                        match parent.get(&cur) {
                            Some(&p) => cur = p,
                            None => break,
                        }
                        path.push(cur);
                    }
                    path.reverse();
                    path.push(start);
                    return Some(path);
                }
                if t != start && !parent.contains_key(&t) {
                    parent.insert(t, n);
                    queue.push_back(t);
                }
            }
        }
        None
    }

    /// Depth-first post-order from each invoke in declaration order: every node
    /// comes after its dependencies, in parameter order, and each invoke right
    /// after what it needs.
    pub(crate) fn plan(&self) -> Vec<NodeId> {
        let mut order = Vec::new();
        let mut done = vec![false; self.adj.len()];
        for root in self.invoke_nodes() {
            let mut stack = vec![(root, 0usize)];
            done[root] = true;
            while let Some((n, next)) = stack.last_mut() {
                let n = *n;
                if let Some(&t) = self.adj[n].get(*next) {
                    *next += 1;
                    if !done[t] {
                        done[t] = true;
                        stack.push((t, 0));
                    }
                } else {
                    stack.pop();
                    order.push(self.id(n));
                }
            }
        }
        order
    }

    /// `Arc<T> (module m)` for a provider, `invoke in m` for an invoke.
    pub(crate) fn label(&self, cat: &Catalog, n: usize) -> String {
        node_label(cat, self.id(n))
    }
}

//! The health tree: every module, job and sub-reporter has a node.
//!
//! Node ids are full dotted paths (`controlplane.ipam`, `controlplane.ipam.restore`).
//! A node has its own status, set through a [`Reporter`] (or by the hive for modules
//! and jobs), and an *effective* status computed from its own and its children's:
//!
//! - the level is the most severe one, in the order of [`Level`]'s `Ord`:
//!   `Degraded` outranks `Unknown`, which outranks `Ok`, which outranks `Stopped`.
//!   A stopped part of a running module (an observer whose stream ended) does not
//!   make the module look stopped, and a node is `Stopped` only when it and
//!   everything under it is; a part that has not said how it goes keeps its
//!   module from looking OK, but a known problem outranks it;
//! - `since` is the latest change anywhere under the node;
//! - the message is the node's own, or, when a descendant is worse, that
//!   descendant's id and message.
//!
//! # What the hive reports itself
//! Before start every module is `Stopped("not started")`. Once a module's start
//! hooks have succeeded:
//!
//! - a module whose functions took a [`Reporter`] and that has not reported yet is
//!   `Unknown("started; no report yet")`: it said it would tell how it goes, so the
//!   hive does not claim it is fine; it reports `Ok` once its work has stabilized;
//! - a module that took no `Reporter` has nothing to report beyond its start
//!   hooks: it is `Ok("started")`.
//!
//! A job is `Unknown` until its first run has ended or it reported through its own
//! reporter (see [`Jobs`](crate::Jobs) for each kind). At stop every node turns
//! `Stopped`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::watch;

/// The health level of a node.
///
/// Ordered by severity (`Stopped < Ok < Unknown < Degraded`), so the worst of
/// several levels is their `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// Working as intended.
    Ok,
    /// Working badly or not at all; the message says why.
    Degraded,
    /// Not running: not started yet, finished, or stopped.
    Stopped,
    /// Running, but not known to work: its owner took a [`Reporter`] and has not
    /// reported yet, or a job's first run has not ended. Not OK.
    Unknown,
}

impl Level {
    /// Aggregation rank: higher is worse.
    fn rank(self) -> u8 {
        match self {
            Level::Stopped => 0,
            Level::Ok => 1,
            Level::Unknown => 2,
            Level::Degraded => 3,
        }
    }
}

impl Ord for Level {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl PartialOrd for Level {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "OK",
            Level::Degraded => "Degraded",
            Level::Stopped => "Stopped",
            Level::Unknown => "Unknown",
        })
    }
}

/// A level with its reason and the time it last changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The level.
    pub level: Level,
    /// Why (for `Degraded`, the error).
    pub message: String,
    /// When the level or message last changed.
    pub since: SystemTime,
}

/// A node of the health tree with its effective status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthNode {
    /// The full dotted path (`controlplane.ipam.restore`).
    pub id: String,
    /// The effective status (see the module docs).
    pub status: Status,
    /// Sub-modules, jobs and sub-reporters, in the order they appeared.
    pub children: Vec<HealthNode>,
}

impl HealthNode {
    /// Finds a node by its full id in this sub-tree.
    pub fn find(&self, id: &str) -> Option<&HealthNode> {
        if self.id == id {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(id))
    }

    fn render(&self, depth: usize, out: &mut String) {
        out.push_str(&format!(
            "{:indent$}{} {}: {}\n",
            "",
            self.id,
            self.status.level,
            self.status.message,
            indent = depth * 2
        ));
        for c in &self.children {
            c.render(depth + 1, out);
        }
    }
}

struct NodeState {
    own: Status,
    /// Set once the node's owner reported through a `Reporter`; the hive's own
    /// "started" status only fills nodes that said nothing.
    reported: bool,
    /// Set when the module's functions took a `Reporter`: once started, it is
    /// `Unknown` rather than `Ok` until it reports.
    expects_report: bool,
    /// Bumped on every report, so a job runner can tell whether its function
    /// reported something itself during a run.
    version: u64,
    /// Creation order, so children keep the order they appeared in.
    seq: u64,
}

struct Registry {
    nodes: HashMap<String, NodeState>,
    next_seq: u64,
}

pub(crate) struct HealthInner {
    registry: Mutex<Registry>,
    changes: watch::Sender<u64>,
}

/// Read access to the whole health tree. Any constructor can depend on `Health`.
#[derive(Clone)]
pub struct Health {
    inner: Arc<HealthInner>,
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Health {
    pub(crate) fn new() -> Health {
        Health {
            inner: Arc::new(HealthInner {
                registry: Mutex::new(Registry {
                    nodes: HashMap::new(),
                    next_seq: 0,
                }),
                changes: watch::channel(0).0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves consistent data (every update is
        // a single assignment), so a poisoned lock is still usable.
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The roots of the tree (the top-level modules), with effective statuses.
    pub fn tree(&self) -> Vec<HealthNode> {
        let reg = self.lock();
        let mut paths: Vec<(&String, &NodeState)> = reg.nodes.iter().collect();
        paths.sort_by_key(|(_, n)| n.seq);
        let index: HashMap<&str, usize> = paths
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p.as_str(), i))
            .collect();
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); paths.len()];
        let mut roots = Vec::new();
        for (i, (path, _)) in paths.iter().enumerate() {
            match parent_of(path, &index) {
                Some(p) => children[p].push(i),
                None => roots.push(i),
            }
        }
        roots
            .into_iter()
            .map(|r| build(r, &paths, &children))
            .collect()
    }

    /// The node with this full id, with its effective status.
    pub fn node(&self, id: &str) -> Option<HealthNode> {
        self.tree().iter().find_map(|r| r.find(id)).cloned()
    }

    /// The worst level of the whole tree (`Stopped` for an empty tree).
    pub fn level(&self) -> Level {
        worst(&self.tree())
    }

    /// A receiver that changes on every health update (the value is a revision
    /// counter); re-read [`Health::tree`] when it changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// The tree as indented text, one node a line: `id LEVEL: message`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for root in self.tree() {
            root.render(0, &mut out);
        }
        out
    }

    pub(crate) fn reporter(&self, path: &str) -> Reporter {
        Reporter {
            health: self.clone(),
            path: Arc::from(path),
        }
    }

    /// Sets a node's own status. `user` marks reports made through a `Reporter`.
    pub(crate) fn set(&self, path: &str, level: Level, message: String, user: bool) {
        {
            let mut reg = self.lock();
            if !reg.nodes.contains_key(path) {
                let seq = reg.next_seq;
                reg.next_seq += 1;
                reg.nodes.insert(
                    path.to_string(),
                    NodeState {
                        own: Status {
                            level,
                            message: String::new(),
                            since: SystemTime::now(),
                        },
                        reported: false,
                        expects_report: false,
                        version: 0,
                        seq,
                    },
                );
            }
            let Some(node) = reg.nodes.get_mut(path) else {
                return;
            };
            if node.own.level != level || node.own.message != message {
                node.own = Status {
                    level,
                    message,
                    since: SystemTime::now(),
                };
            }
            node.reported |= user;
            node.version += 1;
        }
        self.inner.changes.send_modify(|v| *v += 1);
    }

    /// Records that a module's functions took a `Reporter` for `path`.
    pub(crate) fn expect_report(&self, path: &str) {
        if let Some(node) = self.lock().nodes.get_mut(path) {
            node.expects_report = true;
        }
    }

    /// Sets a started module's status unless its owner reported already:
    /// `Unknown` if it took a `Reporter`, else `Ok("started")`.
    pub(crate) fn mark_started(&self, path: &str) {
        let (reported, expects) = self
            .lock()
            .nodes
            .get(path)
            .map_or((false, false), |n| (n.reported, n.expects_report));
        if reported {
            return;
        }
        if expects {
            self.set(path, Level::Unknown, "started; no report yet".into(), false);
        } else {
            self.set(path, Level::Ok, "started".into(), false);
        }
    }

    /// Sets every node under (and including) the given roots to `Stopped`.
    pub(crate) fn stop_all(&self, message: &str) {
        {
            let mut reg = self.lock();
            let now = SystemTime::now();
            for node in reg.nodes.values_mut() {
                if node.own.level != Level::Stopped || node.own.message != message {
                    node.own = Status {
                        level: Level::Stopped,
                        message: message.to_string(),
                        since: now,
                    };
                    node.version += 1;
                }
            }
        }
        self.inner.changes.send_modify(|v| *v += 1);
    }

    /// Removes a node and everything under it.
    pub(crate) fn remove(&self, path: &str) {
        {
            let mut reg = self.lock();
            let prefix = format!("{path}.");
            reg.nodes
                .retain(|p, _| p != path && !p.starts_with(prefix.as_str()));
        }
        self.inner.changes.send_modify(|v| *v += 1);
    }

    pub(crate) fn version(&self, path: &str) -> u64 {
        self.lock().nodes.get(path).map_or(0, |n| n.version)
    }
}

/// The worst effective level of `nodes` (`Stopped` for none).
pub fn worst(nodes: &[HealthNode]) -> Level {
    nodes
        .iter()
        .map(|n| n.status.level)
        .max()
        .unwrap_or(Level::Stopped)
}

/// The nearest existing proper ancestor of a dotted path.
fn parent_of(path: &str, index: &HashMap<&str, usize>) -> Option<usize> {
    let mut p = path;
    while let Some((head, _)) = p.rsplit_once('.') {
        if let Some(&i) = index.get(head) {
            return Some(i);
        }
        p = head;
    }
    None
}

fn build(i: usize, paths: &[(&String, &NodeState)], children: &[Vec<usize>]) -> HealthNode {
    let (path, state) = paths[i];
    let kids: Vec<HealthNode> = children[i]
        .iter()
        .map(|&c| build(c, paths, children))
        .collect();
    let mut status = state.own.clone();
    for kid in &kids {
        if kid.status.since > status.since {
            status.since = kid.status.since;
        }
        if kid.status.level > status.level {
            status.level = kid.status.level;
            status.message = worst_message(kid);
        }
    }
    HealthNode {
        id: path.clone(),
        status,
        children: kids,
    }
}

/// `<id>: <message>` of the deepest node carrying the node's effective level.
fn worst_message(node: &HealthNode) -> String {
    node.children
        .iter()
        .find(|c| c.status.level == node.status.level)
        .map(worst_message)
        .unwrap_or_else(|| format!("{}: {}", node.id, node.status.message))
}

/// Reports the health of one node. A `Reporter` dependency is scoped to the
/// consuming module (its node is the module's full id); jobs get one for their
/// own node in their [`JobContext`](crate::JobContext).
///
/// Report `Ok` once the work has stabilized (after the first successful
/// reconcile, say), not in the constructor. Trap: taking a `Reporter` is a
/// promise to report: a started module that took one and has not reported is
/// shown `Unknown("started; no report yet")`, not OK. A module that takes none
/// is shown `Ok("started")` once its start hooks succeed.
#[derive(Clone)]
pub struct Reporter {
    health: Health,
    path: Arc<str>,
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter").field("id", &self.path).finish()
    }
}

impl Reporter {
    /// The node's full id.
    pub fn id(&self) -> &str {
        &self.path
    }

    /// Reports that the node works as intended.
    pub fn ok(&self, message: impl fmt::Display) {
        self.health
            .set(&self.path, Level::Ok, message.to_string(), true);
    }

    /// Reports that the node works badly; pass the error or the reason.
    pub fn degraded(&self, message: impl fmt::Display) {
        self.health
            .set(&self.path, Level::Degraded, message.to_string(), true);
    }

    /// Reports that the node is not running.
    pub fn stopped(&self, message: impl fmt::Display) {
        self.health
            .set(&self.path, Level::Stopped, message.to_string(), true);
    }

    /// A reporter for a child node `<id>.<name>`, created on its first report.
    /// Use one per independently failing part (a peer, a table, a worker).
    pub fn child(&self, name: &str) -> Reporter {
        Reporter {
            health: self.health.clone(),
            path: Arc::from(format!("{}.{}", self.path, name)),
        }
    }

    /// Removes the node and its children from the tree, for parts that are gone
    /// for good (a deleted peer), so they do not pile up as `Stopped`.
    pub fn remove(&self) {
        self.health.remove(&self.path);
    }

    pub(crate) fn version(&self) -> u64 {
        self.health.version(&self.path)
    }

    pub(crate) fn set_internal(&self, level: Level, message: impl fmt::Display) {
        self.health
            .set(&self.path, level, message.to_string(), false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_nests_by_path_and_keeps_creation_order() {
        let h = Health::new();
        h.set("cp", Level::Stopped, "not started".into(), false);
        h.set("cp.ipam", Level::Stopped, "not started".into(), false);
        h.set("cp.api", Level::Stopped, "not started".into(), false);
        h.set("loader", Level::Stopped, "not started".into(), false);
        let tree = h.tree();
        assert_eq!(tree.len(), 2);
        assert_eq!(tree[0].id, "cp");
        assert_eq!(tree[1].id, "loader");
        let kids: Vec<_> = tree[0].children.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(kids, ["cp.ipam", "cp.api"]);
    }

    #[test]
    fn effective_level_is_the_worst_with_the_culprit_in_the_message() {
        let h = Health::new();
        h.set("cp", Level::Ok, "started".into(), false);
        h.set("cp.ipam", Level::Ok, "started".into(), false);
        let r = h.reporter("cp.ipam").child("restore");
        r.degraded("state dir unreadable");
        let cp = h.node("cp").unwrap();
        assert_eq!(cp.status.level, Level::Degraded);
        assert_eq!(cp.status.message, "cp.ipam.restore: state dir unreadable");
        let since = h.node("cp.ipam.restore").unwrap().status.since;
        assert_eq!(cp.status.since, since, "since is the latest change below");
        assert_eq!(h.level(), Level::Degraded);
        r.ok("restored 3 endpoints");
        assert_eq!(h.node("cp").unwrap().status.level, Level::Ok);
        assert_eq!(h.node("cp").unwrap().status.message, "started");
    }

    #[test]
    fn unknown_ranks_above_ok_and_below_degraded() {
        assert!(Level::Stopped < Level::Ok);
        assert!(Level::Ok < Level::Unknown);
        assert!(Level::Unknown < Level::Degraded);
        let h = Health::new();
        h.set("m", Level::Ok, "started".into(), false);
        h.set("m.a", Level::Ok, "fine".into(), false);
        h.set(
            "m.b",
            Level::Unknown,
            "waiting for the first run".into(),
            false,
        );
        let m = h.node("m").unwrap();
        assert_eq!(m.status.level, Level::Unknown, "an unknown part is not OK");
        assert_eq!(m.status.message, "m.b: waiting for the first run");
        assert_eq!(h.level(), Level::Unknown);
        h.reporter("m.a").degraded("disk full");
        let m = h.node("m").unwrap();
        assert_eq!(
            m.status.level,
            Level::Degraded,
            "a known problem outranks it"
        );
        assert_eq!(m.status.message, "m.a: disk full");
        assert_eq!(Level::Unknown.to_string(), "Unknown");
    }

    #[test]
    fn a_started_module_that_took_a_reporter_is_unknown_until_it_reports() {
        let h = Health::new();
        for m in ["quiet", "promised"] {
            h.set(m, Level::Stopped, "not started".into(), false);
        }
        h.expect_report("promised");
        h.mark_started("quiet");
        h.mark_started("promised");
        let status = |id: &str| {
            let n = h.node(id).unwrap();
            (n.status.level, n.status.message)
        };
        assert_eq!(status("quiet"), (Level::Ok, "started".into()));
        assert_eq!(
            status("promised"),
            (Level::Unknown, "started; no report yet".into())
        );
        h.reporter("promised").ok("3 pools");
        h.mark_started("promised");
        assert_eq!(status("promised"), (Level::Ok, "3 pools".into()));
    }

    #[test]
    fn a_stopped_child_does_not_stop_a_running_parent() {
        let h = Health::new();
        h.set("m", Level::Ok, "started".into(), false);
        h.reporter("m").child("watch").stopped("stream ended");
        assert_eq!(h.node("m").unwrap().status.level, Level::Ok);
        h.set("m", Level::Stopped, "stopped".into(), false);
        assert_eq!(h.node("m").unwrap().status.level, Level::Stopped);
    }

    #[test]
    fn started_only_fills_modules_that_said_nothing() {
        let h = Health::new();
        h.set("a", Level::Stopped, "not started".into(), false);
        h.set("b", Level::Stopped, "not started".into(), false);
        h.reporter("b").degraded("no peers");
        h.mark_started("a");
        h.mark_started("b");
        assert_eq!(h.node("a").unwrap().status.message, "started");
        assert_eq!(h.node("b").unwrap().status.level, Level::Degraded);
        h.stop_all("stopped");
        assert_eq!(h.node("b").unwrap().status.level, Level::Stopped);
    }

    #[test]
    fn remove_drops_the_sub_tree_and_subscribers_see_changes() {
        let h = Health::new();
        let mut rx = h.subscribe();
        let before = *rx.borrow_and_update();
        h.set("m", Level::Ok, "x".into(), false);
        h.reporter("m").child("job").ok("running");
        h.reporter("m").child("job").child("part").ok("fine");
        h.reporter("m").child("jobx").ok("fine");
        assert!(rx.has_changed().unwrap());
        assert!(*rx.borrow_and_update() > before);
        h.reporter("m").child("job").remove();
        assert!(h.node("m.job").is_none());
        assert!(h.node("m.job.part").is_none());
        assert!(
            h.node("m.jobx").is_some(),
            "a sibling with the same prefix stays"
        );
    }

    #[test]
    fn render_indents_children() {
        let h = Health::new();
        h.set("a", Level::Ok, "started".into(), false);
        h.set("a.b", Level::Ok, "fine".into(), false);
        assert_eq!(h.render(), "a OK: started\n  a.b OK: fine\n");
    }
}

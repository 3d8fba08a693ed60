//! Truth tables: every flow of a scenario (source place, destination place, probe) with its
//! expected verdict, probed for real, and a report of every difference.
//!
//! The flows are every ordered pair of [`Place`]s with at least one pod among them (the node
//! and the external network reach each other without the datapath, so those pairs say nothing
//! about policy), times every probe of the scenario. The probes run concurrently; a dropped
//! probe costs its whole deadline, so a table of a few hundred flows takes seconds.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::netns::NetNs;
use crate::reach::{self, Outcome, Probe};

/// How long a probe waits for each step; a dropped flow costs this much.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// How many probes run at once.
const WORKERS: usize = 48;

/// What a place is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceKind {
    /// A pod (named `namespace/name`).
    Pod,
    /// The node itself (named `node`).
    Node,
    /// An address of the external network (named `ext-a`, `ext-b`).
    External,
}

/// A place traffic comes from or goes to.
#[derive(Debug, Clone)]
pub struct Place {
    /// `namespace/name` for a pod, `node`, or the external address's name.
    pub name: String,
    /// What it is.
    pub kind: PlaceKind,
    /// The network namespace probes from it run in.
    pub netns: String,
    /// Its address: where probes to it go, and the source of probes from it.
    pub ip: Ipv4Addr,
}

impl Place {
    /// Whether this is the place named `name`.
    pub fn is(&self, name: &str) -> bool {
        self.name == name
    }

    /// The Kubernetes namespace of a pod.
    pub fn namespace(&self) -> Option<&str> {
        match self.kind {
            PlaceKind::Pod => self.name.split_once('/').map(|(ns, _)| ns),
            _ => None,
        }
    }

    /// Whether this is a pod of namespace `ns`.
    pub fn in_ns(&self, ns: &str) -> bool {
        self.namespace() == Some(ns)
    }

    /// Whether this is a pod.
    pub fn is_pod(&self) -> bool {
        self.kind == PlaceKind::Pod
    }

    /// Whether this is the node.
    pub fn is_node(&self) -> bool {
        self.kind == PlaceKind::Node
    }

    /// Whether this is an external address.
    pub fn is_external(&self) -> bool {
        self.kind == PlaceKind::External
    }
}

/// One flow of a table.
#[derive(Debug, Clone, Copy)]
pub struct Flow<'a> {
    /// Where it starts.
    pub from: &'a Place,
    /// Where it goes.
    pub to: &'a Place,
    /// What is sent.
    pub probe: Probe,
}

/// A probed table: each flow with its expected verdict and what happened.
#[derive(Debug)]
pub struct Table {
    /// The scenario's name.
    pub scenario: String,
    /// The probes, in column order.
    pub probes: Vec<Probe>,
    /// (from, to, probe, expected answered, outcome), in row order.
    pub rows: Vec<(String, String, Probe, bool, Outcome)>,
}

/// Every flow between `places` for `probes`: ordered pairs of distinct places with at least
/// one pod.
pub fn flows<'a>(places: &'a [Place], probes: &[Probe]) -> Vec<Flow<'a>> {
    let mut out = Vec::new();
    for from in places {
        for to in places {
            if from.name == to.name || !(from.is_pod() || to.is_pod()) {
                continue;
            }
            for &probe in probes {
                out.push(Flow { from, to, probe });
            }
        }
    }
    out
}

/// Probes every flow, concurrently, and records it with its expectation.
pub fn run(
    scenario: &str,
    places: &[Place],
    probes: &[Probe],
    expect: impl Fn(&Flow<'_>) -> bool,
) -> Table {
    let flows = flows(places, probes);
    let outcomes: Vec<Mutex<Option<Outcome>>> = flows.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..WORKERS.min(flows.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(flow) = flows.get(i) else { break };
                    let outcome = probe_flow(flow);
                    if let Ok(mut slot) = outcomes[i].lock() {
                        *slot = Some(outcome);
                    }
                }
            });
        }
    });
    let rows = flows
        .iter()
        .zip(outcomes)
        .map(|(f, o)| {
            let outcome = o
                .into_inner()
                .ok()
                .flatten()
                .unwrap_or_else(|| Outcome::Failed("not probed".into()));
            (
                f.from.name.clone(),
                f.to.name.clone(),
                f.probe,
                expect(f),
                outcome,
            )
        })
        .collect();
    Table {
        scenario: scenario.to_string(),
        probes: probes.to_vec(),
        rows,
    }
}

/// Probes one flow. Probes from the external network choose their source address (it holds
/// several); pods and the node let the kernel choose, as their applications would.
pub fn probe_flow(flow: &Flow<'_>) -> Outcome {
    let src = flow.from.is_external().then_some(flow.from.ip);
    let ns = NetNs::existing(&flow.from.netns);
    reach::probe(&ns, src, flow.to.ip, flow.probe, PROBE_TIMEOUT)
        .unwrap_or_else(|e| Outcome::Failed(e.to_string()))
}

impl Table {
    /// The flows whose outcome is not the expected one.
    pub fn differences(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|(_, _, _, want, got)| !matches(*want, got))
            .map(|(from, to, probe, want, got)| {
                format!(
                    "{from} -> {to} {probe}: expected {}, got {got}",
                    if *want { "answered" } else { "dropped" }
                )
            })
            .collect()
    }

    /// Panics with the whole table and every difference unless every flow is as expected.
    #[track_caller]
    pub fn assert(&self) {
        let diffs = self.differences();
        if !diffs.is_empty() {
            panic!(
                "{}\n{} of {} flows differ:\n  {}",
                self.render(),
                diffs.len(),
                self.rows.len(),
                diffs.join("\n  ")
            );
        }
    }

    /// The table as text: a row per (from, to), a column per probe; `ok` answered, `--`
    /// dropped, `!` before a cell that differs from the expectation (`!ok` should have been
    /// dropped, `!--` should have answered), other outcomes spelt out.
    pub fn render(&self) -> String {
        let mut out = format!("truth table \"{}\"\n", self.scenario);
        let width = self
            .rows
            .iter()
            .map(|(f, t, ..)| f.len() + t.len() + 4)
            .max()
            .unwrap_or(10);
        let _ = write!(out, "  {:width$}", "FROM -> TO");
        for p in &self.probes {
            let _ = write!(out, " {:>9}", p.to_string());
        }
        out.push('\n');
        for row in self.rows.chunks(self.probes.len().max(1)) {
            let (from, to, ..) = &row[0];
            let _ = write!(out, "  {:width$}", format!("{from} -> {to}"));
            for (_, _, _, want, got) in row {
                let cell = match got {
                    Outcome::Answered => "ok".to_string(),
                    Outcome::Dropped => "--".to_string(),
                    Outcome::Refused => "refused".to_string(),
                    Outcome::Failed(_) => "failed".to_string(),
                };
                let mark = if matches(*want, got) { "" } else { "!" };
                let _ = write!(out, " {:>9}", format!("{mark}{cell}"));
            }
            out.push('\n');
        }
        out
    }
}

fn matches(want: bool, got: &Outcome) -> bool {
    match got {
        Outcome::Answered => want,
        Outcome::Dropped => !want,
        Outcome::Refused | Outcome::Failed(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(name: &str, kind: PlaceKind) -> Place {
        Place {
            name: name.into(),
            kind,
            netns: "x".into(),
            ip: Ipv4Addr::LOCALHOST,
        }
    }

    #[test]
    fn flows_pair_every_place_with_a_pod_and_render_differences() {
        let places = [
            place("a/x", PlaceKind::Pod),
            place("b/y", PlaceKind::Pod),
            place("node", PlaceKind::Node),
            place("ext-a", PlaceKind::External),
        ];
        let probes = [Probe::Tcp(80), Probe::Icmp];
        let all = flows(&places, &probes);
        // 2 pods * 3 others * 2 directions, less the pod-pod pair counted twice: 10 pairs.
        assert_eq!(all.len(), 10 * 2);
        assert!(!all.iter().any(|f| f.from.is_node() && f.to.is_external()));
        assert_eq!(places[0].namespace(), Some("a"));
        assert_eq!(places[2].namespace(), None);

        let table = Table {
            scenario: "s".into(),
            probes: probes.to_vec(),
            rows: vec![
                (
                    "a/x".into(),
                    "b/y".into(),
                    Probe::Tcp(80),
                    true,
                    Outcome::Answered,
                ),
                (
                    "a/x".into(),
                    "b/y".into(),
                    Probe::Icmp,
                    true,
                    Outcome::Dropped,
                ),
            ],
        };
        assert_eq!(
            table.differences(),
            vec!["a/x -> b/y icmp: expected answered, got dropped"]
        );
        let text = table.render();
        assert!(
            text.contains("a/x -> b/y") && text.contains("!--"),
            "{text}"
        );
    }
}

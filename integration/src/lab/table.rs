//! Truth tables: every flow of a scenario (source place, destination place, probe) with its
//! expected verdict, probed for real, and a report of every difference.
//!
//! The flows are every ordered pair of [`Place`]s with at least one pod among them (the node
//! and the external network reach each other without the datapath, so those pairs say nothing
//! about policy), in every family both places have an address of, times every probe of the
//! scenario. The probes run concurrently; a dropped probe costs its whole deadline, so a table
//! of a few hundred flows takes seconds.

use std::fmt;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::netns::NetNs;
use crate::reach::{self, Outcome, Probe};

/// How long a probe waits for each step; a dropped flow costs this much.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// How many probes run at once: a dropped probe mostly waits, so many can.
const WORKERS: usize = 96;

/// The address family of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl Family {
    /// Both, IPv4 first.
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        })
    }
}

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
    /// Its IPv4 address: where probes to it go, and the source of probes from it.
    pub ip: Ipv4Addr,
    /// Its IPv6 address, if it has one (a dual-stack lab).
    pub ip6: Option<Ipv6Addr>,
}

impl Place {
    /// Its address of `family`, if it has one.
    pub fn addr(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::Ipv4 => Some(self.ip.into()),
            Family::Ipv6 => self.ip6.map(IpAddr::from),
        }
    }

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
    /// In which family.
    pub family: Family,
}

impl Flow<'_> {
    /// Whether the flow is IPv6.
    pub fn v6(&self) -> bool {
        self.family == Family::Ipv6
    }
}

/// One probed flow of a table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Where it started.
    pub from: String,
    /// Where it went.
    pub to: String,
    /// In which family.
    pub family: Family,
    /// What was sent.
    pub probe: Probe,
    /// Whether it was expected to be answered.
    pub expected: bool,
    /// What happened.
    pub outcome: Outcome,
}

/// A probed table: each flow with its expected verdict and what happened.
#[derive(Debug)]
pub struct Table {
    /// The scenario's name.
    pub scenario: String,
    /// The probes, in column order.
    pub probes: Vec<Probe>,
    /// The flows, in row order: by family, then source and destination, then probe.
    pub rows: Vec<Row>,
}

/// Every flow between `places` for `probes`: ordered pairs of distinct places with at least
/// one pod, in each family both have an address of.
pub fn flows<'a>(places: &'a [Place], probes: &[Probe]) -> Vec<Flow<'a>> {
    let mut out = Vec::new();
    for family in Family::ALL {
        for from in places {
            for to in places {
                if from.name == to.name || !(from.is_pod() || to.is_pod()) {
                    continue;
                }
                if from.addr(family).is_none() || to.addr(family).is_none() {
                    continue;
                }
                for &probe in probes {
                    out.push(Flow {
                        from,
                        to,
                        probe,
                        family,
                    });
                }
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
            Row {
                from: f.from.name.clone(),
                to: f.to.name.clone(),
                family: f.family,
                probe: f.probe,
                expected: expect(f),
                outcome,
            }
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
    let src = flow
        .from
        .is_external()
        .then(|| flow.from.addr(flow.family))
        .flatten();
    let Some(dst) = flow.to.addr(flow.family) else {
        return Outcome::Failed(format!("{} has no {} address", flow.to.name, flow.family));
    };
    let ns = NetNs::existing(&flow.from.netns);
    reach::probe(&ns, src, dst, flow.probe, PROBE_TIMEOUT)
        .unwrap_or_else(|e| Outcome::Failed(e.to_string()))
}

/// `a -> b`, with the family when it is IPv6.
fn pair(row: &Row) -> String {
    match row.family {
        Family::Ipv4 => format!("{} -> {}", row.from, row.to),
        Family::Ipv6 => format!("{} -> {} (IPv6)", row.from, row.to),
    }
}

impl Table {
    /// The flows whose outcome is not the expected one.
    pub fn differences(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|r| !matches(r.expected, &r.outcome))
            .map(|r| {
                format!(
                    "{} {}: expected {}, got {}",
                    pair(r),
                    r.probe,
                    if r.expected { "answered" } else { "dropped" },
                    r.outcome
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
        let width = self.rows.iter().map(|r| pair(r).len()).max().unwrap_or(10);
        let _ = write!(out, "  {:width$}", "FROM -> TO");
        for p in &self.probes {
            let _ = write!(out, " {:>9}", p.to_string());
        }
        out.push('\n');
        for row in self.rows.chunks(self.probes.len().max(1)) {
            let _ = write!(out, "  {:width$}", pair(&row[0]));
            for r in row {
                let (want, got) = (r.expected, &r.outcome);
                let cell = match got {
                    Outcome::Answered => "ok".to_string(),
                    Outcome::Dropped => "--".to_string(),
                    Outcome::Refused => "refused".to_string(),
                    Outcome::Failed(_) => "failed".to_string(),
                };
                let mark = if matches(want, got) { "" } else { "!" };
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
            ip6: None,
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
        // With IPv6 for the pods and the node, their 6 pairs again in IPv6.
        let mut dual = places.clone();
        for p in dual.iter_mut().take(3) {
            p.ip6 = Some(Ipv6Addr::LOCALHOST);
        }
        let both = flows(&dual, &probes);
        assert_eq!(both.len(), (10 + 6) * 2);
        assert!(both[20..].iter().all(|f| f.v6() && !f.to.is_external()));
        assert!(!all.iter().any(|f| f.from.is_node() && f.to.is_external()));
        assert_eq!(places[0].namespace(), Some("a"));
        assert_eq!(places[2].namespace(), None);

        let table = Table {
            scenario: "s".into(),
            probes: probes.to_vec(),
            rows: vec![
                Row {
                    from: "a/x".into(),
                    to: "b/y".into(),
                    family: Family::Ipv6,
                    probe: Probe::Tcp(80),
                    expected: true,
                    outcome: Outcome::Answered,
                },
                Row {
                    from: "a/x".into(),
                    to: "b/y".into(),
                    family: Family::Ipv6,
                    probe: Probe::Icmp,
                    expected: true,
                    outcome: Outcome::Dropped,
                },
            ],
        };
        assert_eq!(
            table.differences(),
            vec!["a/x -> b/y (IPv6) icmp: expected answered, got dropped"]
        );
        let text = table.render();
        assert!(
            text.contains("a/x -> b/y") && text.contains("!--"),
            "{text}"
        );
    }
}

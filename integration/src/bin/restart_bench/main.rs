//! `cellium-restart-bench`: how fast an agent restart gives back every endpoint, and what a
//! live TCP stream loses across it (root; see `integration/bench/restart.sh` and
//! docs/performance.md, "Restart").
//!
//! A real agent with `--pods` endpoints (real pods through `cellium-cni`, one identity each)
//! and `--policies` NetworkPolicies of two rules each (the policy benchmark's cluster), with
//! traffic between pods ([`traffic`]), is restarted `--rounds` times each way: SIGTERM (its
//! exit waited for) and SIGKILL. Each restart is timed from the exec of the new process until
//! every endpoint is restored and enforcing ([`restart`]), and the traffic is read over the
//! window from the signal until a second after that: TCP retransmissions in the pods'
//! namespaces, packets the datapath dropped, the stream's longest delay and gap, and new
//! connections refused.
//!
//! Baseline, restarted the same way just before each: an agent of its own with no endpoint
//! (an empty state directory, its maps pinned), timed from exec until its API answers with
//! its empty endpoint list.
//!
//! The last line is `RESULT restart ready_1000_ms=<median of the slower way>
//! lost_packets=<over every restart>`.

mod counters;
mod restart;
mod traffic;

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_integration::bench::{self, Api, BenchPod, Shape, median, ms, watch_signals};
use cellium_integration::{Agent, AgentOptions, NetNs};
use clap::Parser;

use crate::counters::TcpCounters;
use crate::restart::{Ending, Timeline, restart};
use crate::traffic::{Roles, Traffic, Window};

/// Measures agent restarts at scale.
#[derive(Debug, Parser)]
#[command(name = "cellium-restart-bench")]
struct Cli {
    #[command(flatten)]
    shape: Shape,
    /// Restarts of each kind (SIGTERM, SIGKILL).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// How long the traffic is watched after every endpoint is back (ms).
    #[arg(long, default_value_t = 1000)]
    after_ms: u64,
}

/// One restart of the agent with endpoints, and what the traffic saw.
#[derive(Debug)]
struct Sample {
    ending: Ending,
    timeline: Timeline,
    baseline: Timeline,
    retransmits: u64,
    /// What the TCP counters of the stream's pods that grew say, per pod.
    why: Vec<String>,
    drops: u64,
    traffic: Window,
}

impl Sample {
    fn lost(&self) -> u64 {
        self.retransmits + self.drops
    }
}

/// The cluster's agent, its pods and the counters read across a restart.
struct Node {
    agent: Agent,
    pods: Vec<BenchPod>,
    roles: Roles,
}

impl Node {
    /// The TCP counters of the namespaces of the stream's sender and receiver (what is
    /// counted as lost), then of the prober and its target (shown, not counted: their
    /// connections are opened and closed all the time).
    fn tcp(&self) -> Result<[TcpCounters; 4]> {
        let r = self.roles;
        let read = |i: usize| TcpCounters::read(&self.pods[i].netns);
        Ok([
            read(r.sender)?,
            read(r.receiver)?,
            read(r.prober)?,
            read(r.target)?,
        ])
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    watch_signals()?;
    let shape = cli.shape;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    let mut baseline = Agent::start_new(AgentOptions::default()).context("the baseline agent")?;
    let mut node = cluster(shape, &runtime)?;
    let roles = node.roles;
    let pod = |i: usize| &node.pods[i];
    eprintln!(
        "stream {} -> {}, new connections {} -> {}",
        pod(roles.sender).key,
        pod(roles.receiver).key,
        pod(roles.prober).key,
        pod(roles.target).key
    );
    let at = |i: usize| SocketAddrV4::new(pod(i).ip, traffic::PORT);
    let flows = Traffic::start(
        (&pod(roles.sender).netns, at(roles.receiver)),
        (&pod(roles.prober).netns, at(roles.target)),
        (&pod(roles.receiver).netns, &pod(roles.target).netns),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let warm = flows.window(Duration::ZERO, flows.now());
    if warm.sent == 0 || warm.connects == 0 || warm.refused > 0 {
        bail!("the traffic does not flow before any restart: {warm:?}");
    }

    let mut samples = Vec::new();
    for round in 0..cli.rounds {
        for ending in [Ending::Term, Ending::Kill] {
            bench::interrupted()?;
            let base = restart(&mut baseline, ending, 0, &runtime)?;
            let (tcp, drops) = (node.tcp()?, node.agent.datapath_drops()?);
            let from = flows.now();
            let timeline = restart(&mut node.agent, ending, shape.pods, &runtime)?;
            std::thread::sleep(Duration::from_millis(cli.after_ms));
            let window = flows.window(from, flows.now());
            let after = node.tcp()?;
            let mut why = Vec::new();
            let pods = [
                "sender",
                "receiver",
                "prober (not counted)",
                "target (not counted)",
            ];
            for (pod, (now, then)) in pods.iter().zip(after.iter().zip(&tcp)) {
                let grown = now.grown_since(then);
                if !grown.is_empty() {
                    why.push(format!("{pod}: {}", grown.join(", ")));
                }
            }
            let sample = Sample {
                ending,
                baseline: base,
                retransmits: after[..2]
                    .iter()
                    .zip(&tcp[..2])
                    .map(|(now, then)| now.retransmitted().saturating_sub(then.retransmitted()))
                    .sum(),
                why,
                drops: node.agent.datapath_drops()?.saturating_sub(drops),
                traffic: window,
                timeline,
            };
            eprintln!(
                "round {round} {ending}: restored in {:.0} ms (API at {:.0} ms; stop {:.0} ms), baseline {:.0} ms; {} retransmits, {} drops, stream delay max {:.1} ms, {} of {} new connections refused",
                ms(sample.timeline.ready),
                ms(sample.timeline.api),
                ms(sample.timeline.stop),
                ms(sample.baseline.ready),
                sample.retransmits,
                sample.drops,
                ms(sample.traffic.max_delay),
                sample.traffic.refused,
                sample.traffic.connects
            );
            eprintln!("  restore: {}", sample.timeline.phases);
            if !sample.why.is_empty() {
                eprintln!("  TCP counters: {}", sample.why.join("; "));
            }
            check_after(&node, &runtime)?;
            samples.push(sample);
        }
    }
    let records = flows.finish()?;
    report(&samples, shape, records);
    Ok(())
}

/// The agent with the cluster of `shape` and the traffic's objects, every pod created and
/// every endpoint enforcing.
fn cluster(shape: Shape, runtime: &tokio::runtime::Runtime) -> Result<Node> {
    let opts = AgentOptions {
        pod_cidrs: vec!["10.244.0.0/20".into()],
        ..AgentOptions::default()
    };
    let agent = Agent::start_new(opts).context("starting the agent")?;
    for yaml in [
        shape.namespaces_yaml(),
        shape.pods_yaml(),
        shape.policies_yaml(),
    ] {
        agent.objects("apply", &yaml)?;
    }
    eprintln!("creating {} pods through cellium-cni ...", shape.pods);
    let began = Instant::now();
    let pods = bench::create_pods(&agent, shape)?;
    eprintln!("... in {:.1} s", began.elapsed().as_secs_f64());
    let roles = runtime.block_on(async {
        let mut api = Api::connect(&agent.socket()).await?;
        let listed = api
            .endpoints
            .list(cellium_api::v1::ListEndpointsRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("Endpoints.List: {}", s.message()))?
            .into_inner()
            .endpoints;
        // The restore reads the records in the order of their file names, `<id>.json`.
        let mut files: Vec<(String, String)> = listed
            .iter()
            .map(|e| {
                (
                    format!("{}.json", e.id),
                    format!("{}/{}", e.pod_namespace, e.pod_name),
                )
            })
            .collect();
        files.sort();
        let order: BTreeMap<&str, usize> = files
            .iter()
            .enumerate()
            .map(|(k, (_, pod))| (pod.as_str(), k))
            .collect();
        Roles::choose(shape, |i| {
            order
                .get(pods[i].key.as_str())
                .copied()
                .unwrap_or(usize::MAX)
        })
    })?;
    agent.objects("apply", &roles.yaml(shape))?;
    runtime.block_on(async {
        let mut api = Api::connect(&agent.socket()).await?;
        let began = Instant::now();
        loop {
            bench::interrupted()?;
            let seen = api.enforced().await?;
            if seen.all_at(shape.pods, api.revision().await?) {
                return anyhow::Ok(());
            }
            if began.elapsed() > Duration::from_secs(60) {
                bail!("the endpoints do not settle: {seen:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })?;
    Ok(Node { agent, pods, roles })
}

/// After a restart: every module healthy, and the receiver's policy still refuses a pod it
/// does not admit.
fn check_after(node: &Node, runtime: &tokio::runtime::Runtime) -> Result<()> {
    let unhealthy = runtime.block_on(async {
        let mut api = Api::connect(&node.agent.socket()).await?;
        api.unhealthy().await
    })?;
    if !unhealthy.is_empty() {
        bail!("after the restart: {}", unhealthy.join(" | "));
    }
    let to = SocketAddrV4::new(node.pods[node.roles.receiver].ip, traffic::PORT);
    let denied: &NetNs = &node.pods[node.roles.denied].netns;
    if cellium_integration::probe::tcp_connect(denied, to, Duration::from_millis(300)).is_ok() {
        bail!(
            "after the restart, {} reached {to}, which its policy refuses",
            node.pods[node.roles.denied].key
        );
    }
    Ok(())
}

fn report(samples: &[Sample], shape: Shape, records: u64) {
    println!(
        "restart: {} endpoints, {} rules, {} records streamed",
        shape.pods,
        shape.policies * 2,
        records
    );
    let mut slowest = Duration::ZERO;
    for ending in [Ending::Term, Ending::Kill] {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.ending == ending).collect();
        let pick =
            |f: fn(&Sample) -> Duration| median(&of.iter().map(|s| f(s)).collect::<Vec<_>>());
        let (ready, api, base) = (
            pick(|s| s.timeline.ready),
            pick(|s| s.timeline.api),
            pick(|s| s.baseline.ready),
        );
        slowest = slowest.max(ready);
        let max = |f: fn(&Sample) -> Duration| of.iter().map(|s| f(s)).max().unwrap_or_default();
        println!(
            "  {ending}: exec to every endpoint restored and enforcing: median {:.1} ms (min {:.1}, max {:.1}) over {}; the API first answered at {:.1} ms",
            ms(ready),
            ms(of
                .iter()
                .map(|s| s.timeline.ready)
                .min()
                .unwrap_or_default()),
            ms(max(|s| s.timeline.ready)),
            of.len(),
            ms(api)
        );
        println!(
            "    baseline (no endpoint): {:.1} ms; ratio {:.2}x; stop took {:.1} ms",
            ms(base),
            ready.as_secs_f64() / base.as_secs_f64().max(1e-9),
            ms(pick(|s| s.timeline.stop))
        );
        println!(
            "    lost: {} TCP retransmits, {} datapath drops; stream: longest delay {:.1} ms, longest gap {:.1} ms; new connections refused {} of {}",
            of.iter().map(|s| s.retransmits).sum::<u64>(),
            of.iter().map(|s| s.drops).sum::<u64>(),
            ms(max(|s| s.traffic.max_delay)),
            ms(max(|s| s.traffic.max_gap)),
            of.iter().map(|s| s.traffic.refused).sum::<usize>(),
            of.iter().map(|s| s.traffic.connects).sum::<usize>()
        );
        hooks(&of);
    }
    let lost: u64 = samples.iter().map(Sample::lost).sum();
    println!(
        "RESULT restart ready_{}_ms={:.1} lost_packets={lost}",
        shape.pods,
        ms(slowest)
    );
}

/// The median of each start hook over the restarts, slowest first, with the baseline's.
fn hooks(of: &[&Sample]) {
    let mut by_hook: BTreeMap<(String, String), (Vec<Duration>, Vec<Duration>)> = BTreeMap::new();
    for s in of {
        for (module, hook, d) in &s.timeline.hooks {
            by_hook
                .entry((module.clone(), hook.clone()))
                .or_default()
                .0
                .push(*d);
        }
        for (module, hook, d) in &s.baseline.hooks {
            by_hook
                .entry((module.clone(), hook.clone()))
                .or_default()
                .1
                .push(*d);
        }
    }
    let mut rows: Vec<_> = by_hook
        .into_iter()
        .map(|(k, (with, without))| (median(&with), median(&without), k))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    let total: Duration = rows.iter().map(|r| r.0).sum();
    println!(
        "    start hooks (median; with endpoints / baseline): {:.1} ms in all",
        ms(total)
    );
    for (with, without, (module, hook)) in rows.iter().filter(|r| r.0 >= Duration::from_millis(1)) {
        println!(
            "      {module} {hook}: {:.1} ms / {:.1} ms",
            ms(*with),
            ms(*without)
        );
    }
}

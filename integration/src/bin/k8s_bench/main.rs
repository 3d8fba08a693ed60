//! `cellium-k8s-bench`: how fast the agent in Kubernetes mode is back from a restart at the
//! scale of a real cluster, and how much memory it holds, against a bare kube-runtime program
//! listing the same kinds (root; see `integration/bench/k8s.sh` and docs/performance.md,
//! "Kubernetes mode").
//!
//! The test API server (`cellium-test-apiserver`), served by this process on a node
//! namespace's loopback, holds the cluster of [`cluster`]: by default 1,000 namespaces,
//! 10,000 pods on 100 nodes (100 on this node), 2,000 NetworkPolicies and 2,000 Services with
//! one EndpointSlice each. The agent (release build, `ipam: kubernetes`) starts once on it and
//! this node's pods are created through `cellium-cni`; then, `--rounds` times:
//!
//! - the agent is stopped (SIGTERM, its exit waited for);
//! - the floor, `cellium-k8s-reflector-floor` (one kube-runtime reflector per kind, exiting
//!   when every store is ready), runs `--floor-runs` times in the same node namespace against
//!   the same server, timed from its exec to its exit (the round's figure is the median), each
//!   time followed by a run with `--dynamic`, the dynamic decoding the agent keeps for Cilium's kinds only (shown, not in the ratio);
//! - the agent is executed again on its state and timed ([`restart`]) from the exec until
//!   every kind is synced and every endpoint of this node is restored and enforcing at the
//!   repository's policy revision; its VmRSS is read then.
//!
//! The last line is `RESULT k8s sync_ms=<median> sync_ratio_vs_reflector=<median / the
//! floor's median> rss_mib=<median>`.

mod cluster;
mod restart;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_integration::bench::{self, Api, median, ms, watch_signals};
use cellium_integration::{Agent, AgentOptions, CniCall, K8sApi, NetNs};
use clap::Parser;

use crate::cluster::{NODE, Shape};
use crate::restart::Timeline;

/// How many CNI ADDs run at once while this node's pods are created.
const PARALLEL_ADDS: usize = 8;

/// How long the floor may take before the benchmark gives up.
const FLOOR_TIMEOUT: Duration = Duration::from_secs(120);

/// Measures the agent's restart in Kubernetes mode at scale.
#[derive(Debug, Parser)]
#[command(name = "cellium-k8s-bench")]
struct Cli {
    /// Namespaces.
    #[arg(long, default_value_t = 1000)]
    namespaces: usize,
    /// Pods in the cluster (one in `--nodes` on this node).
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Nodes (this one included).
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// NetworkPolicies.
    #[arg(long, default_value_t = 2000)]
    policies: usize,
    /// Services, with one EndpointSlice each.
    #[arg(long, default_value_t = 2000)]
    services: usize,
    /// Timed restarts (and floor runs).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Runs of the floor (and of the floor with dynamic decoding) in each round; the
    /// round's figure is their median.
    #[arg(long, default_value_t = 3)]
    floor_runs: usize,
    /// Where to copy the agent's log (every start) when the benchmark ends, for a profile.
    #[arg(long)]
    agent_log: Option<std::path::PathBuf>,
}

/// One round: the floor's run and the agent's restart.
#[derive(Debug)]
struct Sample {
    /// The floor's median over the round's runs.
    floor: Duration,
    floor_rss_kib: u64,
    /// The floor with dynamic decoding (`--dynamic`).
    floor_dynamic: Duration,
    timeline: Timeline,
    rss_kib: u64,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    watch_signals()?;
    let shape = Shape {
        namespaces: cli.namespaces,
        pods: cli.pods,
        nodes: cli.nodes.max(1),
        policies: cli.policies,
        services: cli.services,
    };
    // A worker of its own drives the API clients' connections between the polls too: a
    // connection left idle and undriven is one the agent's API server waits for when it stops
    // (its shutdown is graceful).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;

    let mut agent = Agent::prepare(AgentOptions {
        pod_cidrs: Vec::new(),
        ..AgentOptions::default()
    })
    .context("the node")?;
    let floor_bin = agent.binaries().dir().join("cellium-k8s-reflector-floor");
    if !floor_bin.is_file() {
        bail!(
            "{} is missing: cargo build --release -p cellium-integration --bin cellium-k8s-reflector-floor",
            floor_bin.display()
        );
    }
    // Dropped before the agent: the server stops before its node goes.
    let api = K8sApi::start(agent.node()).context("the API server")?;
    let began = Instant::now();
    let created = shape.create(api.api())?;
    eprintln!(
        "API server {}: {} created in {:.1} s",
        api.url(),
        created
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        began.elapsed().as_secs_f64()
    );
    agent.options_mut().env = api.agent_env(NODE);
    let began = Instant::now();
    agent.start().context("the agent's first start")?;
    eprintln!(
        "the agent's first start: {:.1} s",
        began.elapsed().as_secs_f64()
    );
    let local = shape.local_pods();
    eprintln!(
        "creating this node's {} pods through cellium-cni ...",
        local.len()
    );
    let began = Instant::now();
    let _pods = create_pods(&agent, shape, &local)?;
    eprintln!("... in {:.1} s", began.elapsed().as_secs_f64());
    runtime.block_on(settle(&agent, local.len()))?;

    let mut samples = Vec::new();
    for round in 0..cli.rounds {
        bench::interrupted()?;
        let (status, _) = agent.stop()?;
        if !status.success() {
            bail!("the agent exited with {status} on SIGTERM");
        }
        let (mut floors, mut dynamics) = (Vec::new(), Vec::new());
        let (mut floor_rss_kib, mut objects) = (0, String::new());
        for _ in 0..cli.floor_runs.max(1) {
            let (took, rss, listed) = run_floor(&floor_bin, &agent, &api, false)?;
            floors.push(took);
            floor_rss_kib = floor_rss_kib.max(rss);
            objects = listed;
            let (took, _, listed) = run_floor(&floor_bin, &agent, &api, true)?;
            dynamics.push(took);
            if listed != objects {
                bail!("the floor listed {objects}, with --dynamic {listed}");
            }
        }
        let (floor, floor_dynamic) = (median(&floors), median(&dynamics));
        let timeline = restart::start(&mut agent, local.len(), &runtime)?;
        let rss_kib = bench::rss_kib(agent.pid().context("the agent's pid")?)?;
        if timeline.objects != objects {
            bail!(
                "the agent and the floor listed different objects:\n  agent: {}\n  floor: {objects}",
                timeline.objects
            );
        }
        eprintln!(
            "round {round}: agent {:.0} ms (synced at {:.0} ms, API at {:.0} ms), {:.1} MiB; floor {:.0} ms, {:.1} MiB ({objects}); floor with dynamic decoding {:.0} ms",
            ms(timeline.ready),
            ms(timeline.synced),
            ms(timeline.api),
            rss_kib as f64 / 1024.0,
            ms(floor),
            floor_rss_kib as f64 / 1024.0,
            ms(floor_dynamic),
        );
        eprintln!("  restore: {}", timeline.phases);
        samples.push(Sample {
            floor,
            floor_rss_kib,
            floor_dynamic,
            timeline,
            rss_kib,
        });
    }
    report(&samples, shape, local.len());
    if let Some(path) = &cli.agent_log {
        std::fs::write(path, agent.log()).with_context(|| format!("{}", path.display()))?;
    }
    Ok(())
}

/// Creates this node's pods through the plugin (a network namespace and an ADD naming the pod
/// in `CNI_ARGS` each, a few at a time).
fn create_pods(agent: &Agent, shape: Shape, local: &[usize]) -> Result<Vec<NetNs>> {
    let mut pods = Vec::with_capacity(local.len());
    let mut running = std::collections::VecDeque::new();
    for &i in local {
        bench::interrupted()?;
        let ns = NetNs::new()?;
        let (namespace, name) = shape.pod(i);
        let call = CniCall::new("ADD", &format!("k8sbench{i}x{}", std::process::id()))
            .netns(ns.path())
            .args(&format!(
                "K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
            ));
        if running.len() >= PARALLEL_ADDS
            && let Some(p) = running.pop_front()
        {
            bench::pods::wait_add(p)?;
        }
        running.push_back(agent.spawn_cni(&call)?);
        pods.push(ns);
    }
    for p in running {
        bench::pods::wait_add(p)?;
    }
    Ok(pods)
}

/// Waits until the `n` endpoints enforce the repository's revision.
async fn settle(agent: &Agent, n: usize) -> Result<()> {
    let mut api = Api::connect(&agent.socket()).await?;
    let began = Instant::now();
    loop {
        bench::interrupted()?;
        let seen = api.enforced().await?;
        if seen.all_at(n, api.revision().await?) {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(120) {
            bail!("the endpoints do not settle: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the floor in the node namespace (`--dynamic` if `dynamic`); returns how long from
/// exec to exit, its RSS (KiB) and the objects it listed.
fn run_floor(
    bin: &std::path::Path,
    agent: &Agent,
    api: &K8sApi,
    dynamic: bool,
) -> Result<(Duration, u64, String)> {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", agent.node().path().display()))
        .arg("--")
        .arg(bin)
        .arg("--server")
        .arg(api.url())
        .arg("--node")
        .arg(NODE)
        .args(dynamic.then_some("--dynamic"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let launched = Instant::now();
    let mut child = cmd.spawn().context("the floor")?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if bench::interrupted().is_err() || launched.elapsed() > FLOOR_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bench::interrupted()?;
            bail!("the floor did not finish within {FLOOR_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    let took = launched.elapsed();
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !status.success() {
        bail!(
            "the floor failed ({status}): {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = stdout.lines().last().unwrap_or_default();
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let rss = field("rss_kib=").unwrap_or_default();
    let objects = line
        .strip_prefix("objects ")
        .and_then(|l| l.split(" rss_kib=").next())
        .unwrap_or(line)
        .to_string();
    Ok((took, rss, objects))
}

fn report(samples: &[Sample], shape: Shape, local: usize) {
    let pick = |f: fn(&Sample) -> Duration| median(&samples.iter().map(f).collect::<Vec<_>>());
    let min = |f: fn(&Sample) -> Duration| samples.iter().map(f).min().unwrap_or_default();
    let max = |f: fn(&Sample) -> Duration| samples.iter().map(f).max().unwrap_or_default();
    let kib = |f: fn(&Sample) -> u64| {
        let mut v: Vec<u64> = samples.iter().map(f).collect();
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    println!(
        "k8s: {} namespaces, {} pods on {} nodes ({local} on this node), {} NetworkPolicies, {} Services with an EndpointSlice each; {} rounds",
        shape.namespaces,
        shape.pods,
        shape.nodes,
        shape.policies,
        shape.services,
        samples.len()
    );
    let ready = pick(|s| s.timeline.ready);
    let floor = pick(|s| s.floor);
    let ratio = ready.as_secs_f64() / floor.as_secs_f64().max(1e-9);
    println!(
        "  agent restart, exec to every kind synced and every endpoint enforcing: median {:.1} ms (min {:.1}, max {:.1}); every kind synced at {:.1} ms, API first answered at {:.1} ms",
        ms(ready),
        ms(min(|s| s.timeline.ready)),
        ms(max(|s| s.timeline.ready)),
        ms(pick(|s| s.timeline.synced)),
        ms(pick(|s| s.timeline.api)),
    );
    println!(
        "  floor (kube-runtime reflectors of the same kinds), exec to every store ready: median {:.1} ms (min {:.1}, max {:.1}); ratio {ratio:.2}x (synced alone {:.2}x)",
        ms(floor),
        ms(min(|s| s.floor)),
        ms(max(|s| s.floor)),
        ms(pick(|s| s.timeline.synced)) / ms(floor).max(1e-9),
    );
    println!(
        "  floor with dynamic decoding (every kind as dynamic objects, each converted into JSON, as the agent does for Cilium's kinds only): median {:.1} ms (min {:.1}, max {:.1})",
        ms(pick(|s| s.floor_dynamic)),
        ms(min(|s| s.floor_dynamic)),
        ms(max(|s| s.floor_dynamic)),
    );
    let rss = kib(|s| s.rss_kib) as f64 / 1024.0;
    println!(
        "  RSS once ready: agent {rss:.1} MiB, floor {:.1} MiB at its exit (medians)",
        kib(|s| s.floor_rss_kib) as f64 / 1024.0
    );
    hooks(samples);
    println!(
        "RESULT k8s sync_ms={:.1} sync_ratio_vs_reflector={ratio:.2} rss_mib={rss:.1}",
        ms(ready)
    );
}

/// The median of each start hook over the restarts, slowest first.
fn hooks(samples: &[Sample]) {
    let mut by_hook: BTreeMap<(String, String), Vec<Duration>> = BTreeMap::new();
    for s in samples {
        for (module, hook, d) in &s.timeline.hooks {
            by_hook
                .entry((module.clone(), hook.clone()))
                .or_default()
                .push(*d);
        }
    }
    let mut rows: Vec<_> = by_hook.into_iter().map(|(k, v)| (median(&v), k)).collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    let total: Duration = rows.iter().map(|r| r.0).sum();
    println!("  start hooks (median): {:.1} ms in all", ms(total));
    for (d, (module, hook)) in rows.iter().filter(|r| r.0 >= Duration::from_millis(1)) {
        println!("    {module} {hook}: {:.1} ms", ms(*d));
    }
}

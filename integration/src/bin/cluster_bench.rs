//! `cellium-cluster-bench`: the cluster benchmarks (root; see `integration/bench/cluster.sh`
//! and docs/performance.md, "Cluster").
//!
//! - `up --routing-mode <mode>`: a two-node [`Cluster`] (underlay bridge, test API server,
//!   agents), a client pod on node 1 and a server pod on node 2, held up while a script
//!   measures between them. It prints `client_ns=<netns> server_ns=<netns> server_ip=<ip>
//!   client_node_ns=<netns> server_node_ns=<netns>` and `ready`, then reads commands on stdin, one a line, answering `ready` to each once
//!   the client reaches the server again:
//!   - `plain`: the agents killed and their BPF roots unmounted, so that the programs and
//!     tcx links go and the same devices, addresses and routes carry the traffic with plain
//!     kernel routing (the baseline; in tunnel mode the pod CIDRs are routed via the other
//!     node's address, as native routing does);
//!   - `cellium`: the agents started again, the datapath attached afresh.
//!
//!   With `--world`, also a namespace on the underlay at `192.0.2.200` with no route to any
//!   pod (printed as `world_ns=<netns> world_ip=<ip>`): `plain` then adds iptables'
//!   `MASQUERADE` of node 1's pods to it on node 1, and `cellium` removes it again, the agents'
//!   BPF masquerading taking over (`integration/bench/masquerade.sh`).
//!
//!   At the end of stdin everything is removed.
//! - `scale`: one real agent (node `n1`, `ipam: kubernetes`) on an API server that holds
//!   `--nodes` synthetic CiliumNodes with `--pods` CiliumEndpoints each and their
//!   CiliumIdentities; the time from the agent's exec until every one of the remote pod
//!   addresses resolves to its identity in the agent's BPF ipcache (`cel_ipcache`, read
//!   through its pin), its VmRSS then; and for `--propagate` new CiliumEndpoints, created one
//!   at a time, the time from the API server's accepting it to the BPF ipcache holding it.
//!   Last line: `RESULT cluster_scale ingest_30k_ms=<…> rss_mib=<…> propagate_p50_ms=<…>
//!   propagate_p99_ms=<…>`.
//!
//! SIGINT or SIGTERM stop it at its next step; the cluster's guards remove everything.

use std::io::BufRead;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_integration::bench::{self, ms, watch_signals};
use cellium_integration::cluster::{Cluster, ClusterOptions, RoutingMode};
use cellium_integration::reach::Probe;
use clap::{Parser, Subcommand, ValueEnum};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use serde_json::json;

/// How long the scale benchmark waits for the ingest before it gives up.
const INGEST_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one propagation may take before the benchmark gives up.
const PROPAGATE_TIMEOUT: Duration = Duration::from_secs(30);

/// The first identity number of the synthetic pods, in the cluster-scope range (256-65535):
/// the agent refuses other nodes' claims with any other number.
const FIRST_IDENTITY: u32 = 10_000;

#[derive(Debug, Parser)]
#[command(name = "cellium-cluster-bench")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Native,
    Tunnel,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Two nodes with a client and a server pod, held up for a script; see the module docs.
    Up {
        /// The agents' `routing-mode`.
        #[arg(long, value_enum, default_value = "native")]
        routing_mode: Mode,
        /// Also a world on the underlay, no route to pods: `plain` masquerades the client's
        /// node's pods to it with iptables (see the module docs).
        #[arg(long)]
        world: bool,
    },
    /// One agent ingesting a large cluster; see the module docs.
    Scale {
        /// Synthetic nodes.
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
        /// Pods (CiliumEndpoints) per synthetic node.
        #[arg(long, default_value_t = 30)]
        pods: usize,
        /// Distinct identities the pods share.
        #[arg(long, default_value_t = 300)]
        identities: u32,
        /// New CiliumEndpoints whose propagation is timed, one at a time.
        #[arg(long, default_value_t = 100)]
        propagate: usize,
        /// Keeps the agent's log in this file (for a profile of where the time goes).
        #[arg(long)]
        agent_log: Option<std::path::PathBuf>,
        /// Runs this program as the agent instead of `cellium-agent run`, with the same flags
        /// (a wrapper under a profiler, say, that execs `cellium-agent run "$@"`).
        #[arg(long)]
        agent_program: Option<std::path::PathBuf>,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    watch_signals().context("signal handlers")?;
    match Cli::parse().cmd {
        Cmd::Up {
            routing_mode,
            world,
        } => up(
            match routing_mode {
                Mode::Native => RoutingMode::Native,
                Mode::Tunnel => RoutingMode::Tunnel,
            },
            world,
        ),
        Cmd::Scale {
            nodes,
            pods,
            identities,
            propagate,
            agent_log,
            agent_program,
        } => scale(
            nodes,
            pods,
            identities,
            propagate,
            agent_log.as_deref(),
            agent_program,
        ),
    }
}

fn up(mode: RoutingMode, with_world: bool) -> Result<()> {
    let mut cluster = Cluster::start(ClusterOptions {
        routing_mode: mode,
        ..ClusterOptions::default()
    })
    .context("the cluster")?;
    cluster.namespace("bench", "")?;
    cluster.add_pod(0, "bench/client", "app=client", &[])?;
    cluster.add_pod(1, "bench/server", "app=server", &[])?;
    let (client, server) = (cluster.pod("bench/client")?, cluster.pod("bench/server")?);
    println!(
        "client_ns={} server_ns={} server_ip={} client_node_ns={} server_node_ns={}",
        client.netns.name(),
        server.netns.name(),
        server.ip,
        cluster.agent(0).node().name(),
        cluster.agent(1).node().name()
    );
    let world = with_world
        .then(|| cluster.underlay_host("wld0", WORLD_CIDR))
        .transpose()?;
    if let Some(world) = &world {
        println!("world_ns={} world_ip={WORLD}", world.name());
    }
    let connected = |cluster: &Cluster| -> Result<()> {
        cluster
            .eventually("the client reaches the server", || {
                cluster.reaches("bench/client", "bench/server", Probe::Icmp)
            })
            .map(|_| ())
            .with_context(|| cluster.logs())
    };
    connected(&cluster)?;
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        bench::interrupted()?;
        match line?.trim() {
            "plain" => {
                for i in 0..2 {
                    cluster.agent_mut(i).kill_and_unpin()?;
                }
                if mode == RoutingMode::Tunnel {
                    plain_routes(&cluster)?;
                }
                if world.is_some() {
                    iptables_masquerade(&cluster, "-A")?;
                }
            }
            "cellium" => {
                if world.is_some() {
                    iptables_masquerade(&cluster, "-D")?;
                }
                for i in 0..2 {
                    cluster.start_agent(i)?;
                }
            }
            other => bail!("unknown command {other:?} (plain, cellium)"),
        }
        connected(&cluster)?;
        println!("ready");
    }
    Ok(())
}

/// The world of `up --world`: on the underlay's network, no node's address.
const WORLD: &str = "192.0.2.200";
const WORLD_CIDR: &str = "192.0.2.200/24";

/// Adds (`-A`) or deletes (`-D`) the baseline's masquerading on the client's node: iptables'
/// `MASQUERADE` of its pods' packets to the world, as a node without BPF masquerading does.
fn iptables_masquerade(cluster: &Cluster, op: &str) -> Result<()> {
    let cidr = Cluster::node_pod_cidr(0);
    cluster.agent(0).node().exec(
        "iptables",
        &[
            "-t",
            "nat",
            op,
            "POSTROUTING",
            "-s",
            &cidr,
            "-d",
            WORLD,
            "-j",
            "MASQUERADE",
        ],
    )?;
    Ok(())
}

/// Tunnel mode's routes lead into the VXLAN device, which carries nothing without the
/// datapath's tunnel keys: the baseline routes each node's pod CIDR via the other node's
/// address instead, as plain routing does (the agent puts its own back when it starts).
fn plain_routes(cluster: &Cluster) -> Result<()> {
    for (i, j) in [(0, 1), (1, 0)] {
        let cidr = Cluster::node_pod_cidr(j);
        let via = Cluster::node_ip(j).to_string();
        cluster
            .agent(i)
            .node()
            .ip(&["route", "replace", &cidr, "via", &via, "proto", "206"])?;
    }
    Ok(())
}

/// The address of synthetic node `n` (from 0): on a /16 the bench adds to node 1's underlay
/// interface, so that routes via it are on-link.
fn synthetic_node_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 16, (n / 250) as u8, (n % 250) as u8 + 2)
}

/// The pod CIDR of synthetic node `n`: `10.{64 + n / 256}.{n % 256}.0/24`.
fn synthetic_pod_ip(n: usize, p: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 64 + (n / 256) as u8, (n % 256) as u8, p as u8 + 2)
}

fn scale(
    nodes: usize,
    pods: usize,
    identities: u32,
    propagate: usize,
    agent_log: Option<&Path>,
    agent_program: Option<std::path::PathBuf>,
) -> Result<()> {
    if nodes > 250 * 250
        || pods + propagate.div_ceil(nodes.max(1)) > 250
        || identities == 0
        || FIRST_IDENTITY + identities - 1 > *cellium_identity::CLUSTER_IDENTITIES.end()
    {
        bail!(
            "at most 62,500 nodes of 250 pods each, and from one to {} identities",
            cellium_identity::CLUSTER_IDENTITIES.end() - FIRST_IDENTITY + 1
        );
    }
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        start_agents: false,
        ..ClusterOptions::default()
    })
    .context("the cluster")?;
    cluster.agent_mut(0).options_mut().program = agent_program;
    cluster
        .agent(0)
        .node()
        .ip(&["addr", "add", "172.16.0.1/16", "dev", "und0"])?;
    let server = cluster.api().api().clone();
    let began = Instant::now();
    for i in 0..identities {
        server.create(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
            "metadata": { "name": (FIRST_IDENTITY + i).to_string() },
            "security-labels": {
                "k8s:app": format!("app-{i}"),
                "k8s:io.kubernetes.pod.namespace": "scale",
            },
        }))?;
    }
    server.create(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "scale" },
    }))?;
    let mut expected = Vec::with_capacity(nodes * pods);
    for n in 0..nodes {
        let node_ip = synthetic_node_ip(n);
        server.create(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": { "name": format!("s{n}") },
            "spec": {
                "addresses": [ { "type": "InternalIP", "ip": node_ip.to_string() } ],
                "ipam": { "podCIDRs": [ format!("10.{}.{}.0/24", 64 + n / 256, n % 256) ] },
            },
        }))?;
        for p in 0..pods {
            let identity = FIRST_IDENTITY + ((n * pods + p) as u32 % identities);
            let ip = synthetic_pod_ip(n, p);
            server.create(cep(n, p, ip, node_ip, identity))?;
            expected.push((ip, identity));
        }
        bench::interrupted()?;
    }
    eprintln!(
        "cluster: {nodes} CiliumNodes, {} CiliumEndpoints, {identities} CiliumIdentities ({:.0} ms)",
        expected.len(),
        ms(began.elapsed())
    );

    // The ingest: from the agent's exec until every remote pod resolves in the BPF ipcache.
    let exec = Instant::now();
    cluster.launch_agent(0)?;
    let map_path = cluster.agent(0).bpf_root().join("maps").join("cel_ipcache");
    let mut missing: Vec<(Ipv4Addr, u32)> = expected;
    let mut map = None;
    while !missing.is_empty() {
        bench::interrupted()?;
        if exec.elapsed() > INGEST_TIMEOUT {
            bail!(
                "{} remote endpoints still missing from the BPF ipcache after {INGEST_TIMEOUT:?}\n{}",
                missing.len(),
                cluster.logs()
            );
        }
        if !cluster.agent_mut(0).is_running() {
            bail!("the agent exited\n{}", cluster.logs());
        }
        if map.is_none() {
            map = open_pinned(&map_path);
        }
        if let Some(map) = &map {
            missing.retain(|(ip, identity)| lookup(map, *ip) != Some(*identity));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ingest = exec.elapsed();
    let pid = cluster.agent(0).pid().context("the agent's pid")?;
    let rss_mib = bench::rss_kib(pid)? as f64 / 1024.0;
    eprintln!(
        "ingest: {} remote endpoints in the BPF ipcache {:.0} ms after exec, VmRSS {rss_mib:.1} MiB",
        nodes * pods,
        ms(ingest)
    );
    // Ready as well: its API answers (every cell started).
    cluster.agent_mut(0).wait_ready()?;

    // Propagation: one new CiliumEndpoint at a time, from its creation to its ipcache entry.
    let map = map.context("the ipcache map")?;
    let mut took = Vec::with_capacity(propagate);
    for k in 0..propagate {
        bench::interrupted()?;
        let n = k % nodes.max(1);
        let p = pods + k / nodes.max(1);
        let ip = synthetic_pod_ip(n, p);
        let identity = FIRST_IDENTITY + (k as u32 % identities);
        let created = Instant::now();
        server.create(cep(n, p, ip, synthetic_node_ip(n), identity))?;
        while lookup(&map, ip) != Some(identity) {
            if created.elapsed() > PROPAGATE_TIMEOUT {
                bail!("{ip} not in the BPF ipcache after {PROPAGATE_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        took.push(created.elapsed());
    }
    // What the agent holds once the ingest is over (the list's transient copies freed):
    // shown, not in the result, which is the figure at the ingest.
    eprintln!(
        "VmRSS after the propagation: {:.1} MiB",
        bench::rss_kib(pid)? as f64 / 1024.0
    );
    if let Some(path) = agent_log {
        std::fs::write(path, cluster.agent(0).log())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    took.sort();
    let pct = |q: f64| {
        took.get(((took.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    let (p50, p99) = (pct(0.50), pct(0.99));
    eprintln!(
        "propagation of {propagate} CiliumEndpoints: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(p50),
        ms(p99),
        ms(took.last().copied().unwrap_or_default())
    );
    println!(
        "RESULT cluster_scale ingest_30k_ms={:.0} rss_mib={rss_mib:.1} propagate_p50_ms={:.1} propagate_p99_ms={:.1}",
        ms(ingest),
        ms(p50),
        ms(p99)
    );
    Ok(())
}

/// The CiliumEndpoint of synthetic pod `p` of node `n`, as the agent of that node writes it.
fn cep(n: usize, p: usize, ip: Ipv4Addr, node_ip: Ipv4Addr, identity: u32) -> serde_json::Value {
    json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumEndpoint",
        "metadata": { "name": format!("s{n}-p{p}"), "namespace": "scale" },
        "status": {
            "id": p + 1,
            "identity": { "id": identity },
            "networking": {
                "addressing": [ { "ipv4": ip.to_string() } ],
                "node": node_ip.to_string(),
            },
        },
    })
}

fn open_pinned(path: &Path) -> Option<MapHandle> {
    MapHandle::from_pinned_path(path).ok()
}

/// The identity the datapath resolves for `ip` (the longest prefix `cel_ipcache` holds).
fn lookup(map: &MapHandle, ip: Ipv4Addr) -> Option<u32> {
    // `struct ipcache_key`: prefixlen (32 family bits + the address's), family, pad, address.
    let mut key = Vec::with_capacity(24);
    key.extend_from_slice(&(32u32 + 32).to_ne_bytes());
    key.extend_from_slice(&[4, 0, 0, 0]);
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&ip.octets());
    key.extend_from_slice(&addr);
    let value = map.lookup(&key, MapFlags::ANY).ok()??;
    Some(u32::from_ne_bytes(value.get(..4)?.try_into().ok()?))
}

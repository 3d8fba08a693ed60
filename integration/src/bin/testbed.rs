//! `cellium-testbed`: builds a named node-and-pods topology that outlives the
//! process, and loads/attaches the datapath on it from a separate process,
//! for benchmark scripts and restart tests.
//!
//! ```text
//! cellium-testbed up --name bench --pods 2 --ipv6
//! cellium-testbed attach --name bench --pods 2 --bpf-root /run/cellium-bench --policy allow
//! cellium-testbed detach --name bench --pods 2 --bpf-root /run/cellium-bench
//! cellium-testbed down --name bench --pods 2
//! ip netns exec cel-bench-pod2 cellium-testbed pingpong-server --addr [fd00:10:244::12]:11112 &
//! ip netns exec cel-bench-pod1 cellium-testbed pingpong --addr [fd00:10:244::12]:11112
//! cellium-testbed attach ... --trace on      # trace events of new connections on
//! cellium-testbed observe --bpf-root /run/cellium-bench &   # the flows reader, measured
//! ip netns exec cel-bench-pod1 cellium-testbed connections --addr 10.244.0.12 --count 100000
//! cellium-testbed services --bpf-root /run/cellium-bench --count 1000   # ClusterIPs in the maps
//! cellium-testbed kube-proxy-rules --count 1000 | ip netns exec cel-kp-node iptables-restore
//! ip netns exec cel-bench-pod2 cellium-testbed accept-server --addr 10.244.0.12:8080 &
//! ip netns exec cel-bench-pod1 cellium-testbed connect-rate --services 1000
//! ```

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use cellium_datapath_bpf::{
    AttachMode, Datapath, DatapathConfig, DatapathOptions, Direction, EndpointFlags, IpNet,
    PolicyRule, Verdict, compile_policy,
};
use cellium_integration::bench::services::{cellium_objects, kube_proxy_rules, service_vip};
use cellium_integration::topology::pod_ip6;
use cellium_integration::{Topology, connrate, pingpong};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(about = "Cellium datapath test bed: named netns topologies and datapath loading")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Policy {
    /// No enforcement.
    None,
    /// Enforce both directions, allow every pod to talk to every other.
    Allow,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Auto,
    Tcx,
    Clsact,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create cel-<name>-node and cel-<name>-pod<i>.
    Up {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 2)]
        pods: u8,
        /// Give the node and the pods IPv6 too.
        #[arg(long)]
        ipv6: bool,
    },
    /// Delete the topology's namespaces.
    Down {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 2)]
        pods: u8,
    },
    /// Open the datapath (reusing pins), write the pods' endpoints and
    /// policy, attach to every pod's host veth, print what happened, exit.
    Attach {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 2)]
        pods: u8,
        #[arg(long)]
        bpf_root: PathBuf,
        #[arg(long, value_enum, default_value_t = Policy::None)]
        policy: Policy,
        #[arg(long, value_enum, default_value_t = Mode::Auto)]
        mode: Mode,
        /// Trace events of every new connection forwarded (`cel_config`'s TRACE_EVENTS).
        #[arg(long, value_enum, default_value_t = Switch::Off)]
        trace: Switch,
        /// Write no endpoint, ipcache entry or policy: attach over what the pinned maps hold,
        /// as an upgraded agent's programs run before it restores its endpoints.
        #[arg(long)]
        keep_maps: bool,
    },
    /// Read the datapath's events with the flows cell's reader (enrichment, ring, counters)
    /// until none came for a second (after the first) or `duration` passed; print
    /// `events=<n> cpu_s=<s> lost=<n> events_per_cpu_s=<n>`, the CPU being this process's.
    Observe {
        #[arg(long)]
        bpf_root: PathBuf,
        /// Seconds at most.
        #[arg(long, default_value_t = 60)]
        duration: u64,
    },
    /// Open `count` new UDP connections to `addr` (a fresh socket, so a fresh source port,
    /// each; destination ports 20000-59999 in turn), one datagram each; print the rate.
    Connections {
        #[arg(long)]
        addr: IpAddr,
        #[arg(long, default_value_t = 100_000)]
        count: u32,
    },
    /// Program ClusterIP services `0..count` (cluster IPs 10.96.0.1 and on, port 80, one
    /// backend each) into the datapath's maps through the svc-lb cell's planner and
    /// programmer, replacing every other service; print what the pass did.
    Services {
        #[arg(long)]
        bpf_root: PathBuf,
        #[arg(long)]
        count: u32,
        #[arg(long, default_value = "10.244.0.12:8080")]
        backend: SocketAddrV4,
    },
    /// Print kube-proxy's iptables `nat` table for the same services, for `iptables-restore`.
    KubeProxyRules {
        #[arg(long)]
        count: u32,
        #[arg(long, default_value = "10.244.0.12:8080")]
        backend: SocketAddrV4,
        /// kube-proxy's `--cluster-cidr`: traffic from outside it is masqueraded.
        #[arg(long, default_value = "10.244.0.0/16")]
        cluster_cidr: String,
    },
    /// Accept TCP connections on `addr` and close them, until killed.
    AcceptServer {
        #[arg(long)]
        addr: SocketAddr,
    },
    /// Open TCP connections for `duration` seconds, each to the port 80 of one of services
    /// `0..services` chosen at random, or each to `to`; print `conn_per_s=<n>
    /// connect_p50_us=<us> failed=<n>`.
    ConnectRate {
        #[arg(long, required_unless_present = "to", conflicts_with = "to")]
        services: Option<u32>,
        /// One server instead of the services.
        #[arg(long)]
        to: Option<SocketAddr>,
        #[arg(long, default_value_t = 3)]
        duration: u64,
    },
    /// Detach the datapath from every pod's host veth.
    Detach {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 2)]
        pods: u8,
        #[arg(long)]
        bpf_root: PathBuf,
    },
    /// Echo TCP ping-pong messages on `addr` (in the calling network namespace) until killed.
    PingpongServer {
        #[arg(long)]
        addr: SocketAddr,
    },
    /// Ping-pong with a server at `addr`; print the median round trip in microseconds.
    Pingpong {
        #[arg(long)]
        addr: SocketAddr,
        /// Seconds.
        #[arg(long, default_value_t = 4)]
        duration: u64,
        /// Bytes per message.
        #[arg(long, default_value_t = 64)]
        size: usize,
    },
}

/// Identity of pod `i` in the test bed.
fn identity(i: u8) -> u32 {
    1000 + u32::from(i)
}

fn attach(
    name: &str,
    pods: u8,
    bpf_root: PathBuf,
    policy: Policy,
    mode: Mode,
    trace: Switch,
    keep_maps: bool,
) -> Result<()> {
    let topo = Topology::open_named(name, pods).with_context(|| format!("topology {name}"))?;
    let attach_mode = match mode {
        Mode::Auto => AttachMode::Auto,
        Mode::Tcx => AttachMode::Tcx,
        Mode::Clsact => AttachMode::Clsact,
    };
    let dp = Datapath::open(DatapathOptions {
        bpf_root,
        attach_mode,
    })
    .context("opening the datapath")?;
    for r in dp.maps_report() {
        println!("map {} {}", r.name, r.origin);
    }
    println!("program origin {}", dp.program_origin());
    dp.config()
        .set_flag(DatapathConfig::TRACE_EVENTS, trace == Switch::On)?;
    let flags = match policy {
        Policy::None => EndpointFlags::NONE,
        Policy::Allow => EndpointFlags::ENFORCE_INGRESS | EndpointFlags::ENFORCE_EGRESS,
    };
    for pod in topo.pods.iter().filter(|_| !keep_maps) {
        let id = u16::from(pod.index);
        // Both families: the IPv6 entries serve a topology made with `up --ipv6`, and name
        // addresses nobody has otherwise.
        for ip in [IpAddr::from(pod.ip), pod_ip6(pod.index).into()] {
            dp.endpoints()
                .put(ip, &pod.endpoint(id, identity(pod.index), flags))?;
            dp.ipcache().put(IpNet::from(ip), identity(pod.index))?;
        }
        let rules: Vec<PolicyRule> = topo
            .pods
            .iter()
            .filter(|peer| peer.index != pod.index)
            .flat_map(|peer| {
                Direction::ALL.map(|direction| PolicyRule {
                    identity: identity(peer.index),
                    direction,
                    protocol: None,
                    ports: None,
                    verdict: Verdict::Allow,
                })
            })
            .collect();
        let entries = compile_policy(id, &rules)?;
        dp.policy().sync_endpoint(id, &entries)?;
    }
    let dp = std::sync::Arc::new(dp);
    for pod in &topo.pods {
        let (dp2, ifindex) = (dp.clone(), pod.host_ifindex);
        let done = topo.node.run(move || dp2.attach(ifindex))??;
        for h in done {
            println!(
                "attach {} {} {} {:?}",
                pod.host_if,
                h.hook.program(),
                h.kind,
                h.action
            );
        }
    }
    let (from, to) = dp.program_ids()?;
    println!("programs {from} {to}");
    Ok(())
}

/// Enrichment without the agent's cells: every address is looked up and misses, as an
/// address outside the node's pods does.
struct NoSources;

impl cellium_flows::Sources for NoSources {
    fn endpoints_version(&self) -> u64 {
        0
    }
    fn endpoints(&self) -> Vec<cellium_flows::LocalEndpoint> {
        Vec::new()
    }
    fn identity_labels(&self, _: u32) -> Option<cellium_labels::Labels> {
        None
    }
    fn ipcache_identity(&self, _: IpAddr) -> Option<u32> {
        None
    }
    fn world_identity(&self, _: IpAddr) -> u32 {
        2
    }
    fn services(&self) -> Vec<(u16, cellium_flows::ServiceRef)> {
        Vec::new()
    }
}

/// CPU seconds this process's threads ran so far, in nanoseconds' precision: the sum of
/// `/proc/self/task/*/schedstat`'s first field (the clock-tick counters of `/proc/self/stat`
/// are too coarse for a reader that needs tens of milliseconds).
fn cpu_seconds() -> Result<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(ns as f64 / 1e9)
}

fn observe(bpf_root: PathBuf, duration: Duration) -> Result<()> {
    let dp = Datapath::open(DatapathOptions {
        bpf_root,
        ..Default::default()
    })
    .context("opening the datapath")?;
    let reader = dp.events()?;
    let flows =
        cellium_flows::Flows::in_memory(&cellium_flows::FlowsConfig::default(), "bench".into());
    let enricher = cellium_flows::Enricher::new(std::sync::Arc::new(NoSources));
    let lost_before = dp.metrics().events_lost()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!("observing");
    // The flows cell's own reader; it stops once events came and then none for a second.
    let cpu_at_first = std::cell::Cell::new(None);
    let seen = |f: &cellium_flows::Flows| f.ring().seen();
    rt.block_on(async {
        let stop = async {
            let began = std::time::Instant::now();
            let (mut last, mut quiet) = (0, Duration::ZERO);
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = seen(&flows);
                if now > 0 && cpu_at_first.get().is_none() {
                    cpu_at_first.set(cpu_seconds().ok());
                }
                quiet = if now == last && now > 0 {
                    quiet + Duration::from_millis(10)
                } else {
                    Duration::ZERO
                };
                last = now;
                if quiet >= Duration::from_secs(1) || began.elapsed() > duration {
                    return;
                }
            }
        };
        flows.read_events(&dp, reader, enricher, stop).await
    })?;
    let events = seen(&flows);
    let cpu = cpu_seconds()? - cpu_at_first.get().unwrap_or(0.0);
    let lost = dp.metrics().events_lost()? - lost_before;
    let per_s = if cpu > 0.0 { events as f64 / cpu } else { 0.0 };
    println!("events={events} cpu_s={cpu:.4} lost={lost} events_per_cpu_s={per_s:.0}");
    Ok(())
}

fn connections(addr: IpAddr, count: u32) -> Result<()> {
    let began = std::time::Instant::now();
    let any: IpAddr = if addr.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let mut sent = 0u32;
    for i in 0..count {
        let port = 20_000 + (i % 40_000) as u16;
        let s = std::net::UdpSocket::bind(SocketAddr::new(any, 0))?;
        if s.send_to(b"x", SocketAddr::new(addr, port)).is_ok() {
            sent += 1;
        }
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "connections={sent} seconds={secs:.2} per_s={:.0}",
        f64::from(sent) / secs
    );
    Ok(())
}

/// Service port of the benchmark's services.
const SERVICE_PORT: u16 = 80;

fn services(bpf_root: PathBuf, count: u32, backend: SocketAddrV4) -> Result<()> {
    let dp = Datapath::open(DatapathOptions {
        bpf_root,
        ..Default::default()
    })
    .context("opening the datapath")?;
    let resources = cellium_resources::Resources::new();
    // In pieces: one apply is bounded in size, as an API request is.
    for start in (0..count).step_by(500) {
        let end = count.min(start + 500);
        resources
            .apply(
                "bench.yaml",
                &cellium_objects(start..end, SERVICE_PORT, backend),
            )
            .with_context(|| format!("services {start}..{end}"))?;
    }
    let mut programmer = cellium_svc_lb::Programmer::default();
    programmer.adopt(&dp).context("adopting the maps' ids")?;
    let inputs = cellium_svc_lb::desired::Inputs::read(&resources, &[], None);
    let report = programmer
        .sync(&dp, cellium_svc_lb::desired::plans(&inputs))
        .context("programming the services")?;
    anyhow::ensure!(
        report.failed.is_empty(),
        "frontends failed: {:?}",
        report.failed
    );
    println!(
        "programmed={} written={} removed={}",
        report.programmed, report.written, report.removed_frontends
    );
    Ok(())
}

fn connect_rate(services: Option<u32>, to: Option<SocketAddr>, duration: Duration) -> Result<()> {
    let rate = match to {
        Some(to) => connrate::run(&[to.ip()], to.port(), duration)?,
        None => {
            let vips: Vec<IpAddr> = (0..services.unwrap_or_default()).map(service_vip).collect();
            connrate::run(&vips, SERVICE_PORT, duration)?
        }
    };
    println!(
        "conn_per_s={:.0} connect_p50_us={:.1} failed={}",
        rate.per_second(),
        rate.p50().as_secs_f64() * 1e6,
        rate.failed()
    );
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match Cli::parse().command {
        Cmd::Up { name, pods, ipv6 } => {
            let topo = Topology::named(&name, pods)
                .with_context(|| format!("creating topology {name}"))?;
            if ipv6 {
                topo.enable_ipv6()
                    .with_context(|| format!("IPv6 in topology {name}"))?;
            }
            for p in &topo.pods {
                println!("pod {} {} {}", p.ns.name(), p.ip, p.host_if);
            }
        }
        Cmd::PingpongServer { addr } => {
            pingpong::serve(addr).with_context(|| format!("serving on {addr}"))?
        }
        Cmd::Pingpong {
            addr,
            duration,
            size,
        } => {
            let trips = pingpong::run(addr, size, Duration::from_secs(duration))
                .with_context(|| format!("ping-pong with {addr}"))?;
            println!("{:.3}", trips.p50().as_secs_f64() * 1e6);
        }
        Cmd::Down { name, pods } => Topology::remove_named(&name, pods),
        Cmd::Attach {
            name,
            pods,
            bpf_root,
            policy,
            mode,
            trace,
            keep_maps,
        } => attach(&name, pods, bpf_root, policy, mode, trace, keep_maps)?,
        Cmd::Observe { bpf_root, duration } => observe(bpf_root, Duration::from_secs(duration))?,
        Cmd::Connections { addr, count } => connections(addr, count)?,
        Cmd::Services {
            bpf_root,
            count,
            backend,
        } => services(bpf_root, count, backend)?,
        Cmd::KubeProxyRules {
            count,
            backend,
            cluster_cidr,
        } => print!(
            "{}",
            kube_proxy_rules(count, SERVICE_PORT, backend, &cluster_cidr)
        ),
        Cmd::AcceptServer { addr } => {
            connrate::serve(addr).with_context(|| format!("serving on {addr}"))?
        }
        Cmd::ConnectRate {
            services,
            to,
            duration,
        } => connect_rate(services, to, Duration::from_secs(duration))?,
        Cmd::Detach {
            name,
            pods,
            bpf_root,
        } => {
            let topo = Topology::open_named(&name, pods)?;
            let dp = std::sync::Arc::new(Datapath::open(DatapathOptions {
                bpf_root,
                ..Default::default()
            })?);
            for pod in &topo.pods {
                let (dp2, ifindex) = (dp.clone(), pod.host_ifindex);
                topo.node.run(move || dp2.detach(ifindex))??;
            }
        }
    }
    Ok(())
}

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
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use cellium_datapath_bpf::{
    AttachMode, Datapath, DatapathOptions, Direction, EndpointFlags, IpNet, PolicyRule, Verdict,
    compile_policy,
};
use cellium_integration::topology::pod_ip6;
use cellium_integration::{Topology, pingpong};
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

fn attach(name: &str, pods: u8, bpf_root: PathBuf, policy: Policy, mode: Mode) -> Result<()> {
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
    let flags = match policy {
        Policy::None => EndpointFlags::NONE,
        Policy::Allow => EndpointFlags::ENFORCE_INGRESS | EndpointFlags::ENFORCE_EGRESS,
    };
    for pod in &topo.pods {
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
        } => attach(&name, pods, bpf_root, policy, mode)?,
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

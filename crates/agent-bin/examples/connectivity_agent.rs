//! An agent of connectivity only, embedded from Cellium's cells: pods get an address from the
//! node's pod CIDR, a veth pair, routes and the datapath's programs, and nothing else. No
//! Kubernetes objects, identities, network policy or services: the endpoint manager's
//! optional dependencies are left out, and it says on its health what that changes
//! (`endpoint-manager.scope`). `crates/hive/README.md`, "Embedding", walks through it.
//!
//! ```text
//! cargo build -p cellium-agent --example connectivity_agent
//! target/debug/examples/connectivity_agent --pod-cidr 10.244.0.0/24 \
//!     --state-dir /var/run/cellium --api-socket /run/cellium/cellium.sock \
//!     --bpf-root /sys/fs/bpf/cellium
//! target/debug/examples/connectivity_agent --describe    # cells, config, start order
//! ```
//!
//! `cellium-cni` and `cellium` (`status`, `endpoint`, `ipam`) talk to it as to the full agent.
//! Each flag is a configuration key of one of its cells; the same keys can come from a file
//! (`--config`) and from `CELLIUM_*` variables, and a key of a cell it does not have (say
//! `CELLIUM_POLICY_DIR`) stops it before it starts, named.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use cellium_hive::{Cell, ConfigSources, Hive};
use clap::Parser;
use ipnet::IpNet;
use tokio::signal::unix::{SignalKind, signal};

/// The cells: what the agent is.
fn cells() -> Vec<Cell> {
    vec![
        // The node's claims (its network namespace, API socket and BPF root), taken before
        // any other cell starts: a second agent on the node stops here, touching nothing.
        cellium_agent::node_lock().into(),
        // The state directory (endpoint records), locked for one agent.
        cellium_statedir::cell().into(),
        // Prometheus metrics: module health and the datapath's counters.
        cellium_metrics::cell().into(),
        // The gRPC API on a unix socket; it serves every service the cells below contribute
        // (Endpoints for the CNI plugin, Ipam), and starts after all of them.
        cellium_api_server::cell().into(),
        // The datapath: bpffs, maps pinned under the BPF root, the programs.
        cellium_loader::cell().into(),
        // Addresses from the pod CIDRs.
        cellium_ipam::cell().into(),
        // Endpoints. Its optional dependencies (resources, identity, ipcache, policy-repo)
        // are not here: no direction is enforced, every endpoint is `reserved:init`.
        cellium_endpoint_manager::cell().into(),
    ]
}

/// An agent of connectivity only: pod addresses, interfaces and forwarding, no policy.
#[derive(Debug, Parser)]
#[command(name = "connectivity_agent")]
struct Flags {
    /// A configuration file (TOML, or YAML with a .yaml/.yml name) of the keys below.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The state directory (key `state-dir`).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The API's unix socket (key `api-socket`).
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// Where the datapath's maps and links are pinned; mounted as bpffs if needed (key
    /// `bpf-root`).
    #[arg(long, value_name = "DIR")]
    bpf_root: Option<PathBuf>,
    /// The address metrics are served on (key `metrics-addr`).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// A pod CIDR of this node; repeat for several (key `pod-cidr`).
    #[arg(long, value_name = "CIDR")]
    pod_cidr: Vec<IpNet>,
    /// Print the cells, their configuration and start order instead of running.
    #[arg(long)]
    describe: bool,
}

impl Flags {
    /// Defaults < file < `CELLIUM_*` environment < flags, as `cellium-agent` layers them.
    fn sources(&self) -> ConfigSources {
        let mut sources = ConfigSources::new();
        if let Some(file) = &self.config {
            sources = sources.file(file);
        }
        sources = sources.env("CELLIUM_");
        if let Some(v) = &self.state_dir {
            sources = sources.flag("state-dir", v);
        }
        if let Some(v) = &self.api_socket {
            sources = sources.flag("api-socket", v);
        }
        if let Some(v) = &self.bpf_root {
            sources = sources.flag("bpf-root", v);
        }
        if let Some(v) = &self.metrics_addr {
            sources = sources.flag("metrics-addr", v);
        }
        if !self.pod_cidr.is_empty() {
            sources = sources.flag("pod-cidr", &self.pod_cidr);
        }
        sources
    }
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    match run(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("connectivity_agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> anyhow::Result<()> {
    let mut hive = Hive::new(cells()).with_config(flags.sources());
    if flags.describe {
        hive.populate()?;
        print!("{}", hive.describe());
        return Ok(());
    }
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        // Validates the graph and the configuration, builds, starts; stops in reverse order
        // on SIGINT or SIGTERM.
        hive.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Resolves on the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the agent with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stopping");
}

//! `cellium-operator`: the Cellium operator.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use cellium_hive::{ConfigSources, Hive};
use cellium_operator::cells;
use clap::{Parser, Subcommand};
use ipnet::IpNet;
use tokio::signal::unix::{SignalKind, signal};

/// The Cellium operator: cluster-pool IPAM and garbage collection, one leader at a time.
#[derive(Debug, Parser)]
#[command(name = "cellium-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator until SIGINT or SIGTERM.
    Run(ConfigArgs),
    /// Describe the operator's cells (modules, config, providers, start order) without
    /// starting them.
    Hive {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print the dependency graph in Graphviz DOT instead.
        #[arg(long)]
        dot: bool,
    },
}

/// Configuration: defaults < `--config` file < `CELLIUM_*` environment < these flags.
#[derive(Debug, Default, Clone, clap::Args)]
struct ConfigArgs {
    /// A configuration file (TOML, or YAML with a .yaml/.yml name) of `key = value` pairs.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The Kubernetes API server's URL (key `k8s-api-server`).
    #[arg(long, value_name = "URL")]
    k8s_api_server: Option<String>,
    /// A kubeconfig for the Kubernetes API server (key `k8s-kubeconfig-path`).
    #[arg(long, value_name = "FILE")]
    k8s_kubeconfig_path: Option<PathBuf>,
    /// This operator's name in the Lease (key `operator-id`).
    #[arg(long, value_name = "NAME")]
    operator_id: Option<String>,
    /// IPv4 pools of pod CIDRs; repeat or separate with commas (key `cluster-pool-ipv4-cidr`).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    cluster_pool_ipv4_cidr: Vec<IpNet>,
    /// The prefix length of each node's IPv4 pod CIDR (key `cluster-pool-ipv4-mask-size`).
    #[arg(long, value_name = "LEN")]
    cluster_pool_ipv4_mask_size: Option<u8>,
    /// IPv6 pools of pod CIDRs; repeat or separate with commas (key `cluster-pool-ipv6-cidr`).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    cluster_pool_ipv6_cidr: Vec<IpNet>,
    /// The prefix length of each node's IPv6 pod CIDR (key `cluster-pool-ipv6-mask-size`).
    #[arg(long, value_name = "LEN")]
    cluster_pool_ipv6_mask_size: Option<u8>,
}

impl ConfigArgs {
    fn sources(&self) -> ConfigSources {
        let mut sources = ConfigSources::new();
        if let Some(file) = &self.config {
            sources = sources.file(file);
        }
        sources = sources.env("CELLIUM_");
        if let Some(v) = &self.k8s_api_server {
            sources = sources.flag("k8s-api-server", v);
        }
        if let Some(v) = &self.k8s_kubeconfig_path {
            sources = sources.flag("k8s-kubeconfig-path", v);
        }
        if let Some(v) = &self.operator_id {
            sources = sources.flag("operator-id", v);
        }
        for (key, pools) in [
            ("cluster-pool-ipv4-cidr", &self.cluster_pool_ipv4_cidr),
            ("cluster-pool-ipv6-cidr", &self.cluster_pool_ipv6_cidr),
        ] {
            if !pools.is_empty() {
                sources = sources.flag(key, pools);
            }
        }
        for (key, len) in [
            (
                "cluster-pool-ipv4-mask-size",
                self.cluster_pool_ipv4_mask_size,
            ),
            (
                "cluster-pool-ipv6-mask-size",
                self.cluster_pool_ipv6_mask_size,
            ),
        ] {
            if let Some(len) = len {
                sources = sources.flag(key, len);
            }
        }
        sources
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(config) => run(config),
        Command::Hive { config, dot } => describe(config, dot),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cellium-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: ConfigArgs) -> anyhow::Result<()> {
    init_logging();
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let hive = Hive::new(cells()).with_config(config.sources());
        hive.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

fn describe(config: ConfigArgs, dot: bool) -> anyhow::Result<()> {
    let mut hive = Hive::new(cells()).with_config(config.sources());
    hive.populate()?;
    print!("{}", if dot { hive.dot() } else { hive.describe() });
    Ok(())
}

/// Resolves on the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the operator with SIGKILL");
        return std::future::pending().await;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "stopping");
}

/// Logs to stderr; `RUST_LOG` filters, default `info`.
fn init_logging() {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

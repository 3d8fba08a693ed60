//! `cellium-operator`: the Cellium operator.

mod flags;

use std::process::ExitCode;

use anyhow::Context;
use cellium_hive::Hive;
use cellium_operator::cells;
use clap::{Parser, Subcommand};
use flags::ConfigArgs;
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

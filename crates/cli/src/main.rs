//! `cellium`: inspect and drive a running Cellium agent over its unix socket.

#[macro_use]
mod output;
mod apply;
mod connectivity;
mod endpoint;
mod identity;
mod ipam;
mod ipcache;
mod observe;
mod policy;
mod service;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Inspect and drive the Cellium agent on this node.
#[derive(Debug, Parser)]
#[command(name = "cellium", version, about)]
struct Cli {
    /// The agent's API socket.
    #[arg(long, global = true, env = "CELLIUM_API_SOCKET", default_value = cellium_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the agent's version, uptime and module health.
    Status(status::Args),
    /// Create or update the objects of Kubernetes YAML files (Namespace, Pod, ...).
    Apply(apply::Args),
    /// Delete the objects named in Kubernetes YAML files.
    Delete(apply::Args),
    /// The node's endpoints (one per pod interface).
    #[command(subcommand)]
    Endpoint(endpoint::Command),
    /// The node's pod address pools.
    #[command(subcommand)]
    Ipam(ipam::Command),
    /// The node's security identities.
    #[command(subcommand)]
    Identity(identity::Command),
    /// Which security identity each IP prefix has.
    #[command(subcommand)]
    Ipcache(ipcache::Command),
    /// The node's network policy rules and selector cache.
    #[command(subcommand)]
    Policy(policy::Command),
    /// The services the node load-balances: every frontend with its backends.
    #[command(subcommand)]
    Service(service::Command),
    /// Checks this node's connectivity with pods, a Service and a policy of its own
    /// (`cellium connectivity test`, as `cilium connectivity test`).
    #[command(subcommand)]
    Connectivity(connectivity::Command),
    /// The flows the datapath saw: who talked to whom, what was dropped and why. Filters
    /// as `hubble observe`'s; `--not` before a filter flag negates it.
    Observe(Box<observe::Args>),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // `--not` is positional (it negates the flag after it), which clap cannot express.
    let (argv, negated) = observe::split_not(std::env::args().collect());
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Status(args) => status::exec(&cli.socket, args).await,
        Command::Apply(args) => apply::exec(&cli.socket, apply::Verb::Apply, args).await,
        Command::Delete(args) => apply::exec(&cli.socket, apply::Verb::Delete, args).await,
        Command::Endpoint(command) => endpoint::exec(&cli.socket, command).await,
        Command::Ipam(command) => ipam::exec(&cli.socket, command).await,
        Command::Identity(command) => identity::exec(&cli.socket, command).await,
        Command::Ipcache(command) => ipcache::exec(&cli.socket, command).await,
        Command::Policy(command) => policy::exec(&cli.socket, command).await,
        Command::Service(command) => service::exec(&cli.socket, command).await,
        Command::Connectivity(command) => connectivity::exec(&cli.socket, command).await,
        Command::Observe(args) => observe::exec(&cli.socket, (*args).with_negated(negated)).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cellium: {e:#}");
            ExitCode::FAILURE
        }
    }
}

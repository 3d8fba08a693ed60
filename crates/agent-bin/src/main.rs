//! `cellium-agent`: the Cellium agent.

use std::process::ExitCode;

use cellium_agent::{ConfigArgs, cells};
use cellium_hive::process;
use clap::{Parser, Subcommand};

/// mimalloc (its v2 line), not glibc's malloc: a restart decodes and copies tens of thousands
/// of API objects, and a quarter of the agent's CPU went to glibc's allocator (consolidating
/// and unlinking chunks). Built without asking for transparent huge pages (`no_thp`): a
/// restart that touched fresh huge pages took up to 50% longer than one that did not, and they
/// held 20 MiB more. docs/performance.md, "Kubernetes mode", has the figures, memory included.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Cellium node agent.
#[derive(Debug, Parser)]
#[command(name = "cellium-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent until SIGINT or SIGTERM.
    Run(ConfigArgs),
    /// Describe the agent's cells (modules, config, providers, start order) without starting them.
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
            eprintln!("cellium-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: ConfigArgs) -> anyhow::Result<()> {
    process::run("agent", cells(), config.sources()).map_err(anyhow::Error::from_boxed)
}

fn describe(config: ConfigArgs, dot: bool) -> anyhow::Result<()> {
    let text =
        process::describe(cells(), config.sources(), dot).map_err(anyhow::Error::from_boxed)?;
    print!("{text}");
    Ok(())
}

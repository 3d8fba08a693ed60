//! `cellium-agent`: the Cellium agent.

use std::process::ExitCode;

use cellium_agent::{ConfigArgs, cells};
use cellium_hive::process::{self, Command};
use clap::Parser;

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
    command: Command<ConfigArgs>,
}

fn main() -> ExitCode {
    process::main("agent", Cli::parse().command, cells)
}

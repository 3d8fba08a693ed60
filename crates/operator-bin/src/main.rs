//! `cellium-operator`: the Cellium operator.

mod flags;

use std::process::ExitCode;

use cellium_hive::process::{self, Command};
use cellium_operator::cells;
use clap::Parser;
use flags::ConfigArgs;

/// The Cellium operator: cluster-pool IPAM and garbage collection, one leader at a time.
#[derive(Debug, Parser)]
#[command(name = "cellium-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command<ConfigArgs>,
}

fn main() -> ExitCode {
    process::main("operator", Cli::parse().command, cells)
}

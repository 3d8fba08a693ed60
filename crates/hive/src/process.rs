//! A hive as a program's main: run until SIGINT or SIGTERM with logs on stderr, or described.
//! What every Cellium binary (`cellium-agent`, `cellium-operator`, an embedded agent) does the
//! same way, so each binary is its list of cells and its flags. With the `cli` feature, the
//! two commands themselves ([`Command`], [`main`]), as cilium/hive's `hive.Command()`.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};

use crate::config::ConfigSources;
use crate::error::BoxError;
use crate::hive::Hive;
use crate::module::Cell;

/// Runs `cells` with `sources` on a new runtime until the first SIGINT or SIGTERM, then stops
/// them; `program` names the process in the log (`stop the agent with SIGKILL`).
pub fn run(program: &str, cells: Vec<Cell>, sources: ConfigSources) -> Result<(), BoxError> {
    init_logging();
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        let hive = Hive::new(cells).with_config(sources);
        hive.run(shutdown_signal(program)).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// The description of `cells` (modules, config, providers, start order), or their graph in
/// Graphviz DOT, without starting them.
pub fn describe(cells: Vec<Cell>, sources: ConfigSources, dot: bool) -> Result<String, BoxError> {
    let mut hive = Hive::new(cells).with_config(sources);
    hive.populate()?;
    Ok(if dot { hive.dot() } else { hive.describe() })
}

/// Resolves on the first SIGINT or SIGTERM.
pub fn shutdown_signal(program: &str) -> impl Future<Output = ()> + 'static {
    let program = program.to_string();
    async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; stop the {program} with SIGKILL");
            return std::future::pending().await;
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stopping");
    }
}

/// Logs to stderr; `RUST_LOG` filters, default `info`. (Not a `CELLIUM_*` variable: those are
/// all configuration keys, and an unknown one is an error.)
pub fn init_logging() {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// A binary's configuration flags, as [`ConfigSources`].
#[cfg(feature = "cli")]
pub trait Flags: clap::Args {
    /// The sources these flags give: defaults < file < environment < flags.
    fn sources(&self) -> ConfigSources;
}

/// The commands every hive binary has, over its configuration flags `F`.
#[cfg(feature = "cli")]
#[derive(Debug, clap::Subcommand)]
pub enum Command<F: Flags> {
    /// Run until SIGINT or SIGTERM.
    Run(F),
    /// Describe the cells (modules, config, providers, start order) without starting them.
    // No doc comment on `config`: clap would take it for help text of the flattened flags.
    #[allow(missing_docs)]
    Hive {
        #[command(flatten)]
        config: F,
        /// Print the dependency graph in Graphviz DOT instead.
        #[arg(long)]
        dot: bool,
    },
}

/// Runs or describes `cells()` as `command` says; a failure is printed on stderr after the
/// binary's name `cellium-<program>`, with its causes, and ends the process with status 1.
#[cfg(feature = "cli")]
pub fn main<F: Flags>(
    program: &str,
    command: Command<F>,
    cells: fn() -> Vec<Cell>,
) -> std::process::ExitCode {
    let result = match command {
        Command::Run(flags) => run(program, cells(), flags.sources()),
        Command::Hive { config, dot } => describe(cells(), config.sources(), dot).map(|text| {
            print!("{text}");
        }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cellium-{program}: {}", with_causes(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes, each once, separated by `: `.
#[cfg(feature = "cli")]
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

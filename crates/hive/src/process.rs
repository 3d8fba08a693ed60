//! A hive as a program's main: run until SIGINT or SIGTERM with logs on stderr, or described.
//! What every Cellium binary (`cellium-agent`, `cellium-operator`, an embedded agent) does the
//! same way, so each binary is its list of cells and its flags.

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

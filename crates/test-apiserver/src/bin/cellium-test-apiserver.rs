//! `cellium-test-apiserver`: the test API server as a process, for benchmarks and kubectl.

use cellium_test_apiserver::ApiServer;
use clap::Parser;
use std::path::PathBuf;

/// Serves the Kubernetes API over plain HTTP from an in-memory store.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// A (multi-document) YAML file of objects to create before serving.
    #[arg(long)]
    load: Option<PathBuf>,
    /// How many events to keep for watches resuming at an older resourceVersion.
    #[arg(long, default_value_t = cellium_test_apiserver::DEFAULT_HISTORY)]
    history: usize,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    if let Err(error) = run(Args::parse()).await {
        eprintln!("cellium-test-apiserver: {error}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let server = ApiServer::with_history(args.history);
    if let Some(path) = &args.load {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        server
            .apply_yaml(&text)
            .map_err(|e| format!("loading {}: {e}", path.display()))?;
    }
    let listener = std::net::TcpListener::bind(args.listen)?;
    tracing::info!(listen = %listener.local_addr()?, "serving");
    server.serve(listener)?;
    tokio::signal::ctrl_c().await?;
    server.stop();
    Ok(())
}

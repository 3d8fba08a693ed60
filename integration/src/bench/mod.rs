//! What the benchmarks that run a real agent at scale share (`cellium-policy-bench`,
//! `cellium-restart-bench`): the generated cluster ([`Shape`]), its pods created through
//! `cellium-cni` as a kubelet would ([`pods`]), the agent's API polled for what the endpoints
//! enforce ([`Api`]), a stop on SIGINT or SIGTERM that still removes what was created
//! ([`interrupted`]), and the statistics the reports print; and the services benchmark's
//! services, for Cellium and for kube-proxy ([`services`]).

pub mod api;
pub mod pods;
pub mod services;
pub mod start;
pub mod workload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use api::{Api, Enforced};
pub use pods::{BenchPod, create_pods};
pub use workload::Shape;

use crate::error::{Error, Result};

/// Set when SIGINT or SIGTERM arrives: the benchmark stops at its next step and removes what
/// it created (the agent, the pods' namespaces) on the way out, which dying by the signal
/// would not.
static STOP: AtomicBool = AtomicBool::new(false);

/// Fails once the benchmark has been told to stop.
pub fn interrupted() -> Result<()> {
    if STOP.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// Makes the first SIGINT or SIGTERM set the flag [`interrupted`] reads, from a thread of its
/// own (the signals no longer end the process).
pub fn watch_signals() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut int) = runtime.block_on(async {
        std::io::Result::Ok((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        });
        eprintln!("stopping: removing what the benchmark created");
        STOP.store(true, Ordering::Relaxed);
    });
    Ok(())
}

/// The median (the upper one of an even count; zero for none).
pub fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The resident memory of process `pid` (KiB).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        op: "read",
        path: path.clone(),
        source,
    })?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or(Error::Unexpected {
            what: "process status",
            detail: format!("no VmRSS in {path}"),
        })
}

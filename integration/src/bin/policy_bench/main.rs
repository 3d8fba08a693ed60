//! `cellium-policy-bench`: how fast policy follows changes at scale (root; see
//! `integration/bench/policy.sh` and docs/performance.md, "Policy").
//!
//! 1. **Apply to enforcement**: a real agent with `--pods` endpoints (real pods through
//!    `cellium-cni`, one identity each) and `--policies` NetworkPolicies of two rules each; a
//!    policy that changes every endpoint is applied and deleted `--rounds` times, each time
//!    from the Apply call until `Endpoints.List` reports every endpoint at the new revision.
//!    Baseline: the same for a policy that selects no endpoint (a new revision, nothing to
//!    write).
//! 2. **A new identity** that a hundred cached selectors select, handed to the repository
//!    (in process, same cluster). Baseline: recomputing every selector over every identity.
//! 3. **The agent's resident memory** with everything loaded. Baseline: just after its start.
//!
//! The last line is `RESULT policy apply_1000_ms=<median> identity_add_us=<median>
//! rss_mib=<loaded>`.

mod agent;
mod selectors;

use std::time::Duration;

use anyhow::Result;
use cellium_integration::bench::{Shape, median, ms, us, watch_signals};
use clap::Parser;

/// Measures policy at scale.
#[derive(Debug, Parser)]
#[command(name = "cellium-policy-bench")]
struct Cli {
    #[command(flatten)]
    shape: Shape,
    /// Applies and deletes of each policy.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// New identities added.
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Only the in-process identity measurement (no root, no agent).
    #[arg(long)]
    identities_only: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    watch_signals()?;
    let shape = cli.shape;

    let ids = selectors::measure(shape, cli.samples)?;
    let (inc, naive) = (median(&ids.incremental), median(&ids.naive));
    println!(
        "new identity: {} rules, {} identities, {} cached selectors of which {} select it",
        ids.rules, ids.identities, ids.selectors, ids.matching
    );
    println!(
        "  repository (incremental): median {:.1} µs, max {:.1} µs over {} identities",
        us(inc),
        us(ids.incremental.iter().max().copied().unwrap_or_default()),
        ids.incremental.len()
    );
    println!(
        "  every selector recomputed: median {:.1} µs; ratio {:.1}x",
        us(naive),
        naive.as_secs_f64() / inc.as_secs_f64().max(1e-9)
    );
    println!(
        "  resolving every pod's policy at a new revision: median {:.2} ms",
        ms(median(&ids.resolve_all))
    );
    if cli.identities_only {
        return Ok(());
    }

    let fig = agent::measure(shape, cli.rounds)?;
    let (all, none) = (median(&fig.change_all), median(&fig.change_none));
    println!(
        "agent: {} endpoints created in {:.1} s, {} rules",
        fig.endpoints, fig.create_s, ids.rules
    );
    println!(
        "  Endpoints.List of every endpoint (what the measurement polls): median {:.2} ms",
        ms(median(&fig.list))
    );
    println!(
        "  policy changing every endpoint: median {:.1} ms (min {:.1}, max {:.1}) over {} applies and deletes",
        ms(all),
        ms(fig.change_all.iter().min().copied().unwrap_or_default()),
        ms(fig.change_all.iter().max().copied().unwrap_or_default()),
        fig.change_all.len()
    );
    println!(
        "  policy changing no endpoint: median {:.1} ms; ratio {:.2}x",
        ms(none),
        all.as_secs_f64() / none.as_secs_f64().max(1e-9)
    );
    let total: Vec<Duration> = fig.new_pod.iter().map(|t| t.0).collect();
    let add: Vec<Duration> = fig.new_pod.iter().map(|t| t.1).collect();
    println!(
        "  new pod whose identity {} selectors select, CNI ADD to every endpoint at the new revision: median {:.1} ms (the ADD itself {:.1} ms)",
        ids.matching,
        ms(median(&total)),
        ms(median(&add))
    );
    println!(
        "  agent RSS: {:.1} MiB loaded, {:.1} MiB just started; ratio {:.2}x",
        fig.rss_loaded_kib as f64 / 1024.0,
        fig.rss_idle_kib as f64 / 1024.0,
        fig.rss_loaded_kib as f64 / fig.rss_idle_kib.max(1) as f64
    );
    println!(
        "RESULT policy apply_{}_ms={:.1} identity_add_us={:.1} rss_mib={:.1}",
        fig.endpoints,
        ms(all),
        us(inc),
        fig.rss_loaded_kib as f64 / 1024.0
    );
    Ok(())
}

//! `cellium ipam`: the node's address pools.

use std::path::Path;

use cellium_api::v1::{ListIpamRequest, ipam_client::IpamClient};
use serde::Serialize;

use crate::output::{self, Format};

/// `cellium ipam` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List the pools and every address held, with its owner.
    List {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
}

#[derive(Debug, Serialize)]
struct PoolView {
    cidr: String,
    source: String,
    router: String,
    capacity: u64,
    used: u64,
    allocations: Vec<AllocationView>,
    quarantined: Vec<QuarantinedView>,
}

#[derive(Debug, Serialize)]
struct QuarantinedView {
    ip: String,
    until: String,
}

#[derive(Debug, Serialize)]
struct AllocationView {
    ip: String,
    owner: String,
}

/// Runs a `cellium ipam` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    let Command::List { output } = command;
    let channel = cellium_api::connect(socket).await?;
    let pools = output::answer(
        IpamClient::new(channel).list(ListIpamRequest {}).await,
        "Ipam.List",
    )?
    .pools;
    let views: Vec<PoolView> = pools
        .into_iter()
        .map(|p| PoolView {
            cidr: p.cidr,
            source: p.source,
            router: p.router,
            capacity: p.capacity,
            used: p.used,
            allocations: p
                .allocations
                .into_iter()
                .map(|a| AllocationView {
                    ip: a.ip,
                    owner: a.owner,
                })
                .collect(),
            quarantined: p
                .quarantined
                .into_iter()
                .map(|q| QuarantinedView {
                    ip: q.ip,
                    until: output::rfc3339_ms(q.until_unix_ms),
                })
                .collect(),
        })
        .collect();
    match output {
        Format::Json => output::print_json(&views),
        Format::Table => {
            for pool in &views {
                outln!(
                    "Pool {} ({}): {} of {} used, {} in quarantine, router {}",
                    pool.cidr,
                    pool.source,
                    pool.used,
                    pool.capacity,
                    pool.quarantined.len(),
                    pool.router
                );
            }
            outln!();
            let held = views
                .iter()
                .flat_map(|p| &p.allocations)
                .map(|a| vec![a.ip.clone(), a.owner.clone()]);
            let quarantined = views
                .iter()
                .flat_map(|p| &p.quarantined)
                .map(|q| vec![q.ip.clone(), format!("(quarantined until {})", q.until)]);
            let rows: Vec<Vec<String>> = held.chain(quarantined).collect();
            output::print_table(&["IP", "OWNER"], &rows);
            Ok(())
        }
    }
}

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
        })
        .collect();
    match output {
        Format::Json => output::print_json(&views),
        Format::Table => {
            for pool in &views {
                println!(
                    "Pool {} ({}): {} of {} used, router {}",
                    pool.cidr, pool.source, pool.used, pool.capacity, pool.router
                );
            }
            println!();
            let rows: Vec<Vec<String>> = views
                .iter()
                .flat_map(|p| &p.allocations)
                .map(|a| vec![a.ip.clone(), a.owner.clone()])
                .collect();
            output::print_table(&["IP", "OWNER"], &rows);
            Ok(())
        }
    }
}

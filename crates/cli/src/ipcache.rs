//! `cellium ipcache`: which identity each IP prefix has.

use std::net::IpAddr;
use std::path::Path;

use cellium_api::v1::{
    GetIpcacheRequest, IpcacheEntry, IpcacheSource, ListIpcacheRequest,
    ipcache_client::IpcacheClient,
};
use serde::Serialize;
use tonic::Code;

use crate::output::{self, Format};

/// `cellium ipcache` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List every prefix with its identity and who claims it.
    List {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
    /// Show the identity the datapath gives an address (longest prefix match).
    Get {
        /// An IPv4 or IPv6 address.
        ip: IpAddr,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
}

/// What `-o json` prints for one entry.
#[derive(Debug, Serialize)]
struct EntryView {
    prefix: String,
    identity: u32,
    source: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    tunnel_endpoint: String,
    shadowed: Vec<ClaimView>,
}

#[derive(Debug, Serialize)]
struct ClaimView {
    source: &'static str,
    identity: u32,
}

/// Runs a `cellium ipcache` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    let mut client = IpcacheClient::new(cellium_api::connect(socket).await?);
    match command {
        Command::List { output } => {
            let entries =
                output::answer(client.list(ListIpcacheRequest {}).await, "Ipcache.List")?.entries;
            let views: Vec<EntryView> = entries.into_iter().map(view).collect();
            match output {
                Format::Json => output::print_json(&views),
                Format::Table => {
                    print_table(&views);
                    Ok(())
                }
            }
        }
        Command::Get { ip, output } => {
            let entry = match client.get(GetIpcacheRequest { ip: ip.to_string() }).await {
                Ok(r) => Ok(view(r.into_inner())),
                // No prefix holds the address: that is an answer (the world, of which the
                // agent says the identity), not a failure.
                Err(s) if s.code() == Code::NotFound => Err(s.message().to_string()),
                Err(s) => {
                    return Err(anyhow::anyhow!(
                        "Ipcache.Get of {ip}: {}",
                        output::reason(&s)
                    ));
                }
            };
            match (output, entry) {
                (Format::Json, entry) => output::print_json(&entry.ok()),
                (Format::Table, Ok(e)) => {
                    print_table(&[e]);
                    Ok(())
                }
                (Format::Table, Err(world)) => {
                    outln!("{world}");
                    Ok(())
                }
            }
        }
    }
}

fn view(e: IpcacheEntry) -> EntryView {
    EntryView {
        prefix: e.prefix.clone(),
        identity: e.identity,
        source: source_name(e.source()),
        tunnel_endpoint: e.tunnel_endpoint.clone(),
        shadowed: e
            .shadowed
            .iter()
            .map(|c| ClaimView {
                source: source_name(c.source()),
                identity: c.identity,
            })
            .collect(),
    }
}

fn source_name(s: IpcacheSource) -> &'static str {
    match s {
        IpcacheSource::Endpoint => "endpoint",
        IpcacheSource::Host => "host",
        IpcacheSource::Policy => "policy",
        IpcacheSource::Remote => "remote",
        IpcacheSource::Unspecified => "unknown",
    }
}

fn print_table(views: &[EntryView]) {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let shadowed: Vec<String> = v
                .shadowed
                .iter()
                .map(|c| format!("{} {}", c.source, c.identity))
                .collect();
            vec![
                v.prefix.clone(),
                v.identity.to_string(),
                v.source.to_string(),
                v.tunnel_endpoint.clone(),
                shadowed.join(", "),
            ]
        })
        .collect();
    output::print_table(
        &[
            "PREFIX",
            "IDENTITY",
            "SOURCE",
            "TUNNEL ENDPOINT",
            "SHADOWED",
        ],
        &rows,
    );
}

//! `cellium identity`: the node's security identities.

use std::path::Path;

use cellium_api::v1::{
    GetIdentityRequest, IdentityScope, ListIdentitiesRequest, SecurityIdentity,
    identity_client::IdentityClient,
};
use serde::Serialize;

use crate::output::{self, Format};

/// `cellium identity` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List every identity (reserved ones included) with its labels and references.
    List {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
    /// Show one identity.
    Get {
        /// The identity's number.
        id: u32,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
}

/// What `-o json` prints for one identity.
#[derive(Debug, Serialize)]
struct IdentityView {
    id: u32,
    scope: &'static str,
    references: u64,
    restored: bool,
    labels: Vec<String>,
}

/// Runs a `cellium identity` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    let mut client = IdentityClient::new(cellium_api::connect(socket).await?);
    match command {
        Command::List { output } => {
            let identities =
                output::answer(client.list(ListIdentitiesRequest {}).await, "Identity.List")?
                    .identities;
            let views: Vec<IdentityView> = identities.into_iter().map(view).collect();
            print(&views, output)
        }
        Command::Get { id, output } => {
            let identity =
                output::answer(client.get(GetIdentityRequest { id }).await, "Identity.Get")?;
            let view = view(identity);
            match output {
                Format::Json => output::print_json(&view),
                Format::Table => print(&[view], Format::Table),
            }
        }
    }
}

fn view(i: SecurityIdentity) -> IdentityView {
    IdentityView {
        id: i.id,
        scope: scope_name(i.scope()),
        references: i.references,
        restored: i.restored,
        labels: i.labels,
    }
}

fn scope_name(scope: IdentityScope) -> &'static str {
    match scope {
        IdentityScope::Reserved => "reserved",
        IdentityScope::Cluster => "cluster",
        IdentityScope::Local => "local",
        IdentityScope::Unspecified => "unknown",
    }
}

fn print(views: &[IdentityView], format: Format) -> anyhow::Result<()> {
    if format == Format::Json {
        return output::print_json(&views);
    }
    let mut rows = Vec::new();
    for v in views {
        let scope = if v.restored {
            format!("{}, restored", v.scope)
        } else {
            v.scope.to_string()
        };
        let refs = if v.scope == "reserved" {
            "-".to_string()
        } else {
            v.references.to_string()
        };
        let mut labels = v.labels.iter();
        let first = labels.next().cloned().unwrap_or_default();
        rows.push(vec![v.id.to_string(), scope, refs, first]);
        // One label per line, as `cilium identity list` prints them.
        for label in labels {
            rows.push(vec![
                String::new(),
                String::new(),
                String::new(),
                label.clone(),
            ]);
        }
    }
    output::print_table(&["ID", "SCOPE", "REFS", "LABELS"], &rows);
    Ok(())
}

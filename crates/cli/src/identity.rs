//! `cellium identity`: the node's security identities.

use std::path::Path;

use cellium_api::v1::{
    GetIdentityRequest, IdentityScope, LabelKey, LabelKeysRequest, ListIdentitiesRequest,
    SecurityIdentity, identity_client::IdentityClient, policy_client::PolicyClient,
};
use serde::Serialize;

use crate::output::{self, Format};

/// `cellium identity` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List every identity (reserved ones included) with its labels and references.
    List {
        /// List the keys of the identities' `k8s:` labels instead, each with why identities
        /// keep it: `derived`, `filter` (the label filter keeps it), `policy` (the filter
        /// drops it but the named policies select on it) or `-`.
        #[arg(long)]
        keys: bool,
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
    let channel = cellium_api::connect(socket).await?;
    let mut client = IdentityClient::new(channel.clone());
    match command {
        Command::List { keys: true, output } => {
            let keys = output::answer(
                PolicyClient::new(channel)
                    .label_keys(LabelKeysRequest {})
                    .await,
                "Policy.LabelKeys",
            )?
            .keys;
            print_keys(keys.into_iter().map(key_view).collect(), output)
        }
        Command::List {
            keys: false,
            output,
        } => {
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

/// What `--keys -o json` prints for one key.
#[derive(Debug, Serialize)]
struct KeyView {
    key: String,
    kept_by: String,
    /// Empty: every namespace (when policies read it).
    namespaces: Vec<String>,
    policies: Vec<String>,
    identities: u32,
}

fn key_view(k: LabelKey) -> KeyView {
    KeyView {
        key: k.key,
        kept_by: k.kept_by,
        namespaces: k.namespaces,
        policies: k.policies,
        identities: k.identities,
    }
}

fn print_keys(views: Vec<KeyView>, format: Format) -> anyhow::Result<()> {
    if format == Format::Json {
        return output::print_json(&views);
    }
    let rows: Vec<Vec<String>> = views
        .into_iter()
        .map(|v| {
            let namespaces = match (v.policies.is_empty(), v.namespaces.is_empty()) {
                (true, _) => "-".to_string(),
                (false, true) => "*".to_string(),
                (false, false) => v.namespaces.join(","),
            };
            let policies = if v.policies.is_empty() {
                "-".to_string()
            } else {
                v.policies.join(", ")
            };
            vec![
                v.key,
                v.kept_by,
                v.identities.to_string(),
                namespaces,
                policies,
            ]
        })
        .collect();
    output::print_table(
        &["KEY", "KEPT BY", "IDENTITIES", "NAMESPACES", "SELECTED BY"],
        &rows,
    );
    Ok(())
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

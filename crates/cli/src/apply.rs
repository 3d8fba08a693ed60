//! `cellium apply -f` and `cellium delete -f`: feed Kubernetes YAML to the agent.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use cellium_api::v1::{ApplyRequest, resources_client::ResourcesClient};

use crate::output::{self, Format};

/// Arguments of `apply` and `delete`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A YAML file of one or more documents (`-` reads standard input). Repeatable; files are
    /// sent one at a time, each applied entirely or not at all.
    #[arg(long, short = 'f', value_name = "FILE", required = true)]
    filename: Vec<PathBuf>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: Format,
}

/// Whether objects are applied or deleted.
#[derive(Debug, Clone, Copy)]
pub enum Verb {
    /// `cellium apply`.
    Apply,
    /// `cellium delete`.
    Delete,
}

/// Runs `cellium apply` or `cellium delete`.
pub async fn exec(socket: &Path, verb: Verb, args: Args) -> anyhow::Result<()> {
    // Every file is read before anything is sent, so a typo in the last name changes nothing.
    let mut texts = Vec::new();
    for path in &args.filename {
        texts.push((path.display().to_string(), read(path)?));
    }
    let mut client = ResourcesClient::new(cellium_api::connect(socket).await?);
    let mut rows = Vec::new();
    for (source, yaml) in texts {
        let request = ApplyRequest {
            source: source.clone(),
            yaml,
        };
        let response = match verb {
            Verb::Apply => client.apply(request).await,
            Verb::Delete => client.delete(request).await,
        }
        // The agent's message names the file, the document or the record that failed, and
        // says that nothing changed.
        .map_err(|s| anyhow::anyhow!("{}", output::reason(&s)))
        .with_context(|| match verb {
            Verb::Apply => format!("{source} was not applied"),
            Verb::Delete => format!("{source} was not deleted"),
        })?;
        for o in response.into_inner().objects {
            let key = if o.namespace.is_empty() {
                o.name
            } else {
                format!("{}/{}", o.namespace, o.name)
            };
            rows.push((o.kind, key, o.action));
        }
    }
    match args.output {
        Format::Json => {
            let json: Vec<_> = rows
                .iter()
                .map(|(kind, name, action)| {
                    serde_json::json!({ "kind": kind, "name": name, "action": action })
                })
                .collect();
            output::print_json(&json)
        }
        Format::Table => {
            for (kind, name, action) in rows {
                outln!("{kind} {name} {action}");
            }
            Ok(())
        }
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

//! `cellium policy`: the rules of the node's network policies and the selector cache.

use std::path::Path;

use cellium_api::v1::{GetPolicyRequest, PolicySelectorsRequest, policy_client::PolicyClient};
use serde::Serialize;

use crate::output::{self, Format};

/// `cellium policy` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Every rule with its origin, subject, peers, ports and verdict.
    Get {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
    /// Every cached peer selector with the identities it matches and its users.
    Selectors {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
}

#[derive(Debug, Serialize)]
struct PolicyView {
    revision: u64,
    rules: Vec<RuleView>,
    problems: Vec<String>,
}

#[derive(Debug, Serialize)]
struct RuleView {
    origin: String,
    subject: String,
    direction: String,
    verdict: String,
    peers: Vec<PeerView>,
    ports: Vec<String>,
    labels: Vec<String>,
}

#[derive(Debug, Serialize)]
struct PeerView {
    selector: String,
    identities: Vec<u32>,
}

#[derive(Debug, Serialize)]
struct SelectorsView {
    revision: u64,
    selectors: Vec<SelectorView>,
}

#[derive(Debug, Serialize)]
struct SelectorView {
    selector: String,
    identities: Vec<u32>,
    users: u32,
}

/// Runs a `cellium policy` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    let channel = cellium_api::connect(socket).await?;
    let mut client = PolicyClient::new(channel);
    match command {
        Command::Get { output } => {
            let resp = output::answer(client.get(GetPolicyRequest {}).await, "Policy.Get")?;
            let view = PolicyView {
                revision: resp.revision,
                problems: resp.problems,
                rules: resp
                    .rules
                    .into_iter()
                    .map(|r| RuleView {
                        origin: origin(&r.origin_kind, &r.origin_namespace, &r.origin_name),
                        subject: r.subject,
                        direction: r.direction,
                        verdict: r.verdict,
                        peers: r
                            .peers
                            .into_iter()
                            .map(|p| PeerView {
                                selector: p.selector,
                                identities: p.identities,
                            })
                            .collect(),
                        ports: r.ports,
                        labels: r.labels,
                    })
                    .collect(),
            };
            match output {
                Format::Json => output::print_json(&view),
                Format::Table => {
                    outln!("Revision {}", view.revision);
                    for p in &view.problems {
                        outln!("Problem: {p}");
                    }
                    outln!();
                    let rows: Vec<Vec<String>> = view
                        .rules
                        .iter()
                        .map(|r| {
                            vec![
                                r.origin.clone(),
                                r.direction.clone(),
                                r.verdict.clone(),
                                r.subject.clone(),
                                peers(&r.peers),
                                r.ports.join(","),
                                r.labels.join(","),
                            ]
                        })
                        .collect();
                    output::print_table(
                        &[
                            "ORIGIN",
                            "DIRECTION",
                            "VERDICT",
                            "SUBJECT",
                            "PEERS",
                            "PORTS",
                            "LABELS",
                        ],
                        &rows,
                    );
                    Ok(())
                }
            }
        }
        Command::Selectors { output } => {
            let resp = output::answer(
                client.selectors(PolicySelectorsRequest {}).await,
                "Policy.Selectors",
            )?;
            let view = SelectorsView {
                revision: resp.revision,
                selectors: resp
                    .selectors
                    .into_iter()
                    .map(|s| SelectorView {
                        selector: s.selector,
                        identities: s.identities,
                        users: s.users,
                    })
                    .collect(),
            };
            match output {
                Format::Json => output::print_json(&view),
                Format::Table => {
                    outln!("Revision {}", view.revision);
                    outln!();
                    let rows: Vec<Vec<String>> = view
                        .selectors
                        .iter()
                        .map(|s| vec![s.selector.clone(), s.users.to_string(), ids(&s.identities)])
                        .collect();
                    output::print_table(&["SELECTOR", "USERS", "IDENTITIES"], &rows);
                    Ok(())
                }
            }
        }
    }
}

fn origin(kind: &str, namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

fn ids(ids: &[u32]) -> String {
    if ids.is_empty() {
        return "-".to_string();
    }
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// `app=web (300,301); <any>`; a rule without peers (a default deny) shows `-`.
fn peers(peers: &[PeerView]) -> String {
    if peers.is_empty() {
        return "-".to_string();
    }
    peers
        .iter()
        .map(|p| {
            if p.selector == "<any>" {
                p.selector.clone()
            } else {
                format!("{} ({})", p.selector, ids(&p.identities))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_and_origins_read_well() {
        assert_eq!(
            origin("NetworkPolicy", "shop", "db"),
            "NetworkPolicy shop/db"
        );
        assert_eq!(
            origin("CiliumClusterwideNetworkPolicy", "", "x"),
            "CiliumClusterwideNetworkPolicy x"
        );
        let p = vec![
            PeerView {
                selector: "k8s:app=web".into(),
                identities: vec![300, 301],
            },
            PeerView {
                selector: "<any>".into(),
                identities: vec![0],
            },
        ];
        assert_eq!(peers(&p), "k8s:app=web (300,301); <any>");
        assert_eq!(peers(&[]), "-");
    }
}

//! `cellium status`: the agent's version, uptime, module health, what it means for pods, and the
//! notes an operator must know.

use std::path::Path;
use std::time::Duration;

use cellium_api::v1::{
    HealthLevel, HealthNode, Readiness, StatusRequest, agent_client::AgentClient,
};
use serde::Serialize;

use crate::output::{self, Format};

/// Arguments of `cellium status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show every module and job, not only those that are not OK.
    #[arg(long, short)]
    verbose: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: Format,
}

/// What `-o json` prints.
#[derive(Debug, Serialize)]
struct StatusView {
    version: String,
    uptime_seconds: u64,
    level: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pods: Option<PodsView>,
    notes: Vec<String>,
    modules: Vec<NodeView>,
}

/// What the health means for the node's pods, as the agent judges it.
#[derive(Debug, Serialize)]
struct PodsView {
    new_pods_can_be_set_up: bool,
    running_pods_affected: bool,
}

#[derive(Debug, Serialize)]
struct NodeView {
    id: String,
    level: &'static str,
    message: String,
    since: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    children: Vec<NodeView>,
}

/// Runs `cellium status`.
pub async fn exec(socket: &Path, args: Args) -> anyhow::Result<()> {
    let channel = cellium_api::connect(socket).await?;
    let status = output::answer(
        AgentClient::new(channel).status(StatusRequest {}).await,
        "Agent.Status",
    )?;
    let view = StatusView {
        version: status.version.clone(),
        uptime_seconds: status.uptime_ms / 1000,
        level: level_name(status.level()),
        pods: status.readiness.as_ref().map(pods_view),
        notes: status.notes.clone(),
        modules: status.modules.iter().map(node_view).collect(),
    };
    match args.output {
        Format::Json => output::print_json(&view),
        Format::Table => {
            print_summary(&view, &status.modules);
            if args.verbose {
                outln!();
                print_tree(&status.modules);
            }
            Ok(())
        }
    }
}

fn print_summary(view: &StatusView, modules: &[HealthNode]) {
    let uptime = humantime::format_duration(Duration::from_secs(view.uptime_seconds));
    let (total, unhealthy) = count(modules);
    outln!("Version:  {}", view.version);
    outln!("Uptime:   {uptime}");
    outln!(
        "Health:   {} ({} of {} modules and jobs OK)",
        view.level,
        total - unhealthy.len(),
        total
    );
    for node in unhealthy {
        outln!(
            "          {} {}: {}",
            node.id,
            level_name(node.level()),
            node.message
        );
    }
    if let Some(pods) = &view.pods {
        outln!("Pods:     {}", pods_line(pods));
    }
    for (i, note) in view.notes.iter().enumerate() {
        let label = if i == 0 { "Notes:" } else { "" };
        outln!("{label:<10}{note}");
    }
}

fn pods_view(r: &Readiness) -> PodsView {
    PodsView {
        new_pods_can_be_set_up: r.serves_add,
        running_pods_affected: r.running_pods_affected,
    }
}

fn pods_line(pods: &PodsView) -> &'static str {
    match (pods.new_pods_can_be_set_up, pods.running_pods_affected) {
        (true, _) => "new pods can be set up",
        (false, false) => "new pods cannot be set up; running pods are unaffected",
        (false, true) => {
            "new pods cannot be set up, and running pods may have limited connectivity"
        }
    }
}

/// Counts the nodes and collects those that are not OK and have no child that explains why.
fn count(nodes: &[HealthNode]) -> (usize, Vec<&HealthNode>) {
    let mut total = 0;
    let mut unhealthy = Vec::new();
    let mut stack: Vec<&HealthNode> = nodes.iter().collect();
    while let Some(node) = stack.pop() {
        total += 1;
        let child_explains = node.children.iter().any(|c| c.level == node.level);
        if node.level() != HealthLevel::Ok && !child_explains {
            unhealthy.push(node);
        }
        stack.extend(node.children.iter());
    }
    unhealthy.sort_by(|a, b| a.id.cmp(&b.id));
    (total, unhealthy)
}

fn print_tree(modules: &[HealthNode]) {
    let mut rows = Vec::new();
    for node in modules {
        push_rows(node, 0, &mut rows);
    }
    output::print_table(&["MODULE", "LEVEL", "SINCE", "MESSAGE"], &rows);
}

fn push_rows(node: &HealthNode, depth: usize, rows: &mut Vec<Vec<String>>) {
    rows.push(vec![
        format!("{}{}", "  ".repeat(depth), node.id),
        level_name(node.level()).to_string(),
        output::ago_ms(node.since_unix_ms),
        node.message.clone(),
    ]);
    for child in &node.children {
        push_rows(child, depth + 1, rows);
    }
}

fn node_view(node: &HealthNode) -> NodeView {
    NodeView {
        id: node.id.clone(),
        level: level_name(node.level()),
        message: node.message.clone(),
        since: output::rfc3339_ms(node.since_unix_ms),
        children: node.children.iter().map(node_view).collect(),
    }
}

fn level_name(level: HealthLevel) -> &'static str {
    match level {
        HealthLevel::Ok => "OK",
        HealthLevel::Degraded => "Degraded",
        HealthLevel::Stopped => "Stopped",
        HealthLevel::Unknown => "Unknown",
        HealthLevel::Unspecified => "Unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_carries_the_notes_and_what_health_means_for_pods() {
        let view = StatusView {
            version: "0.1.0".into(),
            uptime_seconds: 3,
            level: "Degraded",
            pods: Some(pods_view(&Readiness {
                serves_add: false,
                causes: vec![],
                running_pods_affected: true,
            })),
            notes: vec!["every endpoint is locked down: a recorded policy does not load".into()],
            modules: vec![],
        };
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(
            json["notes"],
            serde_json::json!(["every endpoint is locked down: a recorded policy does not load"])
        );
        assert_eq!(json["pods"]["running_pods_affected"], true);
        assert_eq!(
            pods_line(view.pods.as_ref().unwrap()),
            "new pods cannot be set up, and running pods may have limited connectivity"
        );
    }
}

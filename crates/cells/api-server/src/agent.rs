//! The `cellium.v1.Agent` service: version, uptime, the module health tree, what it means for
//! the node's pods, and the notes cells contribute.

use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use cellium_api::v1::{
    self, HealthLevel, Readiness, StatusRequest, StatusResponse, agent_server::Agent,
};
use cellium_api::{DatapathModules, StatusNote};
use cellium_hive::{Health, HealthNode, Level};
use tonic::{Request, Response, Status};

/// Answers `Agent` calls.
#[derive(Debug, Clone)]
pub struct AgentService {
    health: Health,
    started: Instant,
    notes: Vec<Arc<StatusNote>>,
    datapath: Option<Arc<DatapathModules>>,
}

impl AgentService {
    /// The service, with every note cells contribute and the agent's [`DatapathModules`].
    /// Without the latter (an agent that does not declare them), every module counts as one:
    /// a problem anywhere is reported as possibly affecting running pods, never the reverse.
    pub fn new(
        health: Health,
        notes: Vec<Arc<StatusNote>>,
        datapath: Option<Arc<DatapathModules>>,
    ) -> Arc<AgentService> {
        Arc::new(AgentService {
            health,
            started: Instant::now(),
            notes,
            datapath,
        })
    }

    fn response(&self) -> StatusResponse {
        let tree = self.health.tree();
        let modules: Vec<v1::HealthNode> = tree.iter().map(to_proto).collect();
        let level = modules
            .iter()
            .map(|m| m.level)
            .max()
            .unwrap_or(HealthLevel::Ok as i32);
        StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            level,
            modules,
            readiness: Some(readiness(&tree, self.datapath.as_deref())),
            notes: self.notes.iter().filter_map(|n| n.text()).collect(),
        }
    }
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(self.response()))
    }
}

/// Judges the tree: new pods can be set up only when every module is OK (any other level,
/// present or future, says no); running pods are affected when a cause lies in a datapath
/// module.
fn readiness(tree: &[HealthNode], datapath: Option<&DatapathModules>) -> Readiness {
    let mut causes = Vec::new();
    for root in tree {
        collect_causes(root, &mut causes);
    }
    causes.sort_by(|a, b| a.id.cmp(&b.id));
    Readiness {
        serves_add: causes.is_empty(),
        running_pods_affected: causes
            .iter()
            .any(|c| datapath.is_none_or(|d| d.contains_node(&c.id))),
        causes: causes
            .into_iter()
            .map(|n| v1::HealthNode {
                children: Vec::new(),
                ..to_proto(n)
            })
            .collect(),
    }
}

/// The nodes where a problem starts: a node that is not OK is explained by its children of the
/// same level (its effective level is the worst of theirs and its own); with none, it is the
/// cause itself.
fn collect_causes<'a>(node: &'a HealthNode, out: &mut Vec<&'a HealthNode>) {
    let level = node.status.level;
    if level == Level::Ok {
        return;
    }
    let explaining: Vec<&HealthNode> = node
        .children
        .iter()
        .filter(|c| c.status.level == level)
        .collect();
    if explaining.is_empty() {
        out.push(node);
    }
    for child in explaining {
        collect_causes(child, out);
    }
}

/// The proto's levels are ordered by severity, so `max` over them is "the worst".
fn level(level: Level) -> HealthLevel {
    match level {
        Level::Ok => HealthLevel::Ok,
        Level::Degraded => HealthLevel::Degraded,
        Level::Stopped => HealthLevel::Stopped,
    }
}

fn to_proto(node: &HealthNode) -> v1::HealthNode {
    let since = node
        .status
        .since
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    v1::HealthNode {
        id: node.id.clone(),
        level: level(node.status.level) as i32,
        message: node.status.message.clone(),
        since_unix_ms: since.as_millis() as i64,
        children: node.children.iter().map(to_proto).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_hive::Status as NodeStatus;
    use std::time::SystemTime;

    fn node(id: &str, level: Level, children: Vec<HealthNode>) -> HealthNode {
        HealthNode {
            id: id.into(),
            status: NodeStatus {
                level,
                message: format!("{id} says so"),
                since: SystemTime::now(),
            },
            children,
        }
    }

    #[test]
    fn all_ok_serves_add() {
        let tree = [node(
            "ipam",
            Level::Ok,
            vec![node("ipam.sync", Level::Ok, vec![])],
        )];
        let r = readiness(&tree, Some(&DatapathModules::new(["loader"])));
        assert!(r.serves_add);
        assert!(!r.running_pods_affected);
        assert!(r.causes.is_empty());
    }

    #[test]
    fn causes_are_the_deepest_nodes_of_the_level_and_only_datapath_ones_affect_running_pods() {
        let datapath = DatapathModules::new(["loader", "policy-repo"]);
        let tree = [
            node("loader", Level::Ok, vec![]),
            node(
                "ipam",
                Level::Degraded,
                vec![
                    node("ipam.restore", Level::Degraded, vec![]),
                    node("ipam.sync", Level::Ok, vec![]),
                    // A finished job under a degraded module is not what degrades it.
                    node("ipam.once", Level::Stopped, vec![]),
                ],
            ),
        ];
        let r = readiness(&tree, Some(&datapath));
        assert!(!r.serves_add);
        assert!(!r.running_pods_affected);
        let ids: Vec<&str> = r.causes.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["ipam.restore"]);
        assert_eq!(r.causes[0].message, "ipam.restore says so");

        let tree = [node(
            "policy-repo",
            Level::Stopped,
            vec![node("policy-repo.feed", Level::Stopped, vec![])],
        )];
        let r = readiness(&tree, Some(&datapath));
        assert!(!r.serves_add);
        assert!(r.running_pods_affected);
    }

    #[test]
    fn without_a_declaration_every_module_counts_as_datapath() {
        let tree = [node("ipam", Level::Degraded, vec![])];
        assert!(readiness(&tree, None).running_pods_affected);
    }
}

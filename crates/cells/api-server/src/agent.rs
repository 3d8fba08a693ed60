//! The `cellium.v1.Agent` service: version, uptime, the module health tree, what it means for
//! the node's pods, and the notes cells contribute.

use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use cellium_api::v1::{
    self, HealthLevel, Readiness, StatusRequest, StatusResponse, agent_server::Agent,
};
use cellium_api::{DatapathModules, StatusNote};
use cellium_hive::health::worst;
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
        StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            // The proto's numbers are not ordered by severity: the hive's levels are.
            level: level(worst(&tree)) as i32,
            modules: tree.iter().map(to_proto).collect(),
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

/// Judges the tree: new pods can be set up unless a module is Degraded or Stopped; running pods
/// are affected when such a cause lies in a datapath module. `Unknown` (started, no report yet:
/// a timer before its first run) does not keep pods out: nothing is known to be wrong, and the
/// API answering at all means the endpoints are restored.
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
    if matches!(level, Level::Ok | Level::Unknown) {
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

fn level(level: Level) -> HealthLevel {
    match level {
        Level::Ok => HealthLevel::Ok,
        Level::Degraded => HealthLevel::Degraded,
        Level::Stopped => HealthLevel::Stopped,
        Level::Unknown => HealthLevel::Unknown,
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
    use std::sync::Mutex;
    use std::time::SystemTime;

    use cellium_hive::Status as NodeStatus;
    use cellium_hive::{Hive, Module, Reporter};

    use super::*;

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
    fn ok_and_not_yet_reported_serve_add() {
        let tree = [
            node(
                "ipam",
                Level::Ok,
                vec![node("ipam.sync", Level::Ok, vec![])],
            ),
            node(
                "loader",
                Level::Unknown,
                vec![node("loader.conntrack-gc", Level::Unknown, vec![])],
            ),
        ];
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

    async fn status(health: &Health) -> StatusResponse {
        AgentService::new(health.clone(), Vec::new(), None)
            .status(Request::new(StatusRequest {}))
            .await
            .unwrap()
            .into_inner()
    }

    #[tokio::test]
    async fn a_module_that_has_not_reported_makes_the_agent_unknown_and_a_problem_degraded() {
        let slot: Arc<Mutex<Option<Reporter>>> = Arc::default();
        let s = slot.clone();
        let mut hive = Hive::new([
            Module::new("statedir", "x").into(),
            Module::new("ipam", "x")
                .invoke(move |r: Reporter| *s.lock().unwrap() = Some(r))
                .into(),
        ]);
        hive.start().await.unwrap();
        let health = hive.health();
        let answer = status(&health).await;
        assert_eq!(answer.level(), HealthLevel::Unknown);
        let levels: Vec<_> = answer
            .modules
            .iter()
            .map(|m| (m.id.as_str(), m.level()))
            .collect();
        assert_eq!(
            levels,
            [
                ("statedir", HealthLevel::Ok),
                ("ipam", HealthLevel::Unknown)
            ]
        );
        let reporter = slot.lock().unwrap().clone().unwrap();
        reporter.degraded("state record unreadable");
        assert_eq!(status(&health).await.level(), HealthLevel::Degraded);
        reporter.ok("1 pool");
        assert_eq!(status(&health).await.level(), HealthLevel::Ok);
        hive.stop().await.unwrap();
        // Stopped is the least severe level, though its number is the highest but one.
        assert_eq!(status(&health).await.level(), HealthLevel::Stopped);
    }
}

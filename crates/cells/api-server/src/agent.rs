//! The `cellium.v1.Agent` service: version, uptime and the module health tree.

use std::time::{Instant, UNIX_EPOCH};

use cellium_api::v1::{self, HealthLevel, StatusRequest, StatusResponse, agent_server::Agent};
use cellium_hive::{Health, HealthNode, Level};
use tonic::{Request, Response, Status};

/// Answers `Agent` calls.
#[derive(Debug, Clone)]
pub(crate) struct AgentService {
    pub(crate) health: Health,
    pub(crate) started: Instant,
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let modules: Vec<v1::HealthNode> = self.health.tree().iter().map(to_proto).collect();
        let level = modules
            .iter()
            .map(|m| m.level)
            .max()
            .unwrap_or(HealthLevel::Ok as i32);
        Ok(Response::new(StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            level,
            modules,
        }))
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

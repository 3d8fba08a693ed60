//! The `cellium.v1.Agent` service: version, uptime and the module health tree.

use std::time::{Instant, UNIX_EPOCH};

use cellium_api::v1::{self, HealthLevel, StatusRequest, StatusResponse, agent_server::Agent};
use cellium_hive::health::worst;
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
        // One reading of the tree, so the level and the modules agree.
        let tree = self.health.tree();
        Ok(Response::new(StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            // The proto's numbers are not ordered by severity: the hive's levels are.
            level: level(worst(&tree)) as i32,
            modules: tree.iter().map(to_proto).collect(),
        }))
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
    use std::sync::{Arc, Mutex};

    use cellium_hive::{Hive, Module, Reporter};

    use super::*;

    async fn status(health: &Health) -> StatusResponse {
        let service = AgentService {
            health: health.clone(),
            started: Instant::now(),
        };
        service
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

//! The agent's API as the benchmarks poll it: what the endpoints report they enforce
//! (`Endpoints.List`), the repository's revision (`Policy.Get`), and the wait until every
//! endpoint enforces a new revision.

use std::path::Path;
use std::time::{Duration, Instant};

use cellium_api::v1::agent_client::AgentClient;
use cellium_api::v1::endpoints_client::EndpointsClient;
use cellium_api::v1::policy_client::PolicyClient;
use cellium_api::v1::resources_client::ResourcesClient;
use cellium_api::v1::{
    EndpointState, GetPolicyRequest, HealthLevel, HealthNode, ListEndpointsRequest, StatusRequest,
};
use tonic::transport::Channel;

use crate::bench::interrupted;
use crate::error::{Error, Result};

/// How long a policy change may take to reach every endpoint before the wait fails.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// What the endpoints report, from one `Endpoints.List`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforced {
    /// Endpoints listed.
    pub endpoints: usize,
    /// Of which in state ready.
    pub ready: usize,
    /// The lowest policy revision an endpoint enforces (0 when none is listed).
    pub lowest: u64,
    /// The highest.
    pub highest: u64,
}

impl Enforced {
    /// Whether `n` endpoints are listed, every one ready, all enforcing revision `revision`.
    pub fn all_at(&self, n: usize, revision: u64) -> bool {
        self.endpoints == n
            && self.ready == n
            && (n == 0 || (self.lowest == revision && self.highest == revision))
    }
}

/// The API clients of one connection to the agent.
#[derive(Debug, Clone)]
pub struct Api {
    /// `cellium.v1.Endpoints`.
    pub endpoints: EndpointsClient<Channel>,
    /// `cellium.v1.Policy`.
    pub policy: PolicyClient<Channel>,
    /// `cellium.v1.Resources`.
    pub resources: ResourcesClient<Channel>,
    /// `cellium.v1.Agent`.
    pub agent: AgentClient<Channel>,
}

fn api_error(call: &'static str) -> impl FnOnce(tonic::Status) -> Error {
    move |s| Error::Api {
        call,
        reason: s.message().to_string(),
    }
}

impl Api {
    /// Connects to the agent's socket (one attempt).
    pub async fn connect(socket: &Path) -> Result<Api> {
        let channel = cellium_api::connect(socket).await.map_err(|e| Error::Api {
            call: "connect",
            reason: e.to_string(),
        })?;
        Ok(Api {
            endpoints: EndpointsClient::new(channel.clone()),
            policy: PolicyClient::new(channel.clone()),
            resources: ResourcesClient::new(channel.clone()),
            agent: AgentClient::new(channel),
        })
    }

    /// The repository's revision.
    pub async fn revision(&mut self) -> Result<u64> {
        Ok(self
            .policy
            .get(GetPolicyRequest {})
            .await
            .map_err(api_error("Policy.Get"))?
            .into_inner()
            .revision)
    }

    /// What the endpoints report they enforce.
    pub async fn enforced(&mut self) -> Result<Enforced> {
        let eps = self
            .endpoints
            .list(ListEndpointsRequest {})
            .await
            .map_err(api_error("Endpoints.List"))?
            .into_inner()
            .endpoints;
        let ready = EndpointState::Ready as i32;
        Ok(Enforced {
            endpoints: eps.len(),
            ready: eps.iter().filter(|e| e.state == ready).count(),
            lowest: eps.iter().map(|e| e.policy_revision).min().unwrap_or(0),
            highest: eps.iter().map(|e| e.policy_revision).max().unwrap_or(0),
        })
    }

    /// Every module whose health is not OK, as `id: message`.
    pub async fn unhealthy(&mut self) -> Result<Vec<String>> {
        let status = self
            .agent
            .status(StatusRequest {})
            .await
            .map_err(api_error("Agent.Status"))?
            .into_inner();
        let mut out = Vec::new();
        fn walk(node: &HealthNode, out: &mut Vec<String>) {
            let ok = node.level == HealthLevel::Ok as i32;
            if !ok && node.children.is_empty() {
                out.push(format!("{}: {}", node.id, node.message));
            }
            for child in &node.children {
                walk(child, out);
            }
        }
        for module in &status.modules {
            walk(module, &mut out);
        }
        Ok(out)
    }

    /// Waits until every endpoint reports one revision past `before` that is the repository's
    /// own, and returns the moment the endpoints first all reported it. Only `Endpoints.List`
    /// is polled while waiting (what a user would watch; it is asked again a millisecond after
    /// each answer); the repository's revision is read once they agree, and if it has moved
    /// on meanwhile, the wait goes on.
    pub async fn settled_after(&mut self, before: u64) -> Result<Instant> {
        let began = Instant::now();
        loop {
            interrupted()?;
            let seen = self.enforced().await?;
            let at = Instant::now();
            if seen.lowest > before
                && seen.lowest == seen.highest
                && self.revision().await? == seen.lowest
            {
                return Ok(at);
            }
            if began.elapsed() > SETTLE_TIMEOUT {
                return Err(Error::Unexpected {
                    what: "settling",
                    detail: format!(
                        "endpoints did not reach a revision past {before} within {SETTLE_TIMEOUT:?}"
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

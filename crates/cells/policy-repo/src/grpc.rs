//! The `cellium.v1.Policy` service.

use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::policy_server::{Policy as PolicyApi, PolicyServer};
use cellium_api::v1::{
    GetPolicyRequest, GetPolicyResponse, PolicyPeer, PolicyRuleInfo, PolicySelector,
    PolicySelectorsRequest, PolicySelectorsResponse,
};
use cellium_datapath_bpf::Verdict;
use tonic::{Request, Response, Status};

use crate::repository::PolicyRepository;

/// Serves the repository's rules and selectors over gRPC.
#[derive(Debug, Clone)]
pub struct PolicyService(Arc<PolicyRepository>);

impl PolicyService {
    /// The service as the API server mounts it.
    pub fn api(repo: Arc<PolicyRepository>) -> Arc<ApiService> {
        Arc::new(ApiService::new(PolicyServer::new(PolicyService(repo))))
    }
}

#[tonic::async_trait]
impl PolicyApi for PolicyService {
    async fn get(
        &self,
        _: Request<GetPolicyRequest>,
    ) -> Result<Response<GetPolicyResponse>, Status> {
        let rules = self
            .0
            .rules()
            .into_iter()
            .map(|r| PolicyRuleInfo {
                origin_kind: r.origin.kind.name().to_string(),
                origin_namespace: r.origin.namespace,
                origin_name: r.origin.name,
                subject: r.subject,
                direction: r.direction.to_string(),
                verdict: match r.verdict {
                    None => "default-deny",
                    Some(Verdict::Allow) => "allow",
                    Some(Verdict::Deny) => "deny",
                }
                .to_string(),
                peers: r
                    .peers
                    .into_iter()
                    .map(|(selector, identities)| PolicyPeer {
                        selector,
                        identities,
                    })
                    .collect(),
                ports: r.ports,
            })
            .collect();
        Ok(Response::new(GetPolicyResponse {
            revision: self.0.revision(),
            rules,
            problems: self.0.problems(),
        }))
    }

    async fn selectors(
        &self,
        _: Request<PolicySelectorsRequest>,
    ) -> Result<Response<PolicySelectorsResponse>, Status> {
        let selectors = self
            .0
            .selectors()
            .into_iter()
            .map(|s| PolicySelector {
                selector: s.selector,
                identities: s.identities,
                users: u32::try_from(s.users).unwrap_or(u32::MAX),
            })
            .collect();
        Ok(Response::new(PolicySelectorsResponse {
            revision: self.0.revision(),
            selectors,
        }))
    }
}

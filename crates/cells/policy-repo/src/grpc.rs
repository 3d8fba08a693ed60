//! The `cellium.v1.Policy` service.

use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::policy_server::{Policy as PolicyApi, PolicyServer};
use cellium_api::v1::{
    GetPolicyRequest, GetPolicyResponse, LabelKey, LabelKeysRequest, LabelKeysResponse, PolicyPeer,
    PolicyRuleInfo, PolicySelector, PolicySelectorsRequest, PolicySelectorsResponse,
};
use cellium_policy::Verdict;
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
                    Some(Verdict::AuditDeny) => "audit-deny",
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
                labels: r.labels,
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

    async fn label_keys(
        &self,
        _: Request<LabelKeysRequest>,
    ) -> Result<Response<LabelKeysResponse>, Status> {
        let keys = self
            .0
            .label_keys()
            .into_iter()
            .map(|k| {
                let used = k.used.unwrap_or_default();
                LabelKey {
                    key: k.key,
                    kept_by: k.kept_by.to_string(),
                    namespaces: used.namespaces.into_iter().flatten().collect(),
                    policies: used.policies.iter().map(ToString::to_string).collect(),
                    identities: u32::try_from(k.identities).unwrap_or(u32::MAX),
                }
            })
            .collect();
        Ok(Response::new(LabelKeysResponse {
            revision: self.0.revision(),
            keys,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_identity::Identities;
    use cellium_resources::Resources;

    #[tokio::test]
    async fn get_and_selectors_show_rules_origins_and_identities() {
        let resources = Resources::new();
        resources
            .apply(
                "p.yaml",
                "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: c}\nspec:\n  endpointSelector: {matchLabels: {app: db}}\n  ingressDeny: [{fromEntities: [host], toPorts: [{ports: [{port: '22', protocol: TCP}]}]}]\n",
            )
            .unwrap();
        let repo = Arc::new(PolicyRepository::with_parts(
            Identities::in_memory(),
            None,
            None,
        ));
        repo.sync_resources(&resources);
        let (snapshot, _) = Identities::in_memory().snapshot_and_subscribe();
        repo.sync_identities(&snapshot);
        let svc = PolicyService(repo.clone());
        let got = svc
            .get(Request::new(GetPolicyRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.revision, repo.revision());
        let verdicts: Vec<&str> = got.rules.iter().map(|r| r.verdict.as_str()).collect();
        assert_eq!(verdicts, vec!["default-deny", "deny"]);
        let deny = &got.rules[1];
        assert_eq!(
            (
                deny.origin_kind.as_str(),
                deny.origin_namespace.as_str(),
                deny.origin_name.as_str()
            ),
            ("CiliumClusterwideNetworkPolicy", "", "c")
        );
        assert_eq!(deny.direction, "ingress");
        assert_eq!(deny.ports, vec!["22/tcp"]);
        assert_eq!(deny.peers[0].selector, "reserved:host");
        assert_eq!(deny.peers[0].identities, vec![1]);
        let sels = svc
            .selectors(Request::new(PolicySelectorsRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(sels.selectors.len(), 1);
        let keys = svc
            .label_keys(Request::new(LabelKeysRequest {}))
            .await
            .unwrap()
            .into_inner()
            .keys;
        let app = keys.iter().find(|k| k.key == "app").unwrap();
        assert_eq!(app.kept_by, "filter");
        assert!(app.namespaces.is_empty(), "cluster-wide: every namespace");
        assert_eq!(app.policies, ["CiliumClusterwideNetworkPolicy c"]);
        assert_eq!(
            (
                sels.selectors[0].users,
                sels.selectors[0].identities.clone()
            ),
            (1, vec![1])
        );
    }
}

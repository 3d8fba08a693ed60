//! The `cellium.v1.Identity` service.

use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::identity_server::{Identity as IdentityApi, IdentityServer};
use cellium_api::v1::{
    GetIdentityRequest, IdentityScope, ListIdentitiesRequest, ListIdentitiesResponse,
    SecurityIdentity,
};
use tonic::{Request, Response, Status};

use crate::identities::{Identities, IdentityInfo};
use crate::identity::Scope;

/// Serves the identities over gRPC.
#[derive(Debug, Clone)]
pub struct IdentityService(Arc<Identities>);

impl IdentityService {
    /// The service as the API server mounts it.
    pub fn api(identities: Arc<Identities>) -> Arc<ApiService> {
        Arc::new(ApiService::new(IdentityServer::new(IdentityService(
            identities,
        ))))
    }
}

#[tonic::async_trait]
impl IdentityApi for IdentityService {
    async fn list(
        &self,
        _: Request<ListIdentitiesRequest>,
    ) -> Result<Response<ListIdentitiesResponse>, Status> {
        let identities = self.0.list().into_iter().map(message).collect();
        Ok(Response::new(ListIdentitiesResponse { identities }))
    }

    async fn get(
        &self,
        req: Request<GetIdentityRequest>,
    ) -> Result<Response<SecurityIdentity>, Status> {
        let id = req.into_inner().id;
        self.0
            .info(id)
            .map(|i| Response::new(message(i)))
            .ok_or_else(|| Status::not_found(format!("no identity has the number {id}")))
    }
}

fn message(info: IdentityInfo) -> SecurityIdentity {
    let scope = match info.identity.scope() {
        Scope::Reserved => IdentityScope::Reserved,
        Scope::Cluster => IdentityScope::Cluster,
        Scope::Local => IdentityScope::Local,
    };
    SecurityIdentity {
        id: info.identity.id,
        labels: info.identity.labels.to_strings(),
        references: info.references,
        scope: scope.into(),
        restored: info.restored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn identities_are_served_with_scope_and_references() {
        let ids = Identities::in_memory();
        let web = ids.allocate(&"k8s:app=web".parse().unwrap()).unwrap();
        ids.allocate(&web.labels).unwrap();
        let net = ids
            .allocate(&cellium_labels::Labels::for_cidr(
                "10.0.0.0/8".parse().unwrap(),
            ))
            .unwrap();
        let svc = IdentityService(ids);
        let list = svc
            .list(Request::new(ListIdentitiesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .identities;
        assert_eq!(list.len(), 12);
        assert_eq!(list[0].labels, vec!["reserved:host"]);
        assert_eq!(list[0].scope(), IdentityScope::Reserved);
        let got = |id| svc.get(Request::new(GetIdentityRequest { id }));
        let w = got(web.id).await.unwrap().into_inner();
        assert_eq!((w.references, w.scope()), (2, IdentityScope::Cluster));
        assert_eq!(w.labels, vec!["k8s:app=web"]);
        let n = got(net.id).await.unwrap().into_inner();
        assert_eq!(n.scope(), IdentityScope::Local);
        let err = got(300).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(err.message(), "no identity has the number 300");
    }
}

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
            .list()
            .into_iter()
            .find(|i| i.identity.id == id)
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

//! The `cellium.v1.Resources` service: apply and delete YAML.

use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::resources_server::{Resources as ResourcesApi, ResourcesServer};
use cellium_api::v1::{ApplyRequest, ApplyResponse, ObjectResult};
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::resources::{Outcome, Resources};

/// Serves apply and delete over gRPC.
#[derive(Debug, Clone)]
pub struct ResourcesService(Arc<Resources>);

impl ResourcesService {
    /// The service as the API server mounts it.
    pub fn api(resources: Arc<Resources>) -> Arc<ApiService> {
        Arc::new(ApiService::new(ResourcesServer::new(ResourcesService(
            resources,
        ))))
    }
}

#[tonic::async_trait]
impl ResourcesApi for ResourcesService {
    async fn apply(&self, req: Request<ApplyRequest>) -> Result<Response<ApplyResponse>, Status> {
        let req = req.into_inner();
        let outcomes = self.0.apply(&req.source, &req.yaml).map_err(status)?;
        Ok(Response::new(response(outcomes)))
    }

    async fn delete(&self, req: Request<ApplyRequest>) -> Result<Response<ApplyResponse>, Status> {
        let req = req.into_inner();
        let outcomes = self.0.delete(&req.source, &req.yaml).map_err(status)?;
        Ok(Response::new(response(outcomes)))
    }
}

fn status(e: Error) -> Status {
    Status::invalid_argument(e.to_string())
}

fn response(outcomes: Vec<Outcome>) -> ApplyResponse {
    ApplyResponse {
        objects: outcomes
            .into_iter()
            .map(|o| ObjectResult {
                kind: o.kind.to_string(),
                namespace: o.key.namespace,
                name: o.key.name,
                action: o.action.to_string(),
            })
            .collect(),
    }
}

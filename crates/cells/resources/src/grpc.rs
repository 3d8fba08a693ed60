//! The `cellium.v1.Resources` service: apply and delete YAML.
//!
//! The work runs on a blocking thread, not on the server's runtime, and stops when the request
//! is abandoned: hyper drops a request's handler future when its client resets the stream or
//! closes the connection, and dropping the future here cancels the work (a guard cancels the
//! token the apply path checks between documents and before it records anything). So a
//! client that went away never leaves work running or the apply lock held behind it.

use std::io::ErrorKind;
use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::resources_server::{Resources as ResourcesApi, ResourcesServer};
use cellium_api::v1::{ApplyRequest, ApplyResponse, ObjectResult};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use crate::error::Error;
use crate::record::error_chain;
use crate::resources::{Outcome, Resources};

/// Room for the request's other fields besides the YAML text.
const MESSAGE_OVERHEAD: usize = 64 * 1024;

/// Serves apply and delete over gRPC.
#[derive(Debug, Clone)]
pub struct ResourcesService(Arc<Resources>);

impl ResourcesService {
    /// The service as the API server mounts it; it takes requests as large as
    /// `apply-max-bytes` allows.
    pub fn api(resources: Arc<Resources>) -> Arc<ApiService> {
        let max = resources
            .limits()
            .max_bytes
            .saturating_add(MESSAGE_OVERHEAD);
        Arc::new(ApiService::new(
            ResourcesServer::new(ResourcesService(resources)).max_decoding_message_size(max),
        ))
    }

    async fn run(
        &self,
        req: Request<ApplyRequest>,
        verb: fn(&Resources, &str, &str, &CancellationToken) -> crate::Result<Vec<Outcome>>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let req = req.into_inner();
        let cancel = CancellationToken::new();
        // Dropped with this future when the client goes away, which cancels the work.
        let _abandon = cancel.clone().drop_guard();
        let resources = self.0.clone();
        let source = req.source.clone();
        let outcomes =
            tokio::task::spawn_blocking(move || verb(&resources, &req.source, &req.yaml, &cancel))
                .await
                .map_err(|e| Status::internal(format!("{source}: the apply task failed: {e}")))?
                .map_err(status)?;
        Ok(Response::new(response(outcomes)))
    }
}

#[tonic::async_trait]
impl ResourcesApi for ResourcesService {
    async fn apply(&self, req: Request<ApplyRequest>) -> Result<Response<ApplyResponse>, Status> {
        self.run(req, Resources::apply_cancellable).await
    }

    async fn delete(&self, req: Request<ApplyRequest>) -> Result<Response<ApplyResponse>, Status> {
        self.run(req, Resources::delete_cancellable).await
    }
}

/// The status of a refused request: its message is the whole error chain (for a failed
/// record, the file and the errno); its code says whose fault it was.
fn status(e: Error) -> Status {
    let code = match &e {
        Error::Record { .. } => match e.os_error().map(std::io::Error::kind) {
            Some(ErrorKind::StorageFull | ErrorKind::QuotaExceeded) => Code::ResourceExhausted,
            _ => Code::Unavailable,
        },
        Error::TooLarge { .. } => Code::ResourceExhausted,
        Error::Cancelled => Code::Cancelled,
        _ => Code::InvalidArgument,
    };
    Status::new(code, error_chain(&e))
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

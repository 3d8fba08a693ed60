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

use crate::apply::record::error_chain;
use crate::error::Error;
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
        Error::OwnedByApiServer { .. } => Code::FailedPrecondition,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cellium_api::v1::resources_client::ResourcesClient;
    use tokio::net::UnixListener;
    use tokio_stream::wrappers::UnixListenerStream;

    use super::*;
    use crate::limits::Limits;
    use crate::resources::Store;
    use crate::resources::tests::default_range;

    /// `count` NetworkPolicies in one text: decoding and checking them takes seconds.
    fn policies(count: usize) -> String {
        (0..count)
            .map(|i| format!("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p{i}}}\nspec:\n  podSelector: {{matchLabels: {{app: a{i}}}}}\n  ingress: [{{from: [{{podSelector: {{matchLabels: {{app: b{i}}}}}}}], ports: [{{port: {}}}]}}]\n", 1 + i % 60000))
            .collect::<Vec<_>>()
            .join("---\n")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_whose_client_went_away_is_abandoned_and_changes_nothing() {
        let limits = Limits {
            max_bytes: 64 << 20,
            max_depth: 64,
        };
        let resources = Arc::new(Resources::build(
            Store::Memory,
            default_range(),
            limits,
            None,
        ));
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("api.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let server = ResourcesServer::new(ResourcesService(resources.clone()))
            .max_decoding_message_size(limits.max_bytes);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );

        // About 20 MB: seconds of work, far more than it takes to send.
        let text = policies(100_000);
        let channel = cellium_api::connect(&socket).await.unwrap();
        let client = tokio::spawn(async move {
            let mut client = ResourcesClient::new(channel).max_encoding_message_size(usize::MAX);
            let request = ApplyRequest {
                source: "many.yaml".into(),
                yaml: text,
            };
            client.apply(request).await
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !client.is_finished(),
            "the apply finished before the client left"
        );
        // The client goes away: its connection closes.
        client.abort();
        let _ = client.await;

        // The server drops the handler, which cancels the work: it gives up without having
        // applied anything, instead of finishing it for nobody.
        for _ in 0..600 {
            if resources.abandoned_requests() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            resources.abandoned_requests(),
            1,
            "the work was not abandoned"
        );
        assert!(resources.network_policies.is_empty());

        // The agent serves the next request.
        let mut client = ResourcesClient::new(cellium_api::connect(&socket).await.unwrap());
        let reply = client
            .apply(ApplyRequest {
                source: "one.yaml".into(),
                yaml: policies(1),
            })
            .await
            .unwrap();
        assert_eq!(reply.into_inner().objects[0].action, "created");
    }

    #[test]
    fn refusals_carry_the_whole_chain_and_a_fitting_code() {
        let full = Error::Record {
            origin: "a.yaml".into(),
            source: cellium_statedir::Error::Io {
                op: "write",
                path: "/s/resources/journal/.1.json.tmp".into(),
                source: std::io::Error::from_raw_os_error(28),
            },
        };
        let s = status(full);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "a.yaml: cannot record the change in the state directory; nothing changed: write /s/resources/journal/.1.json.tmp: No space left on device (os error 28)"
        );
        let ro = Error::Record {
            origin: "a.yaml".into(),
            source: cellium_statedir::Error::Io {
                op: "create",
                path: "/s/x".into(),
                source: std::io::Error::from_raw_os_error(30),
            },
        };
        assert_eq!(status(ro).code(), Code::Unavailable);
        assert_eq!(
            status(Error::Empty("e".into())).code(),
            Code::InvalidArgument
        );
    }
}

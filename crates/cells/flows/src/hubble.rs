//! `observer.Observer`: the observer under the name Hubble's clients call.
//!
//! The messages of `cellium.v1.Observer` keep Hubble's field numbers and types (our additions
//! are numbered from 1000), so the same service answers Hubble's method paths
//! (`/observer.Observer/GetFlows`, `/observer.Observer/ServerStatus`): requests are handed to
//! it with the path's service name rewritten, nothing else.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use cellium_api::ApiService;
use cellium_api::v1::observer_server::ObserverServer;
use tonic::body::Body;
use tonic::server::NamedService;

use crate::grpc::ObserverService;
use crate::observer::Flows;

/// Hubble's service name.
pub const HUBBLE_SERVICE: &str = "observer.Observer";

/// The observer under Hubble's service name.
#[derive(Debug, Clone)]
pub struct HubbleObserver(ObserverServer<ObserverService>);

impl HubbleObserver {
    /// The service as the API server mounts it.
    pub fn api(flows: Arc<Flows>) -> Arc<ApiService> {
        Arc::new(ApiService::new(HubbleObserver(ObserverServer::new(
            ObserverService::new(flows),
        ))))
    }
}

impl NamedService for HubbleObserver {
    const NAME: &'static str = HUBBLE_SERVICE;
}

/// `/observer.Observer/GetFlows` -> `/cellium.v1.Observer/GetFlows`; other paths unchanged.
fn rewrite(uri: &http::Uri) -> Option<http::Uri> {
    let method = uri.path().strip_prefix(&format!("/{HUBBLE_SERVICE}/"))?;
    let path = format!(
        "/{}/{method}",
        <ObserverServer<ObserverService> as NamedService>::NAME
    );
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

impl tower::Service<http::Request<Body>> for HubbleObserver {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = <ObserverServer<ObserverService> as tower::Service<http::Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<http::Request<Body>>::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if let Some(uri) = rewrite(req.uri()) {
            *req.uri_mut() = uri;
        }
        tower::Service::<http::Request<Body>>::call(&mut self.0, req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hubble_paths_become_ours() {
        let uri: http::Uri = "http://agent/observer.Observer/GetFlows".parse().unwrap();
        assert_eq!(
            rewrite(&uri).unwrap().path(),
            "/cellium.v1.Observer/GetFlows"
        );
        let other: http::Uri = "http://agent/cellium.v1.Agent/Status".parse().unwrap();
        assert!(rewrite(&other).is_none());
    }
}

//! The `cellium.v1.Services` service: the frontends and their backends.

use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::services_server::{Services as ServicesApi, ServicesServer};
use cellium_api::v1::{ListServicesRequest, ListServicesResponse, ServiceBackend, ServiceFrontend};
use tonic::{Request, Response, Status};

use crate::desired::PlannedBackend;
use crate::service_lb::ServiceLb;
use crate::sync::FrontendStatus;

/// Serves the frontends over gRPC.
#[derive(Debug, Clone)]
pub struct ServicesService(Arc<ServiceLb>);

impl ServicesService {
    /// The service as the API server mounts it.
    pub fn api(lb: Arc<ServiceLb>) -> Arc<ApiService> {
        Arc::new(ApiService::new(ServicesServer::new(ServicesService(lb))))
    }
}

#[tonic::async_trait]
impl ServicesApi for ServicesService {
    async fn list(
        &self,
        _: Request<ListServicesRequest>,
    ) -> Result<Response<ListServicesResponse>, Status> {
        // Before the first pass after a start there is no status yet, though the pinned
        // maps serve: wait for it rather than answer that nothing is programmed.
        self.0.first_pass().await;
        let frontends = self.0.frontends().iter().map(to_proto).collect();
        Ok(Response::new(ListServicesResponse { frontends }))
    }
}

/// A frontend's status as the API sends it.
pub fn to_proto(s: &FrontendStatus) -> ServiceFrontend {
    let plan = &s.plan;
    let listed = |planned: &[PlannedBackend], ids: &[u32]| {
        planned
            .iter()
            .enumerate()
            .map(|(i, b)| ServiceBackend {
                id: ids.get(i).copied().unwrap_or(0),
                ip: b.backend.addr.to_string(),
                port: u32::from(b.backend.port),
                source: b.source.clone(),
            })
            .collect()
    };
    ServiceFrontend {
        namespace: plan.service.namespace.clone(),
        name: plan.service.name.clone(),
        port_name: plan.port.name.clone(),
        vip: plan.frontend.vip.to_string(),
        port: u32::from(plan.frontend.port),
        protocol: plan.port.protocol.to_string(),
        target_port: plan.port.target_port.to_string(),
        backends_from: plan.from.to_string(),
        rev_nat_id: u32::from(s.rev_nat_id),
        backends: listed(&plan.backends, &s.backend_ids),
        draining: listed(&plan.draining, &s.draining_ids),
        error: s.error.clone().unwrap_or_default(),
        kind: plan.kind.to_string(),
        traffic_policy: if plan.local { "Local" } else { "Cluster" }.into(),
        algorithm: plan.algorithm.to_string(),
        affinity_timeout_seconds: plan.session_affinity.unwrap_or(0),
    }
}

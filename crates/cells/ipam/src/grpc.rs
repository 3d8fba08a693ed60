//! The `cellium.v1.Ipam` service.

use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::ipam_server::{Ipam as IpamApi, IpamServer};
use std::time::UNIX_EPOCH;

use cellium_api::v1::{IpAllocation, IpPool, IpQuarantined, ListIpamRequest, ListIpamResponse};
use tonic::{Request, Response, Status};

use crate::ipam::Ipam;

/// Serves the allocator's pools over gRPC.
#[derive(Debug, Clone)]
pub struct IpamService(Arc<Ipam>);

impl IpamService {
    /// The service as the API server mounts it.
    pub fn api(ipam: Arc<Ipam>) -> Arc<ApiService> {
        Arc::new(ApiService::new(IpamServer::new(IpamService(ipam))))
    }
}

#[tonic::async_trait]
impl IpamApi for IpamService {
    async fn list(
        &self,
        _: Request<ListIpamRequest>,
    ) -> Result<Response<ListIpamResponse>, Status> {
        let quarantined = self.0.quarantined();
        let pools = self
            .0
            .pools()
            .into_iter()
            .map(|p| IpPool {
                quarantined: quarantined
                    .iter()
                    .filter(|(ip, _)| p.cidr.contains(ip))
                    .map(|(ip, until)| IpQuarantined {
                        ip: ip.to_string(),
                        until_unix_ms: until
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as i64),
                    })
                    .collect(),
                cidr: p.cidr.to_string(),
                source: p.source,
                capacity: p.capacity,
                used: p.used,
                router: p.router.to_string(),
                allocations: p
                    .allocations
                    .into_iter()
                    .map(|(ip, owner)| IpAllocation {
                        ip: ip.to_string(),
                        owner,
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(ListIpamResponse { pools }))
    }
}

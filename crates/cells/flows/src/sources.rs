//! The agent's [`Sources`]: the endpoint manager, identities, the ipcache and svc-lb.

use std::net::IpAddr;
use std::sync::Arc;

use cellium_endpoint_manager::EndpointManager;
use cellium_identity::{Identities, Reserved};
use cellium_ipcache::Ipcache;
use cellium_labels::Labels;
use cellium_svc_lb::ServiceLb;
use tokio::sync::watch;

use crate::enrich::{LocalEndpoint, PolicyQuestion, Sources};
use crate::flow::{EndpointRef, PolicyRef, ServiceRef};

/// Reads the other cells; those an agent lacks are simply not asked.
#[derive(Debug)]
pub struct CellSources {
    endpoints: Arc<EndpointManager>,
    changes: watch::Receiver<u64>,
    identities: Option<Arc<Identities>>,
    ipcache: Option<Arc<Ipcache>>,
    services: Option<Arc<ServiceLb>>,
}

impl CellSources {
    /// Sources over the given cells.
    pub fn new(
        endpoints: Arc<EndpointManager>,
        identities: Option<Arc<Identities>>,
        ipcache: Option<Arc<Ipcache>>,
        services: Option<Arc<ServiceLb>>,
    ) -> CellSources {
        CellSources {
            changes: endpoints.changes(),
            endpoints,
            identities,
            ipcache,
            services,
        }
    }
}

impl Sources for CellSources {
    fn endpoints_version(&self) -> u64 {
        *self.changes.borrow()
    }

    fn endpoints(&self) -> Vec<LocalEndpoint> {
        self.endpoints
            .snapshot()
            .iter()
            .map(|ep| LocalEndpoint {
                addresses: ep.addresses.iter().map(|a| a.ip).collect(),
                endpoint: EndpointRef {
                    id: ep.id,
                    namespace: ep
                        .pod
                        .as_ref()
                        .map(|p| p.namespace.clone())
                        .unwrap_or_default(),
                    pod_name: ep.pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
                },
                identity: ep.identity,
                labels: ep.labels.clone(),
            })
            .collect()
    }

    fn identity_labels(&self, id: u32) -> Option<Labels> {
        match &self.identities {
            Some(identities) => identities.get(id).map(|i| i.labels.clone()),
            None => Reserved::from_id(id).map(Reserved::labels),
        }
    }

    fn ipcache_identity(&self, ip: IpAddr) -> Option<u32> {
        self.ipcache.as_ref()?.lookup(ip).map(|(_, id, _)| id)
    }

    fn world_identity(&self, ip: IpAddr) -> u32 {
        match &self.ipcache {
            Some(ipc) => ipc.world_identity(ip),
            None => Reserved::World.id(),
        }
    }

    fn services(&self) -> Vec<(u16, ServiceRef)> {
        let Some(lb) = &self.services else {
            return Vec::new();
        };
        lb.frontends()
            .into_iter()
            .filter(|f| f.rev_nat_id != 0)
            .map(|f| {
                (
                    f.rev_nat_id,
                    ServiceRef {
                        namespace: f.plan.service.namespace.clone(),
                        name: f.plan.service.name.clone(),
                    },
                )
            })
            .collect()
    }

    fn decided_by(&self, q: &PolicyQuestion) -> Vec<PolicyRef> {
        let Some(policy) = self.endpoints.policy_of(q.endpoint_id) else {
            return Vec::new();
        };
        policy
            .decided_by(q.outcome, q.direction, q.peer_identity, q.protocol, q.port)
            .iter()
            .map(|o| PolicyRef {
                kind: o.kind.to_string(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                log: o.log.clone(),
            })
            .collect()
    }
}

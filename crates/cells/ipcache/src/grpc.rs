//! The `cellium.v1.Ipcache` service.

use std::net::IpAddr;
use std::sync::Arc;

use cellium_api::ApiService;
use cellium_api::v1::ipcache_server::{Ipcache as IpcacheApi, IpcacheServer};
use cellium_api::v1::{
    GetIpcacheRequest, IpcacheClaim, IpcacheEntry as EntryMessage, IpcacheSource,
    ListIpcacheRequest, ListIpcacheResponse,
};
use tonic::{Request, Response, Status};

use crate::ipcache::Ipcache;
use crate::source::Source;
use crate::table::IpcacheEntry;

/// Serves the ipcache over gRPC.
#[derive(Debug, Clone)]
pub struct IpcacheService(Arc<Ipcache>);

impl IpcacheService {
    /// The service as the API server mounts it.
    pub fn api(ipcache: Arc<Ipcache>) -> Arc<ApiService> {
        Arc::new(ApiService::new(IpcacheServer::new(IpcacheService(ipcache))))
    }
}

#[tonic::async_trait]
impl IpcacheApi for IpcacheService {
    async fn list(
        &self,
        _: Request<ListIpcacheRequest>,
    ) -> Result<Response<ListIpcacheResponse>, Status> {
        let entries = self.0.list().into_iter().map(message).collect();
        Ok(Response::new(ListIpcacheResponse { entries }))
    }

    async fn get(&self, req: Request<GetIpcacheRequest>) -> Result<Response<EntryMessage>, Status> {
        let text = req.into_inner().ip;
        let ip: IpAddr = text.trim().parse().map_err(|_| {
            Status::invalid_argument(format!("{text:?} is not an IPv4 or IPv6 address"))
        })?;
        let (prefix, _, _) = self.0.lookup(ip).ok_or_else(|| {
            Status::not_found(format!(
                "no prefix contains {ip}: the datapath sees it as world (identity 2)"
            ))
        })?;
        self.0
            .get(prefix)
            .map(|e| Response::new(message(e)))
            .ok_or_else(|| Status::not_found(format!("{prefix} was removed meanwhile")))
    }
}

fn source(s: Source) -> i32 {
    match s {
        Source::Endpoint => IpcacheSource::Endpoint,
        Source::Host => IpcacheSource::Host,
        Source::Policy => IpcacheSource::Policy,
    }
    .into()
}

fn message(e: IpcacheEntry) -> EntryMessage {
    EntryMessage {
        prefix: e.prefix.to_string(),
        identity: e.identity,
        source: source(e.source),
        shadowed: e
            .shadowed
            .into_iter()
            .map(|(s, identity)| IpcacheClaim {
                source: source(s),
                identity,
            })
            .collect(),
    }
}

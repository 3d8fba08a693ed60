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
                "no prefix holds {ip}: the datapath sees it as world (identity {})",
                self.0.world_identity(ip)
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
        Source::Remote => IpcacheSource::Remote,
    }
    .into()
}

fn message(e: IpcacheEntry) -> EntryMessage {
    EntryMessage {
        prefix: e.prefix.to_string(),
        identity: e.identity,
        tunnel_endpoint: e
            .tunnel_endpoint
            .map(|ip| ip.to_string())
            .unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_are_served_with_longest_prefix_lookups() {
        let ipc = Ipcache::in_memory();
        ipc.upsert("10.0.0.0/8".parse().unwrap(), 16_777_216, Source::Policy)
            .unwrap();
        ipc.upsert("10.0.0.5/32".parse().unwrap(), 16_777_217, Source::Policy)
            .unwrap();
        ipc.upsert("10.0.0.5/32".parse().unwrap(), 300, Source::Endpoint)
            .unwrap();
        let svc = IpcacheService(ipc);
        let list = svc
            .list(Request::new(ListIpcacheRequest {}))
            .await
            .unwrap()
            .into_inner()
            .entries;
        assert_eq!(list.len(), 2);
        let get = |ip: &str| svc.get(Request::new(GetIpcacheRequest { ip: ip.to_string() }));
        let e = get("10.0.0.5").await.unwrap().into_inner();
        assert_eq!((e.prefix.as_str(), e.identity), ("10.0.0.5/32", 300));
        assert_eq!(e.source(), IpcacheSource::Endpoint);
        assert_eq!(e.shadowed.len(), 1);
        assert_eq!(e.shadowed[0].source(), IpcacheSource::Policy);
        let e = get("10.1.2.3").await.unwrap().into_inner();
        assert_eq!(e.prefix, "10.0.0.0/8");
        let err = get("11.0.0.1").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert!(
            err.message().contains("world (identity 2)"),
            "{}",
            err.message()
        );
        let err = get("10.0.0").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }
}

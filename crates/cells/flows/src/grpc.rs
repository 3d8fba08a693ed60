//! The `cellium.v1.Observer` service: `GetFlows` and `ServerStatus`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use cellium_api::ApiService;
use cellium_api::v1::observer_server::{Observer as ObserverApi, ObserverServer};
use cellium_api::v1::{
    self, EndpointDrops, GetEndpointDropsRequest, GetFlowsRequest, GetFlowsResponse, LostEvent,
    LostEventSource, ServerStatusRequest, ServerStatusResponse, get_flows_response::ResponseTypes,
};
use futures::Stream;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::convert::{self, system_time, timestamp};
use crate::filter::Filters;
use crate::flow::Flow;
use crate::observer::Flows;
use crate::ring::Item;

/// Serves the observer over gRPC.
#[derive(Debug, Clone)]
pub struct ObserverService(Arc<Flows>);

impl ObserverService {
    /// The service as the API server mounts it.
    pub fn api(flows: Arc<Flows>) -> Arc<ApiService> {
        Arc::new(ApiService::new(ObserverServer::new(ObserverService(flows))))
    }

    /// The service over `flows`, for tests.
    pub fn new(flows: Arc<Flows>) -> ObserverService {
        ObserverService(flows)
    }
}

type FlowStream = Pin<Box<dyn Stream<Item = Result<GetFlowsResponse, Status>> + Send>>;

/// What one request asks for, checked once.
struct Query {
    filters: Filters,
    since: Option<SystemTime>,
    until: Option<SystemTime>,
}

impl Query {
    fn matches(&self, flow: &Flow) -> bool {
        self.since.is_none_or(|t| flow.time >= t)
            && self.until.is_none_or(|t| flow.time <= t)
            && self.filters.matches(flow)
    }
}

fn response(flow: &Flow, node: &str) -> GetFlowsResponse {
    GetFlowsResponse {
        response_types: Some(ResponseTypes::Flow(convert::to_proto(flow, node))),
        node_name: node.to_string(),
        time: Some(timestamp(flow.time)),
    }
}

fn lost(source: LostEventSource, n: u64, node: &str) -> GetFlowsResponse {
    GetFlowsResponse {
        response_types: Some(ResponseTypes::LostEvents(LostEvent {
            source: source as i32,
            num_events_lost: n,
        })),
        node_name: node.to_string(),
        time: Some(timestamp(SystemTime::now())),
    }
}

/// The ring's flows a request selects: the last `number` (the first with `first`) of those
/// that match; all of them when `number` is 0 and the request does not follow.
fn backlog<'a>(
    flows: &'a [Arc<Flow>],
    query: &Query,
    number: u64,
    first: bool,
    follow: bool,
) -> Vec<&'a Arc<Flow>> {
    let matching: Vec<&Arc<Flow>> = flows.iter().filter(|f| query.matches(f)).collect();
    let n = match (number, follow) {
        (0, true) => 0,
        (0, false) => matching.len(),
        (n, _) => usize::try_from(n).unwrap_or(usize::MAX).min(matching.len()),
    };
    if first {
        matching[..n].to_vec()
    } else {
        matching[matching.len() - n..].to_vec()
    }
}

#[tonic::async_trait]
impl ObserverApi for ObserverService {
    type GetFlowsStream = FlowStream;

    async fn get_flows(
        &self,
        req: Request<GetFlowsRequest>,
    ) -> Result<Response<FlowStream>, Status> {
        if !self.0.enabled() {
            return Err(Status::unavailable(
                "the observer is off on this agent (enable-hubble: false)",
            ));
        }
        let req = req.into_inner();
        let filters = Filters::new(&req.whitelist, &req.blacklist)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let query = Query {
            filters,
            since: req.since.as_ref().map(system_time),
            until: req.until.as_ref().map(system_time),
        };
        let sub = self.0.ring().subscribe();
        let node = self.0.node_name().to_string();
        let (tx, rx) = mpsc::channel(256);
        let selected: Vec<GetFlowsResponse> =
            backlog(&sub.backlog, &query, req.number, req.first, req.follow)
                .into_iter()
                .map(|f| response(f, &node))
                .collect();
        let flows = self.0.clone();
        let follow = req.follow && query.until.is_none_or(|t| t > SystemTime::now());
        tokio::spawn(async move {
            for r in selected {
                if tx.send(Ok(r)).await.is_err() {
                    return;
                }
            }
            if !follow {
                return;
            }
            let (mut rx, mut stopping) = (sub.rx, sub.stopping);
            let stop =
                Status::unavailable("the agent is stopping: the flows being followed end here");
            loop {
                // Biased: when the agent stops, the ring may close as soon as the stop is
                // signalled, and the follower must hear why rather than see a clean end.
                let item = tokio::select! {
                    biased;
                    _ = stopped(&mut stopping) => {
                        let _ = tx.send(Err(stop)).await;
                        return;
                    }
                    _ = tx.closed() => return,
                    item = rx.recv() => item,
                };
                let out = match item {
                    Ok(Item::Flow(f)) => {
                        if query.until.is_some_and(|t| f.time > t) {
                            return;
                        }
                        if !query.matches(&f) {
                            continue;
                        }
                        response(&f, &node)
                    }
                    Ok(Item::Lost(n)) => lost(LostEventSource::PerfEventRingBuffer, n, &node),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        flows.ring().follower_lagged(n);
                        lost(LostEventSource::ObserverEventsQueue, n, &node)
                    }
                    // Only a stopping agent closes the ring.
                    Err(broadcast::error::RecvError::Closed) => {
                        let _ = tx.send(Err(stop)).await;
                        return;
                    }
                };
                if tx.send(Ok(out)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn server_status(
        &self,
        _: Request<ServerStatusRequest>,
    ) -> Result<Response<ServerStatusResponse>, Status> {
        let ring = self.0.ring();
        Ok(Response::new(ServerStatusResponse {
            num_flows: ring.len() as u64,
            max_flows: ring.capacity() as u64,
            seen_flows: ring.seen(),
            uptime_ns: u64::try_from(ring.started().elapsed().as_nanos()).unwrap_or(u64::MAX),
            lost_events: ring.lost_datapath(),
            lost_by_followers: ring.lost_followers(),
        }))
    }

    async fn get_endpoint_drops(
        &self,
        req: Request<GetEndpointDropsRequest>,
    ) -> Result<Response<EndpointDrops>, Status> {
        let id = req.into_inner().endpoint_id;
        let id = u16::try_from(id)
            .map_err(|_| Status::invalid_argument(format!("{id} is not an endpoint id")))?;
        let by_reason: std::collections::HashMap<String, u64> =
            self.0.stats().drops_of(id).into_iter().collect();
        let total = by_reason.values().sum();
        Ok(Response::new(EndpointDrops { by_reason, total }))
    }
}

/// Completes once the agent stops (never, if the sender went away without saying so).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A flow response's flow, if it is one.
pub fn flow_of(r: &GetFlowsResponse) -> Option<&v1::Flow> {
    match &r.response_types {
        Some(ResponseTypes::Flow(f)) => Some(f),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlowsConfig;
    use crate::enrich::Enricher;
    use crate::enrich::tests::{FakeSources, event};
    use futures::StreamExt;
    use std::time::Duration;

    fn service(capacity: usize) -> (ObserverService, Arc<Flows>, Enricher) {
        let cfg = FlowsConfig {
            hubble_event_buffer_capacity: capacity,
            ..FlowsConfig::default()
        };
        let flows = Arc::new(Flows::in_memory(&cfg, "node-1".into()));
        let s = Arc::new(FakeSources::default());
        s.pod(1, "10.0.0.1", "shop", "client", 300, &["k8s:app=client"]);
        s.pod(2, "10.0.0.2", "shop", "web", 301, &["k8s:app=web"]);
        (ObserverService(flows.clone()), flows, Enricher::new(s))
    }

    fn push(flows: &Flows, e: &mut Enricher, port: u16) {
        let mut ev = event("10.0.0.1", "10.0.0.2");
        ev.dport = port;
        flows.record(e.flow(ev));
    }

    async fn ports(svc: &ObserverService, req: GetFlowsRequest) -> Vec<u32> {
        let mut stream = svc.get_flows(Request::new(req)).await.unwrap().into_inner();
        let mut out = Vec::new();
        while let Some(r) = stream.next().await {
            let r = r.unwrap();
            let f = flow_of(&r).unwrap();
            let Some(v1::layer4::Protocol::Tcp(t)) = f.l4.as_ref().unwrap().protocol else {
                panic!()
            };
            out.push(t.destination_port);
        }
        out
    }

    #[tokio::test]
    async fn last_first_and_filters_select_from_the_ring() {
        let (svc, flows, mut e) = service(4);
        for port in 1..=6 {
            push(&flows, &mut e, port);
        }
        let all = GetFlowsRequest::default();
        assert_eq!(ports(&svc, all.clone()).await, [3, 4, 5, 6]);
        let last2 = GetFlowsRequest {
            number: 2,
            ..all.clone()
        };
        assert_eq!(ports(&svc, last2).await, [5, 6]);
        let first1 = GetFlowsRequest {
            number: 1,
            first: true,
            ..all.clone()
        };
        assert_eq!(ports(&svc, first1).await, [3]);
        let not5 = GetFlowsRequest {
            blacklist: vec![v1::FlowFilter {
                destination_port: vec!["5".into()],
                ..Default::default()
            }],
            ..all.clone()
        };
        assert_eq!(ports(&svc, not5).await, [3, 4, 6]);
        let bad = GetFlowsRequest {
            whitelist: vec![v1::FlowFilter {
                source_ip: vec!["nope".into()],
                ..Default::default()
            }],
            ..all
        };
        let err = svc.get_flows(Request::new(bad)).await.err().unwrap();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("source_ip"), "{}", err.message());
    }

    #[tokio::test]
    async fn a_follower_gets_new_flows_at_once_and_a_clear_end_when_the_agent_stops() {
        let (svc, flows, mut e) = service(4);
        push(&flows, &mut e, 1);
        let req = GetFlowsRequest {
            follow: true,
            number: 1,
            ..Default::default()
        };
        let mut stream = svc.get_flows(Request::new(req)).await.unwrap().into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert!(flow_of(&first).is_some());
        push(&flows, &mut e, 2);
        let next = tokio::time::timeout(Duration::from_millis(100), stream.next())
            .await
            .expect("a new flow within 100 ms")
            .unwrap()
            .unwrap();
        assert_eq!(next.node_name, "node-1");
        flows.ring().lost(7);
        let lost = stream.next().await.unwrap().unwrap();
        assert!(matches!(
            lost.response_types,
            Some(ResponseTypes::LostEvents(LostEvent {
                num_events_lost: 7,
                ..
            }))
        ));
        flows.ring().stop();
        let end = stream.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Unavailable);
        assert!(end.message().contains("stopping"), "{}", end.message());
    }
}

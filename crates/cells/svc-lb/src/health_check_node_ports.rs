//! Health check node ports: for each LoadBalancer service with `externalTrafficPolicy:
//! Local`, an HTTP server on its `healthCheckNodePort` (every node address, both families),
//! answering as kube-proxy's health check server does, so that a load balancer sends the
//! service's traffic only to nodes that have local endpoints: `200` when this node has at
//! least one ready endpoint of the service, `503` otherwise, with the body
//! `{"service":{"namespace":"shop","name":"web"},"localEndpoints":N}`. Any method and path
//! get the same answer.
//!
//! The servers follow the plans at every pass: started for a new port, their count updated,
//! stopped when the service goes or no longer wants one.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cellium_resources::ObjectKey;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::desired::{FrontendKind, Inputs, Plan};

/// What one health check port should answer for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The service.
    pub service: ObjectKey,
    /// This node's ready endpoints serving it.
    pub local_endpoints: usize,
}

/// The health check ports the services want, with their local endpoint counts: a service's
/// local endpoints are this node's endpoints among the backends of its cluster IP frontends.
pub fn wanted(inputs: &Inputs, plans: &[Plan]) -> BTreeMap<u16, Wanted> {
    let mut out = BTreeMap::new();
    for svc in &inputs.services {
        let Some(port) = svc
            .exposure
            .health_check_node_port
            .filter(|_| svc.exposure.wants_health_check())
        else {
            continue;
        };
        let key = cellium_resources::Object::key(&**svc);
        let backends: BTreeSet<_> = plans
            .iter()
            .filter(|p| p.service == key && p.kind == FrontendKind::ClusterIp)
            .flat_map(|p| p.backends.iter().map(|b| b.backend.addr))
            .collect();
        let local = inputs
            .endpoints
            .iter()
            .filter(|e| e.ready && e.addresses.iter().any(|a| backends.contains(a)))
            .count();
        out.insert(
            port,
            Wanted {
                service: key,
                local_endpoints: local,
            },
        );
    }
    out
}

struct Server {
    service: ObjectKey,
    count: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// The running health check servers, by port.
#[derive(Default)]
pub struct HealthCheckServers {
    running: Mutex<BTreeMap<u16, Server>>,
}

impl std::fmt::Debug for HealthCheckServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.lock().keys().copied().collect();
        f.debug_struct("HealthCheckServers")
            .field("ports", &ports)
            .finish()
    }
}

impl HealthCheckServers {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Server>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the servers exactly `wanted`; returns the ports that could not be listened on,
    /// with why (retried at the next pass).
    pub async fn apply(&self, wanted: BTreeMap<u16, Wanted>) -> Vec<String> {
        let mut failed = Vec::new();
        {
            let mut running = self.lock();
            running.retain(|port, server| {
                let keep = wanted
                    .get(port)
                    .is_some_and(|w| w.service == server.service);
                if !keep {
                    server.task.abort();
                    tracing::info!(port, service = %server.service, "health check server stopped");
                }
                keep
            });
            for (port, w) in &wanted {
                if let Some(server) = running.get(port) {
                    server.count.store(w.local_endpoints, Ordering::Relaxed);
                }
            }
        }
        for (port, w) in wanted {
            if self.lock().contains_key(&port) {
                continue;
            }
            // [::] takes IPv4 too (as mapped addresses): every node address, both families.
            let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
            match TcpListener::bind(addr).await {
                Ok(listener) => {
                    let count = Arc::new(AtomicUsize::new(w.local_endpoints));
                    let task = tokio::spawn(serve(listener, w.service.clone(), count.clone()));
                    tracing::info!(port, service = %w.service, "health check server started");
                    self.lock().insert(
                        port,
                        Server {
                            service: w.service,
                            count,
                            task,
                        },
                    );
                }
                Err(e) => failed.push(format!(
                    "health check node port {port} of {}: {e}",
                    w.service
                )),
            }
        }
        failed
    }
}

impl Drop for HealthCheckServers {
    fn drop(&mut self) {
        for server in self.lock().values() {
            server.task.abort();
        }
    }
}

async fn serve(listener: TcpListener, service: ObjectKey, count: Arc<AtomicUsize>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (service, count) = (service.clone(), count.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |_req: Request<Incoming>| {
                let answer = answer(&service, count.load(Ordering::Relaxed));
                async move { Ok::<_, Infallible>(answer) }
            });
            // A client that hangs up or speaks no HTTP is its own business.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// kube-proxy's answer: 200 with local endpoints, 503 without.
fn answer(service: &ObjectKey, local: usize) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "service": { "namespace": service.namespace, "name": service.name },
        "localEndpoints": local,
    });
    let status = if local > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-content-type-options", "nosniff")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_kube_proxys() {
        let key = ObjectKey::namespaced("shop", "web");
        let ok = answer(&key, 2);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()["content-type"], "application/json");
        assert_eq!(answer(&key, 0).status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}

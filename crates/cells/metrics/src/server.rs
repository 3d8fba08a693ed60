//! The HTTP listener: `GET /metrics`, nothing else.

use std::convert::Infallible;
use std::sync::Arc;

use cellium_hive::{Jobs, Reporter};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::registry::Metrics;

/// Serves `listener` as the `serve` job, until the hive stops.
pub(crate) fn serve(jobs: &Jobs, listener: TcpListener, metrics: Arc<Metrics>, reporter: Reporter) {
    let listener = Arc::new(listener);
    jobs.one_shot("serve", move |ctx| {
        let (listener, metrics, reporter) = (listener.clone(), metrics.clone(), reporter.clone());
        async move {
            ctx.reporter().ok("accepting scrapes");
            loop {
                let (stream, _) = tokio::select! {
                    _ = ctx.cancelled() => return Ok(()),
                    accepted = listener.accept() => accepted?,
                };
                let (metrics, reporter) = (metrics.clone(), reporter.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, metrics.clone()));
                    if let Err(e) = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await
                    {
                        reporter.degraded(format!("serving a scrape failed: {e}"));
                    }
                });
            }
        }
    })
    .add();
}

async fn answer(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => match metrics.encode() {
            Ok(text) => Response::builder()
                .header(
                    "content-type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .body(Full::new(Bytes::from(text))),
            Err(_) => Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(Full::new(Bytes::from("encoding metrics failed\n"))),
        },
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from("only GET /metrics is served here\n"))),
    };
    Ok(response.unwrap_or_default())
}

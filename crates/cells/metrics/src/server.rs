//! The HTTP listener: `GET /metrics`, nothing else.

use std::convert::Infallible;
use std::sync::Arc;

use cellium_hive::Jobs;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::registry::Metrics;

/// Serves `listener` as the `serve` job, until the hive stops.
pub(crate) fn serve(jobs: &Jobs, listener: TcpListener, metrics: Arc<Metrics>) {
    let listener = Arc::new(listener);
    jobs.one_shot("serve", move |ctx| {
        let (listener, metrics) = (listener.clone(), metrics.clone());
        async move {
            ctx.reporter().ok("accepting scrapes");
            loop {
                let (stream, _) = tokio::select! {
                    _ = ctx.cancelled() => return Ok(()),
                    accepted = listener.accept() => accepted?,
                };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, metrics.clone()));
                    if let Err(e) = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await
                    {
                        // One scraper's connection (it hung up, it spoke no HTTP) says nothing
                        // about the agent: a Degraded module would keep the node from taking
                        // pods for the fault of a client.
                        tracing::warn!(error = %e, "serving a scrape failed");
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use cellium_hive::{ConfigSources, Hive, Level};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::Metrics;

    #[tokio::test]
    async fn a_scraper_that_hangs_up_or_speaks_no_http_leaves_the_module_ok() {
        let slot: Arc<Mutex<Option<Arc<Metrics>>>> = Arc::default();
        let s = slot.clone();
        let mut hive = Hive::new([
            crate::cell().into(),
            cellium_hive::Module::new("probe", "x")
                .invoke(move |m: Arc<Metrics>| *s.lock().unwrap() = Some(m))
                .into(),
        ])
        .with_config(ConfigSources::new().flag("metrics-addr", "127.0.0.1:0"));
        hive.start().await.unwrap();
        let addr = slot.lock().unwrap().clone().unwrap().local_addr().unwrap();
        for bytes in [
            &b"\x00\x01 not http\r\n\r\n"[..],
            b"GET /metrics HTTP/1.1\r\n",
        ] {
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            conn.write_all(bytes).await.unwrap();
            // Half a request, then gone; or garbage, answered with an error and closed.
            drop(conn);
        }
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let metrics = hive.health().node("metrics").unwrap();
        assert_eq!(metrics.status.level, Level::Ok, "{:?}", metrics.status);
        hive.stop().await.unwrap();
    }
}

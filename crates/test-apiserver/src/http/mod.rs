//! HTTP/1.1 on hyper: one task per connection, routing, faults, and `Status` errors.

mod discovery;
mod openapi;
mod resource;
mod watch;

use crate::error::Error;
use crate::server::ApiServer;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Response bodies: whole (most) or streamed (watches).
pub type Body = BoxBody<Bytes, std::io::Error>;

/// Serves one connection until the client closes it or the server stops.
pub async fn serve_connection(
    server: ApiServer,
    stream: tokio::net::TcpStream,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |req| {
        let server = server.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(server, req).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        // Dropping the connection future closes the socket without a goodbye, as a
        // killed process's kernel would.
        _ = stop.cancelled() => {}
        result = conn => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
    }
}

async fn handle(server: ApiServer, req: Request<Incoming>) -> Response<Body> {
    server.count_request();
    let method = req.method().clone();
    let uri = req.uri().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    tracing::debug!(%method, %uri, %content_type, "request");
    let latency = server.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let impersonate = req
        .headers()
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok());
    let user = server.authenticate(authorization, impersonate);
    let response = match (server.take_failure(), user) {
        (Some(code), _) => Err(Error::Injected(code)),
        (None, Err(e)) => Err(e),
        (None, Ok(user)) => {
            let mut req = req;
            if let Some(user) = user {
                req.extensions_mut().insert(user);
            }
            route(&server, req).await
        }
    };
    let response = response.unwrap_or_else(|error| error_response(&error));
    tracing::debug!(%method, %uri, status = response.status().as_u16(), "response");
    response
}

async fn route(server: &ApiServer, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["version"] => Ok(json_response(StatusCode::OK, &discovery::version())),
        ["healthz" | "livez" | "readyz"] => Ok(text_response(StatusCode::OK, "ok")),
        ["api"] => Ok(json_response(StatusCode::OK, &discovery::core_versions())),
        ["apis"] => Ok(json_response(StatusCode::OK, &discovery::groups())),
        ["api", "v1"] => Ok(json_response(
            StatusCode::OK,
            &discovery::resources("", "v1").ok_or_else(not_found)?,
        )),
        ["apis", group] => Ok(json_response(
            StatusCode::OK,
            &discovery::group(group).ok_or_else(not_found)?,
        )),
        ["apis", group, version] => Ok(json_response(
            StatusCode::OK,
            &discovery::resources(group, version).ok_or_else(not_found)?,
        )),
        ["openapi", "v3"] => Ok(json_response(StatusCode::OK, &openapi::index())),
        ["openapi", "v3", "api", "v1"] => Ok(json_response(
            StatusCode::OK,
            &openapi::group_version("", "v1").ok_or_else(not_found)?,
        )),
        ["openapi", "v3", "apis", group, version] => Ok(json_response(
            StatusCode::OK,
            &openapi::group_version(group, version).ok_or_else(not_found)?,
        )),
        ["api", "v1", rest @ ..] => resource::handle(server, req, "", "v1", rest).await,
        ["apis", group, version, rest @ ..] => {
            resource::handle(server, req, group, version, rest).await
        }
        _ => Err(not_found()),
    }
}

fn not_found() -> Error {
    Error::UnknownKind("the path is not served".into())
}

/// Whether the client asked for `meta.k8s.io/v1` `PartialObjectMetadata` (kube-rs's
/// `metadata_watcher`, `Api::list_metadata`) rather than whole objects.
pub fn wants_metadata(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("as=PartialObjectMetadata"))
}

/// An object cut down to a `PartialObjectMetadata`.
pub fn metadata_only(obj: &Value) -> Value {
    serde_json::json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_default(),
    })
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    bytes_response(
        status,
        "application/json",
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

fn text_response(status: StatusCode, text: &str) -> Response<Body> {
    bytes_response(status, "text/plain", text.as_bytes().to_vec())
}

/// A response with a whole body.
pub fn bytes_response(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_str(content_type).expect("static type"),
    );
    response
}

/// An error as the `Status` object Kubernetes answers with.
pub fn error_response(error: &Error) -> Response<Body> {
    let status = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &error.status())
}

/// Reads a request body as JSON or YAML.
pub async fn read_body(req: Request<Incoming>) -> Result<Value, Error> {
    let bytes = req
        .into_body()
        .collect()
        .await
        .map_err(|e| Error::BadRequest(format!("reading the body: {e}")))?
        .to_bytes();
    parse_document(&bytes)
}

/// Parses JSON, or YAML when it is not JSON (apply-patch+yaml, kubectl with YAML bodies).
pub fn parse_document(bytes: &[u8]) -> Result<Value, Error> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(json_error) => serde_yaml::from_slice(bytes).map_err(|yaml_error| {
            Error::Decode(format!("not JSON ({json_error}) nor YAML ({yaml_error})"))
        }),
    }
}

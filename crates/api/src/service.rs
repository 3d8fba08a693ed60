//! The unit in which cells hand their gRPC services to the API server.

use std::convert::Infallible;
use std::fmt;

use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;

type AddFn = Box<dyn Fn(&mut RoutesBuilder) + Send + Sync>;

/// A gRPC service that a cell serves on the agent's API socket.
///
/// A cell `contribute`s an `Arc<ApiService>` to the hive; the `api-server` cell collects every
/// one of them (`Vec<Arc<ApiService>>`) and mounts them on one server, so adding an API to the
/// agent never touches the server's code.
pub struct ApiService {
    name: &'static str,
    add: AddFn,
}

impl ApiService {
    /// Wraps a generated tonic server, e.g. `AgentServer::new(handler)`.
    pub fn new<S>(service: S) -> Self
    where
        S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        ApiService {
            name: S::NAME,
            add: Box::new(move |routes| {
                routes.add_service(service.clone());
            }),
        }
    }

    /// The fully qualified gRPC service name, e.g. `cellium.v1.Agent`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Adds the service to a router under construction.
    pub fn add_to(&self, routes: &mut RoutesBuilder) {
        (self.add)(routes)
    }
}

impl fmt::Debug for ApiService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiService")
            .field("name", &self.name)
            .finish()
    }
}

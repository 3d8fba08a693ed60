//! The gRPC server: every contributed service, mounted on the API socket.

use std::path::PathBuf;
use std::sync::Arc;

use cellium_api::v1::agent_server::AgentServer;
use cellium_api::{ApiService, HANDSHAKE_TIMEOUT};
use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter};
use tonic::service::RoutesBuilder;
use tonic::transport::Server;

use crate::agent::AgentService;
use crate::config::ApiServerConfig;
use crate::socket;

/// The running API server.
#[derive(Debug)]
pub struct ApiServer {
    socket: PathBuf,
    services: Vec<&'static str>,
}

impl ApiServer {
    /// Declares the server; the socket is bound by the start hook, after every cell whose
    /// service it mounts has started, so no call reaches a cell that is not ready.
    pub fn new(
        cfg: Config<ApiServerConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        agent: Arc<AgentService>,
        services: Vec<Arc<ApiService>>,
    ) -> Arc<ApiServer> {
        let agent = AgentServer::from_arc(agent);
        let mut names = vec![ApiService::new(agent.clone()).name()];
        names.extend(services.iter().map(|s| s.name()));
        let server = Arc::new(ApiServer {
            socket: cfg.api_socket.clone(),
            services: names,
        });

        let path = cfg.api_socket.clone();
        let cleanup = path.clone();
        lc.append(
            Hook::new("serve-api")
                .on_start(move |_| async move {
                    let listener = socket::bind(&path)?;
                    let mut routes = RoutesBuilder::default();
                    routes.add_service(agent);
                    for s in &services {
                        s.add_to(&mut routes);
                    }
                    serve(&jobs, listener, routes, reporter);
                    tracing::info!(socket = %path.display(), "serving the API");
                    Ok(())
                })
                .on_stop(move |_| async move {
                    // Unlinking does not disturb calls in flight; new clients find no socket
                    // instead of one nobody will answer.
                    let _ = std::fs::remove_file(&cleanup);
                    Ok(())
                }),
        );
        server
    }

    /// The socket path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The names of the gRPC services served, e.g. `cellium.v1.Agent`.
    pub fn services(&self) -> &[&'static str] {
        &self.services
    }
}

/// How long the API's calls in flight may go on once the agent stops.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn serve(
    jobs: &Jobs,
    listener: tokio::net::UnixListener,
    routes: RoutesBuilder,
    reporter: Reporter,
) {
    let routes = routes.routes();
    let mut listener = Some(listener);
    jobs.one_shot("serve", move |ctx| {
        let listener = listener.take();
        let routes = routes.clone();
        let reporter = reporter.clone();
        async move {
            let listener =
                listener.ok_or("the API listener is gone; it is not re-bound on retry")?;
            reporter.ok("serving");
            ctx.reporter().ok("serving");
            let server = Server::builder()
                .add_routes(routes)
                .serve_with_incoming_shutdown(
                    cellium_api::incoming(listener, HANDSHAKE_TIMEOUT),
                    ctx.cancelled(),
                );
            // A graceful stop waits for every open connection, and an idle client (a CLI
            // suspended, a watcher that keeps its channel) would hold the agent's stop for as
            // long as it likes: calls in flight get STOP_GRACE, then the connections are cut.
            let cut = async {
                ctx.cancelled().await;
                tokio::time::sleep(STOP_GRACE).await;
            };
            tokio::select! {
                served = server => served?,
                () = cut => tracing::info!(grace = ?STOP_GRACE, "API connections still open when stopping; closed"),
            }
            Ok(())
        }
    })
    .add();
}

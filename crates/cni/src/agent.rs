//! The gRPC connection to the agent, with a time limit on everything.
//!
//! A runtime blocks on the plugin while it runs, and kubelet blocks pod start-up on the
//! runtime: every step that waits on the agent (the connection and each call) is bounded by
//! the configuration's `timeout`, and the limit is also sent as the gRPC deadline so the agent
//! can give up on work nobody waits for.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use cellium_api::v1::agent_client::AgentClient;
use cellium_api::v1::endpoints_client::EndpointsClient;
use cellium_api::v1::ipam_client::IpamClient;
use tonic::transport::Channel;

use crate::error::{Error, Result};

/// The largest answer the plugin reads. Requests stay within tonic's 4 MiB default, which the
/// agent enforces, and are far smaller; answers that list the node's state (`Ipam.List` with
/// every allocation of a /16) can pass 4 MiB, and the plugin reads them whole.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// A connection to the agent.
#[derive(Debug, Clone)]
pub struct Agent {
    channel: Channel,
    timeout: Duration,
}

impl Agent {
    /// Connects to the agent on `socket`, waiting at most `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Agent> {
        Agent::open(timeout, cellium_api::connect(socket)).await
    }

    /// Connects to the agent on `socket` passing the pod's network namespace `netns` (opened
    /// here, where the runtime's path is valid), waiting at most `timeout`: what ADD and CHECK
    /// need.
    pub async fn connect_with_netns(
        socket: &Path,
        timeout: Duration,
        netns: OwnedFd,
    ) -> Result<Agent> {
        Agent::open(timeout, cellium_api::connect_with_netns(socket, netns)).await
    }

    async fn open(
        timeout: Duration,
        connecting: impl Future<Output = Result<Channel, cellium_api::ConnectError>>,
    ) -> Result<Agent> {
        match tokio::time::timeout(timeout, connecting).await {
            Err(_) => Err(Error::AgentTimeout {
                call: "the connection",
                timeout,
            }),
            Ok(Err(e)) => Err(Error::from_connect(e)),
            Ok(Ok(channel)) => Ok(Agent { channel, timeout }),
        }
    }

    /// A client of the `cellium.v1.Endpoints` service.
    pub fn endpoints(&self) -> EndpointsClient<Channel> {
        EndpointsClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES)
    }

    /// A client of the `cellium.v1.Agent` service.
    pub fn agent(&self) -> AgentClient<Channel> {
        AgentClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES)
    }

    /// A client of the `cellium.v1.Ipam` service.
    pub fn ipam(&self) -> IpamClient<Channel> {
        IpamClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES)
    }

    /// Wraps a message into a request that carries the time limit as its gRPC deadline.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    /// Awaits one call named `call` (e.g. `Endpoints.Create`) for at most the time limit and
    /// turns its failure into an [`Error`] that keeps the gRPC code.
    pub async fn call<T>(
        &self,
        call: &'static str,
        response: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        let started = Instant::now();
        let timed_out = Error::AgentTimeout {
            call,
            timeout: self.timeout,
        };
        match tokio::time::timeout(self.timeout, response).await {
            Err(_) => Err(timed_out),
            // The deadline sent with the request is enforced by tonic too (as CANCELLED) and by
            // the agent (as DEADLINE_EXCEEDED); whichever timer fires first, it is this limit.
            Ok(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
                ) && started.elapsed() >= self.timeout =>
            {
                Err(timed_out)
            }
            Ok(Err(status)) if broken_connection(&status) => Err(Error::AgentGone {
                call,
                reason: source_chain(&status),
            }),
            Ok(Err(status)) => Err(Error::Agent {
                call,
                grpc: status.code(),
                reason: cellium_api::reason_of(&status),
                message: status.message().to_string(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }
}

/// Whether a call failed because the connection under it broke (the agent exited or restarted
/// mid-call). tonic reports that as UNKNOWN "transport error" with the transport's error as the
/// source, not as a status the agent sent, so it is told apart by that source.
fn broken_connection(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Unknown {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::transport::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The sources of `status`, innermost last (`transport error: connection closed ...`).
fn source_chain(status: &tonic::Status) -> String {
    let mut parts = vec![status.message().to_string()];
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_agent_is_try_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let err = Agent::connect(&socket, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.code(), 11);
        assert!(err.to_string().contains("not running"), "{err}");
    }

    #[tokio::test]
    async fn a_silent_agent_times_out_instead_of_hanging() {
        // A listener that accepts connections but never speaks HTTP/2 is a wedged agent.
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let _accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let result = match Agent::connect(&socket, timeout).await {
            Err(e) => Err(e),
            Ok(agent) => {
                agent
                    .call(
                        "Agent.Status",
                        agent
                            .agent()
                            .status(agent.request(cellium_api::v1::StatusRequest {})),
                    )
                    .await
            }
        };
        let err = result.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        assert!(matches!(err, Error::AgentTimeout { .. }), "{err}");
    }

    /// An agent that never answers, on a runtime of its own.
    struct Stuck;

    #[tonic::async_trait]
    impl cellium_api::v1::agent_server::Agent for Stuck {
        async fn status(
            &self,
            _: tonic::Request<cellium_api::v1::StatusRequest>,
        ) -> Result<tonic::Response<cellium_api::v1::StatusResponse>, tonic::Status> {
            std::future::pending().await
        }
    }

    #[test]
    fn a_connection_broken_mid_call_is_try_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        // Shutting the agent's runtime down closes its connections, as the death of the agent
        // process does.
        let server = tokio::runtime::Runtime::new().unwrap();
        let listener = {
            let _entered = server.enter();
            tokio::net::UnixListener::bind(&socket).unwrap()
        };
        server.spawn(
            tonic::transport::Server::builder()
                .add_service(cellium_api::v1::agent_server::AgentServer::new(Stuck))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let client = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = client.block_on(async {
            let agent = Agent::connect(&socket, Duration::from_secs(10))
                .await
                .unwrap();
            let killer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                server.shutdown_background();
            });
            let result = agent
                .call(
                    "Agent.Status",
                    agent
                        .agent()
                        .status(agent.request(cellium_api::v1::StatusRequest {})),
                )
                .await;
            killer.join().unwrap();
            result.unwrap_err()
        });
        assert!(matches!(err, Error::AgentGone { .. }), "{err}");
        assert_eq!(err.code(), 11);
        assert!(err.to_string().contains("during Agent.Status"), "{err}");
    }
}

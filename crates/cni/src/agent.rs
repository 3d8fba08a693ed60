//! The gRPC connection to the agent, with a time limit on everything.
//!
//! A runtime blocks on the plugin while it runs, and kubelet blocks pod start-up on the
//! runtime: every step that waits on the agent (the connection and each call) is bounded by
//! the configuration's `timeout`, and the limit is also sent as the gRPC deadline so the agent
//! can give up on work nobody waits for.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use cellium_api::v1::agent_client::AgentClient;
use cellium_api::v1::endpoints_client::EndpointsClient;
use cellium_api::v1::ipam_client::IpamClient;
use tonic::transport::Channel;

use crate::error::{Error, Result};

/// A connection to the agent.
#[derive(Debug, Clone)]
pub struct Agent {
    channel: Channel,
    timeout: Duration,
}

impl Agent {
    /// Connects to the agent on `socket`, waiting at most `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Agent> {
        match tokio::time::timeout(timeout, cellium_api::connect(socket)).await {
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
        EndpointsClient::new(self.channel.clone())
    }

    /// A client of the `cellium.v1.Agent` service.
    pub fn agent(&self) -> AgentClient<Channel> {
        AgentClient::new(self.channel.clone())
    }

    /// A client of the `cellium.v1.Ipam` service.
    pub fn ipam(&self) -> IpamClient<Channel> {
        IpamClient::new(self.channel.clone())
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
            Ok(Err(status)) => Err(Error::Agent {
                call,
                grpc: status.code(),
                message: status.message().to_string(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }
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
}

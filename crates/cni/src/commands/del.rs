//! DEL: the agent removes the endpoint; idempotent.
//!
//! DEL is best effort in the spec and runtimes retry it until it succeeds, so everything that
//! is already gone is success: the endpoint (the agent answers `existed: false`, or NOT_FOUND),
//! the netns (`CNI_NETNS` may be empty) and `prevResult` (podman calls DEL without it after a
//! failed ADD; it is never read, since the agent knows the endpoint by container and
//! interface). CNI_ARGS is not parsed either: nothing in it is needed to delete, and a DEL that
//! fails on it would leak the endpoint. An agent that is down is code 11, so the runtime
//! retries rather than forgetting an endpoint that still holds an address.

use cellium_api::v1::DeleteEndpointRequest;

use super::Reply;
use crate::agent::Agent;
use crate::config::NetConf;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::version::Verb;

/// Runs DEL.
pub async fn exec(env: &Env, stdin: &[u8]) -> Result<Reply> {
    let attachment = env.attachment(Verb::Del)?;
    let conf = NetConf::parse(stdin, Verb::Del)?;
    let agent = Agent::connect(&conf.socket, conf.timeout).await?;
    let request = DeleteEndpointRequest {
        container_id: attachment.container_id,
        ifname: attachment.ifname,
        netns: attachment.netns,
    };
    let summary = match agent
        .call(
            "Endpoints.Delete",
            agent.endpoints().delete(agent.request(request)),
        )
        .await
    {
        Ok(r) if r.existed => "deleted".to_string(),
        Ok(_) => "nothing to delete".to_string(),
        Err(Error::Agent {
            grpc: tonic::Code::NotFound,
            message,
            ..
        }) => format!("already gone ({message})"),
        Err(e) => return Err(e),
    };
    Ok(Reply {
        stdout: None,
        summary,
    })
}

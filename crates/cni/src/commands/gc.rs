//! GC: the agent removes this network's endpoints the runtime no longer knows.
//!
//! The attachments still in use come in `cni.dev/valid-attachments`. Without that key the call
//! fails rather than treating the list as empty, which would delete every endpoint of the
//! network.

use cellium_api::v1::{Attachment, GcRequest};

use super::Reply;
use crate::agent::Agent;
use crate::config::NetConf;
use crate::error::{Error, Result};
use crate::version::Verb;

/// Runs GC.
pub async fn exec(stdin: &[u8]) -> Result<Reply> {
    let conf = NetConf::parse(stdin, Verb::Gc)?;
    let valid = conf
        .valid_attachments
        .clone()
        .ok_or_else(|| Error::MissingValidAttachments {
            network: conf.name.clone(),
        })?;
    let request = GcRequest {
        network: conf.name.clone(),
        valid: valid
            .into_iter()
            .map(|a| Attachment {
                container_id: a.container_id,
                ifname: a.ifname,
            })
            .collect(),
    };
    let agent = Agent::connect(&conf.socket, conf.timeout).await?;
    let removed = agent
        .call("Endpoints.Gc", agent.endpoints().gc(agent.request(request)))
        .await?
        .removed;
    let ids: Vec<String> = removed.iter().map(u32::to_string).collect();
    Ok(Reply {
        stdout: None,
        summary: format!("removed {} endpoint(s) [{}]", ids.len(), ids.join(", ")),
    })
}

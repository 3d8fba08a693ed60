//! CHECK: is the attachment still what ADD set up?
//!
//! Three comparisons, each failure naming what differs:
//! 1. `prevResult` (the runtime's view) must list the pod interface `CNI_IFNAME` in `CNI_NETNS`;
//! 2. `Endpoints.Check`, with the pod's network namespace passed along: the agent compares the
//!    pod's interface, addresses and routes in it with its record (the difference, or no such
//!    endpoint), and answers with the record;
//! 3. every address of the agent's record must be in `prevResult` on that interface.
//!
//! MACs and routes in `prevResult` are not compared: a later plugin of the chain may change
//! them, which the spec tells CHECK to allow.

use cellium_api::v1::CheckEndpointRequest;

use super::{Reply, Request};
use crate::addr::Cidr;
use crate::agent::Agent;
use crate::env::{Attachment, Env};
use crate::error::{Error, Result};
use crate::netns;
use crate::result::CniResult;
use crate::version::Verb;

/// Runs CHECK.
pub async fn exec(env: &Env, stdin: &[u8]) -> Result<Reply> {
    let Request {
        attachment, conf, ..
    } = Request::parse(env, stdin, Verb::Check)?;
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or(Error::MissingPrevResult { verb: Verb::Check })?;
    let prev = CniResult::parse(prev, conf.version)?;
    let pod = pod_interface(&prev, &attachment)?;

    let netns = netns::open(&attachment.netns)?;
    let agent = Agent::connect_with_netns(&conf.socket, conf.timeout, netns).await?;
    let request = CheckEndpointRequest {
        container_id: attachment.container_id.clone(),
        ifname: attachment.ifname.clone(),
        netns: attachment.netns.clone(),
    };
    let ep = agent
        .call(
            "Endpoints.Check",
            agent.endpoints().check(agent.request(request)),
        )
        .await?
        .endpoint
        .ok_or(Error::AgentReply {
            call: "Endpoints.Check",
            reason: "it did not return the endpoint".into(),
        })?;
    let mut differences = Vec::new();
    for a in &ep.addresses {
        let address = Cidr::parse(&a.address).map_err(|reason| Error::AgentReply {
            call: "Endpoints.Check",
            reason,
        })?;
        let listed = prev
            .ips
            .iter()
            .any(|ip| ip.address == address && ip.interface == Some(pod));
        if !listed {
            differences.push(format!(
                "address {address} of endpoint {} is not in prevResult on interface {}",
                ep.id, attachment.ifname
            ));
        }
    }
    if !differences.is_empty() {
        return Err(Error::CheckMismatch { differences });
    }
    Ok(Reply {
        stdout: None,
        summary: format!("endpoint {} as set up", ep.id),
    })
}

/// The index of the pod interface in `prevResult`.
fn pod_interface(prev: &CniResult, attachment: &Attachment) -> Result<usize> {
    prev.interfaces
        .iter()
        .position(|i| {
            i.name == attachment.ifname && i.sandbox.as_deref() == Some(attachment.netns.as_str())
        })
        .ok_or_else(|| Error::CheckMismatch {
            differences: vec![format!(
                "prevResult lists no interface {} in {}",
                attachment.ifname, attachment.netns
            )],
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::CniVersion;
    use serde_json::json;

    fn attachment() -> Attachment {
        Attachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/p1".into(),
        }
    }

    #[test]
    fn the_pod_interface_is_found_by_name_and_netns() {
        let prev = CniResult::parse(
            &json!({"cniVersion": "1.0.0", "interfaces": [
                {"name": "lxc1"},
                {"name": "eth0", "sandbox": "/run/netns/other"},
                {"name": "eth0", "sandbox": "/run/netns/p1"}
            ]}),
            CniVersion::V1_0_0,
        )
        .unwrap();
        assert_eq!(pod_interface(&prev, &attachment()).unwrap(), 2);
    }

    #[test]
    fn a_prev_result_without_the_pod_interface_is_a_check_failure() {
        let prev = CniResult::parse(
            &json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]}),
            CniVersion::V1_0_0,
        )
        .unwrap();
        let err = pod_interface(&prev, &attachment()).unwrap_err();
        assert_eq!(err.code(), 105);
        let msg = err.to_string();
        assert!(msg.contains("no interface eth0 in /run/netns/p1"), "{msg}");
    }
}

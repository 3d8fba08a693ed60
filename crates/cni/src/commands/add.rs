//! ADD: the agent creates the pod's endpoint; the plugin prints the result.
//!
//! The agent does all the work (addresses, veth pair, routes, datapath) in
//! `Endpoints.Create`, which returns once the datapath enforces the endpoint, so a pod never
//! starts before its network is ready. The pod's network namespace goes with the call, opened
//! here ([`crate::netns`]). With a `prevResult` (this plugin anywhere in a chain),
//! the plugin's interfaces, IPs and routes are appended to it. The runtime's
//! `runtimeConfig.portMappings` go with the call: the agent publishes them as host ports
//! ([`crate::port_mappings`]).

use cellium_api::v1::{CreateEndpointRequest, EndpointState};

use super::{Reply, Request};
use crate::agent::Agent;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::netns;
use crate::result::{CniResult, endpoint, merge};
use crate::version::Verb;

/// Runs ADD.
pub async fn exec(env: &Env, stdin: &[u8]) -> Result<Reply> {
    let Request {
        attachment,
        conf,
        args,
    } = Request::parse(env, stdin, Verb::Add)?;
    // Decoded before the agent is called: a bad prevResult must fail the call with nothing
    // created, not after an endpoint exists.
    let prev = conf
        .prev_result
        .as_ref()
        .map(|v| CniResult::parse(v, conf.version))
        .transpose()?;
    let netns = netns::open(&attachment.netns)?;
    let agent = Agent::connect_with_netns(&conf.socket, conf.timeout, netns).await?;
    let request = CreateEndpointRequest {
        container_id: attachment.container_id.clone(),
        netns: attachment.netns.clone(),
        ifname: attachment.ifname.clone(),
        pod_namespace: args.pod_namespace.clone().unwrap_or_default(),
        pod_name: args.pod_name.clone().unwrap_or_default(),
        requested_ips: conf.requested_ips(&args).to_vec(),
        network: conf.name.clone(),
        mtu: conf.mtu.unwrap_or(0),
        port_mappings: conf.port_mappings.iter().map(|m| m.to_proto()).collect(),
    };
    let ep = agent
        .call(
            "Endpoints.Create",
            agent.endpoints().create(agent.request(request)),
        )
        .await?;
    if ep.state() == EndpointState::Failed {
        return Err(Error::EndpointFailed {
            id: ep.id,
            message: ep.status_message,
        });
    }
    let own = endpoint::from_endpoint(&ep, &attachment, &conf.dns)?;
    let addresses: Vec<String> = own.ips.iter().map(|ip| ip.address.to_string()).collect();
    let result = match prev {
        Some(prev) => merge::append(prev, own),
        None => own,
    };
    Ok(Reply {
        stdout: Some(result.render(conf.version)),
        summary: format!("endpoint {}: {}", ep.id, addresses.join(", ")),
    })
}

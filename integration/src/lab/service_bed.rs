//! The bed of the service tests that reach frontends from outside the node as well as from
//! pods (`tests/nodeport.rs`, `tests/services_icmp.rs`): a dual-stack agent (pod CIDRs and
//! service ranges of both families) with the [`External`] network on `celx0`, the pods
//! `web-0` and `client` made through the plugin, and what `cellium service list` says.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;

use crate::agent::{Agent, AgentOptions};
use crate::cni::{CniCall, result_ipv4, result_ipv6};
use crate::error::{Error, Result};
use crate::lab::External;
use crate::netns::NetNs;

/// The node's IPv6 address on the external link.
pub const NODE6: &str = "fd00:98::1";
/// The external namespace's IPv6 address on the link.
pub const EXT6: &str = "fd00:98::2";

/// The agent, its external network and the two pods, each pod with its IPv4 and IPv6
/// addresses (in that order). Field order is drop order: pods, external network, agent.
#[derive(Debug)]
pub struct ServiceBed {
    /// The client pod.
    pub client: NetNs,
    /// Its addresses, IPv4 first.
    pub client_ips: Vec<IpAddr>,
    /// The backend pod `web-0`.
    pub web: NetNs,
    /// Its addresses, IPv4 first.
    pub web_ips: Vec<IpAddr>,
    /// The network outside the node.
    pub external: External,
    /// The agent.
    pub agent: Agent,
}

impl ServiceBed {
    /// Starts the agent, attaches the external network, applies `pods` (Pod objects that
    /// include `default/web-0` and `default/client`) and adds both pods; `tag` keeps the
    /// container ids of one test file apart from another's.
    pub fn start(pods: &str, tag: &str) -> Result<ServiceBed> {
        ServiceBed::start_with(pods, tag, Vec::new())
    }

    /// [`ServiceBed::start`] with the agent's environment extended by `env` (config keys).
    pub fn start_with(pods: &str, tag: &str, env: Vec<(String, String)>) -> Result<ServiceBed> {
        let pod_cidrs = vec!["10.244.0.0/24".to_string(), "fd00:10:244::/112".to_string()];
        let agent = Agent::start_new(AgentOptions {
            pod_cidrs: pod_cidrs.clone(),
            env: [(
                "CELLIUM_SERVICE_CIDR".to_string(),
                "10.96.0.0/16,fd00:10:96::/108".to_string(),
            )]
            .into_iter()
            .chain(env)
            .collect(),
            ..AgentOptions::default()
        })?;
        let external = External::attach(agent.node(), &pod_cidrs)?;
        agent.objects("apply", pods)?;
        let (web, web_ips) = add_pod(&agent, "web-0", tag)?;
        let (client, client_ips) = add_pod(&agent, "client", tag)?;
        Ok(ServiceBed {
            client,
            client_ips,
            web,
            web_ips,
            external,
            agent,
        })
    }
}

/// The Pod objects of the service tests, in `default`: `webs` backends `web-0`, `web-1`, ...
/// (`app: web`, with the named port `http` 8080/TCP when `http`) and `client` (`app: client`).
pub fn pods(webs: usize, http: bool) -> String {
    let ports = if http {
        ", ports: [ { name: http, containerPort: 8080 } ]"
    } else {
        ""
    };
    let mut yaml: Vec<String> = (0..webs)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{ name: web-{i}, labels: {{ app: web }} }}\n\
                 spec: {{ containers: [ {{ name: c{ports} }} ] }}\n"
            )
        })
        .collect();
    yaml.push(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: client, labels: { app: client } }\n\
         spec: { containers: [ { name: c } ] }\n"
            .to_string(),
    );
    yaml.join("---\n")
}

/// Every frontend `cellium service list` shows (none if it cannot be read).
pub fn frontends(agent: &Agent) -> Vec<Value> {
    agent
        .cli_json(&["service", "list"])
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// The container id [`add_pod`] gives pod `name` of a test file tagged `tag`.
pub fn container_id(name: &str, tag: &str) -> String {
    format!("{tag}{name}x{}", std::process::id())
}

/// Adds pod `default/<name>` through the plugin (container id [`container_id`]): its
/// namespace and addresses, IPv4 first.
pub fn add_pod(agent: &Agent, name: &str, tag: &str) -> Result<(NetNs, Vec<IpAddr>)> {
    let ns = NetNs::new()?;
    let call = CniCall::new("ADD", &container_id(name, tag))
        .netns(ns.path())
        .args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
    let (_, result) = agent.add_call(&call)?;
    let missing = |family: &str| Error::Unexpected {
        what: "CNI result",
        detail: format!("no {family} address for {name}: {result}"),
    };
    let v4 = result_ipv4(&result).ok_or_else(|| missing("IPv4"))?;
    let v6 = result_ipv6(&result).ok_or_else(|| missing("IPv6"))?;
    Ok((ns, vec![v4.into(), v6.into()]))
}

/// Polls `f` until it gives a value, for up to 20 s (the node's device program
/// is put in place within 5 s of its address appearing).
pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> Result<T> {
    crate::wait::poll_for(what, Duration::from_secs(20), f)
}

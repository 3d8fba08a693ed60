//! `cellium endpoint`: the node's endpoints (one per pod interface).

use std::path::Path;

use cellium_api::v1::endpoints_client::EndpointsClient;
use cellium_api::v1::{Endpoint, EndpointState, GetEndpointRequest, ListEndpointsRequest};
use serde::Serialize;

use crate::output::{self, Format};

/// `cellium endpoint` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List every endpoint.
    List {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
    /// Show one endpoint in full.
    Get {
        /// The endpoint id.
        id: u32,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
}

/// What `-o json` prints for an endpoint.
#[derive(Debug, Serialize)]
struct EndpointView {
    id: u32,
    state: &'static str,
    pod: String,
    container_id: String,
    ifname: String,
    netns: String,
    network: String,
    addresses: Vec<String>,
    gateways: Vec<String>,
    host_ifname: String,
    host_mac: String,
    pod_mac: String,
    mtu: u32,
    identity: u32,
    policy_revision: u64,
    ingress_enforced: bool,
    egress_enforced: bool,
    /// Why the endpoint is not simply in its state (locked down, being created, ...).
    #[serde(skip_serializing_if = "String::is_empty")]
    status_message: String,
    labels: std::collections::BTreeMap<String, String>,
    /// Drops seen by the observer, by reason; absent when the agent has no observer.
    #[serde(skip_serializing_if = "Option::is_none")]
    drops: Option<std::collections::BTreeMap<String, u64>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    peers: Vec<PeerView>,
    /// Ports published on the node (`8080->80/TCP`, `192.168.1.10:8080->80/TCP`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    port_mappings: Vec<String>,
    created: String,
}

/// A peer the endpoint's policy names.
#[derive(Debug, Serialize)]
struct PeerView {
    direction: String,
    verdict: String,
    identity: u32,
    labels: Vec<String>,
    ports: Vec<String>,
}

/// Runs a `cellium endpoint` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    let mut client = EndpointsClient::new(cellium_api::connect(socket).await?);
    match command {
        Command::List { output } => {
            let endpoints =
                output::answer(client.list(ListEndpointsRequest {}).await, "Endpoints.List")?
                    .endpoints;
            let views: Vec<EndpointView> = endpoints.iter().map(view).collect();
            match output {
                Format::Json => output::print_json(&views),
                Format::Table => {
                    let rows: Vec<Vec<String>> = views
                        .iter()
                        .map(|v| {
                            vec![
                                v.id.to_string(),
                                state_text(v),
                                v.pod.clone(),
                                v.addresses.join(","),
                                v.host_ifname.clone(),
                                v.identity.to_string(),
                                v.policy_revision.to_string(),
                            ]
                        })
                        .collect();
                    output::print_table(
                        &[
                            "ID",
                            "STATE",
                            "POD",
                            "ADDRESSES",
                            "HOST IF",
                            "IDENTITY",
                            "POLICY REV",
                        ],
                        &rows,
                    );
                    Ok(())
                }
            }
        }
        Command::Get { id, output } => {
            let ep = output::answer(client.get(GetEndpointRequest { id }).await, "Endpoints.Get")?;
            let mut v = view(&ep);
            v.drops = drops(socket, id).await;
            match output {
                Format::Json => output::print_json(&v),
                Format::Table => {
                    print_details(&v);
                    Ok(())
                }
            }
        }
    }
}

/// The endpoint's drops as the observer counted them; `None` when the agent has none (an
/// agent built without the flows cell, or with `enable-hubble: false`).
async fn drops(socket: &Path, id: u32) -> Option<std::collections::BTreeMap<String, u64>> {
    let channel = cellium_api::connect(socket).await.ok()?;
    let mut observer = cellium_api::v1::observer_client::ObserverClient::new(channel);
    let reply = observer
        .get_endpoint_drops(cellium_api::v1::GetEndpointDropsRequest { endpoint_id: id })
        .await
        .ok()?;
    Some(reply.into_inner().by_reason.into_iter().collect())
}

fn drops_text(drops: Option<&std::collections::BTreeMap<String, u64>>) -> String {
    let Some(drops) = drops else {
        return "unknown (no observer)".into();
    };
    let total: u64 = drops.values().sum();
    if total == 0 {
        return "0".into();
    }
    let parts: Vec<String> = drops.iter().map(|(r, n)| format!("{r} {n}")).collect();
    format!("{total} ({})", parts.join(", "))
}

fn print_details(v: &EndpointView) {
    let rows = [
        ("ID", v.id.to_string()),
        ("State", v.state.to_string()),
        ("Status", v.status_message.clone()),
        ("Pod", v.pod.clone()),
        ("Container", v.container_id.clone()),
        ("Interface", format!("{} in {}", v.ifname, v.netns)),
        ("Network", v.network.clone()),
        ("Addresses", v.addresses.join(", ")),
        ("Gateways", v.gateways.join(", ")),
        (
            "Host interface",
            format!("{} ({})", v.host_ifname, v.host_mac),
        ),
        ("Pod MAC", v.pod_mac.clone()),
        ("MTU", v.mtu.to_string()),
        ("Identity", v.identity.to_string()),
        ("Policy revision", v.policy_revision.to_string()),
        ("Enforced", enforced(v)),
        ("Created", v.created.clone()),
        ("Drops", drops_text(v.drops.as_ref())),
    ];
    for (k, val) in rows
        .into_iter()
        .filter(|(k, v)| *k != "Status" || !v.is_empty())
    {
        outln!("{:<16} {val}", format!("{k}:"));
    }
    outln!("Labels:");
    for (k, val) in &v.labels {
        if val.is_empty() {
            outln!("  {k}");
        } else {
            outln!("  {k}={val}");
        }
    }
    if v.peers.is_empty() {
        return;
    }
    outln!("Policy peers:");
    let rows: Vec<Vec<String>> = v
        .peers
        .iter()
        .map(|p| {
            let who = if p.identity == 0 {
                "any".to_string()
            } else {
                format!("{} ({})", p.identity, p.labels.join(","))
            };
            let ports = if p.ports.is_empty() {
                "*".to_string()
            } else {
                p.ports.join(",")
            };
            vec![p.direction.clone(), p.verdict.clone(), who, ports]
        })
        .collect();
    output::print_table(
        &["  DIRECTION", "VERDICT", "PEER IDENTITY", "PORTS"],
        &indent(rows),
    );
}

fn indent(mut rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    for row in &mut rows {
        if let Some(first) = row.first_mut() {
            *first = format!("  {first}");
        }
    }
    rows
}

/// The state, and for a ready endpoint with a message (one locked down) the message's first
/// clause: a list shows who is locked down without `get`.
fn state_text(v: &EndpointView) -> String {
    match v.status_message.split(':').next() {
        Some(why) if v.state == "ready" && !why.is_empty() => format!("{} ({why})", v.state),
        _ => v.state.to_string(),
    }
}

fn enforced(v: &EndpointView) -> String {
    match (v.ingress_enforced, v.egress_enforced) {
        (true, true) => "ingress, egress".into(),
        (true, false) => "ingress".into(),
        (false, true) => "egress".into(),
        (false, false) => "nothing (all traffic allowed)".into(),
    }
}

fn view(ep: &Endpoint) -> EndpointView {
    let pod = if ep.pod_name.is_empty() {
        "-".to_string()
    } else {
        format!("{}/{}", ep.pod_namespace, ep.pod_name)
    };
    EndpointView {
        id: ep.id,
        state: match ep.state() {
            EndpointState::Ready => "ready",
            EndpointState::Pending => "pending",
            EndpointState::Failed => "failed",
            EndpointState::Deleting => "deleting",
            EndpointState::Unspecified => "unknown",
        },
        pod,
        container_id: ep.container_id.clone(),
        ifname: ep.ifname.clone(),
        netns: ep.netns.clone(),
        network: ep.network.clone(),
        addresses: ep.addresses.iter().map(|a| a.address.clone()).collect(),
        gateways: ep.addresses.iter().map(|a| a.gateway.clone()).collect(),
        host_ifname: ep.host_ifname.clone(),
        host_mac: ep.host_mac.clone(),
        pod_mac: ep.pod_mac.clone(),
        mtu: ep.mtu,
        identity: ep.identity,
        policy_revision: ep.policy_revision,
        ingress_enforced: ep.ingress_enforced,
        egress_enforced: ep.egress_enforced,
        status_message: ep.status_message.clone(),
        labels: ep.labels.clone().into_iter().collect(),
        drops: None,
        peers: ep
            .peers
            .iter()
            .map(|p| PeerView {
                direction: p.direction.clone(),
                verdict: p.verdict.clone(),
                identity: p.identity,
                labels: p.labels.clone(),
                ports: p.ports.clone(),
            })
            .collect(),
        port_mappings: ep
            .port_mappings
            .iter()
            .map(|m| {
                let at = match m.host_ip.as_str() {
                    "" => m.host_port.to_string(),
                    ip if ip.contains(':') => format!("[{ip}]:{}", m.host_port),
                    ip => format!("{ip}:{}", m.host_port),
                };
                format!("{at}->{}/{}", m.container_port, m.protocol)
            })
            .collect(),
        created: output::rfc3339_ms(ep.created_unix_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(state: EndpointState, message: &str) -> EndpointView {
        view(&Endpoint {
            state: state as i32,
            status_message: message.into(),
            ..Endpoint::default()
        })
    }

    #[test]
    fn a_list_shows_a_ready_endpoint_locked_down() {
        let locked = with(
            EndpointState::Ready,
            "locked down: its policy needs 101 policy map entries, more than bpf-policy-map-max (64)",
        );
        assert_eq!(state_text(&locked), "ready (locked down)");
        assert_eq!(state_text(&with(EndpointState::Ready, "")), "ready");
        assert_eq!(
            state_text(&with(EndpointState::Pending, "being created")),
            "pending"
        );
    }
}

//! STATUS: can the plugin serve ADD now?
//!
//! Success needs the agent reachable, its health level OK, and a free address in some pool.
//! Otherwise:
//! - code 50 (not available) when the agent is unreachable, reports no level, has no pool or
//!   only full pools, or when only modules that serve new pods are unhealthy (ipam,
//!   k8s-watchers, resources, api-server, ...): running pods keep their pinned datapath;
//! - code 51 (not available, existing pods may have limited connectivity) when a module that
//!   keeps running pods' datapath current is Degraded or Stopped ([`DATAPATH_MODULES`]): their
//!   policy, identities or service maps may be stale.

use cellium_api::v1::ListIpamRequest;
use cellium_api::v1::{HealthLevel, HealthNode, ListIpamResponse, StatusRequest, StatusResponse};

use super::Reply;
use crate::agent::Agent;
use crate::config::NetConf;
use crate::error::{Error, Result};
use crate::version::Verb;

/// Modules whose failure affects pods that already run: they write the BPF maps the datapath
/// reads for every packet.
pub const DATAPATH_MODULES: [&str; 6] = [
    "loader",
    "endpoint-manager",
    "identity",
    "ipcache",
    "policy-repo",
    "svc-lb",
];

/// Runs STATUS.
pub async fn exec(stdin: &[u8]) -> Result<Reply> {
    let conf = NetConf::parse(stdin, Verb::Status)?;
    let agent = Agent::connect(&conf.socket, conf.timeout)
        .await
        .map_err(not_available)?;
    let status = agent
        .call(
            "Agent.Status",
            agent.agent().status(agent.request(StatusRequest {})),
        )
        .await
        .map_err(not_available)?;
    health(&status)?;
    match agent
        .call(
            "Ipam.List",
            agent.ipam().list(agent.request(ListIpamRequest {})),
        )
        .await
    {
        Ok(pools) => free_address(&pools)?,
        // An agent built without the IPAM API allocates some other way: nothing to tell.
        Err(Error::Agent {
            grpc: tonic::Code::Unimplemented,
            ..
        }) => {}
        Err(e) => return Err(not_available(e)),
    }
    Ok(Reply {
        stdout: None,
        summary: format!("agent {} ready", status.version),
    })
}

/// Every failure of STATUS is "not available", with the underlying message as the reason.
fn not_available(e: Error) -> Error {
    match e {
        e @ (Error::NotAvailable { .. } | Error::LimitedConnectivity { .. }) => e,
        other => Error::NotAvailable {
            reason: other.to_string(),
        },
    }
}

/// Judges the agent's health tree.
fn health(status: &StatusResponse) -> Result<()> {
    let level = status.level();
    match level {
        // Unknown: started, but a module or job has not reported yet (a timer before its
        // first run): nothing is known to be wrong, and the API answering means endpoints
        // are restored, so pods can be set up.
        HealthLevel::Ok | HealthLevel::Unknown => return Ok(()),
        HealthLevel::Unspecified => {
            return Err(Error::NotAvailable {
                reason: "the agent reports no health level: check `cellium status --verbose`"
                    .into(),
            });
        }
        HealthLevel::Degraded | HealthLevel::Stopped => {}
    }
    let mut causes = Vec::new();
    for node in &status.modules {
        collect_causes(node, &mut causes);
    }
    let datapath = causes.iter().any(|n| {
        n.id.split('.')
            .any(|segment| DATAPATH_MODULES.contains(&segment))
    });
    let listed: Vec<String> = causes
        .iter()
        .map(|n| format!("{} {}: {}", n.id, level_name(n.level()), n.message))
        .collect();
    let reason = format!(
        "the agent is {} ({}): see `cellium status --verbose` and the agent's log",
        level_name(level),
        if listed.is_empty() {
            "no module named".to_string()
        } else {
            listed.join("; ")
        }
    );
    Err(if datapath {
        Error::LimitedConnectivity { reason }
    } else {
        Error::NotAvailable { reason }
    })
}

/// The deepest unhealthy nodes: those whose children are all OK, where a problem starts.
fn collect_causes<'a>(node: &'a HealthNode, out: &mut Vec<&'a HealthNode>) {
    let unhealthy =
        |n: &HealthNode| matches!(n.level(), HealthLevel::Degraded | HealthLevel::Stopped);
    if !unhealthy(node) {
        return;
    }
    if node.children.iter().any(unhealthy) {
        for child in &node.children {
            collect_causes(child, out);
        }
    } else {
        out.push(node);
    }
}

fn level_name(level: HealthLevel) -> &'static str {
    match level {
        HealthLevel::Unspecified => "unknown",
        HealthLevel::Ok => "OK",
        HealthLevel::Degraded => "degraded",
        HealthLevel::Stopped => "stopped",
        HealthLevel::Unknown => "not known yet",
    }
}

/// Fails when no pool has a free address: ADD could not be served.
fn free_address(pools: &ListIpamResponse) -> Result<()> {
    if pools.pools.is_empty() {
        return Err(Error::NotAvailable {
            reason: "the agent has no address pool: give the node a pod CIDR (the agent's ipam configuration, or the Node's podCIDR in Kubernetes)".into(),
        });
    }
    if pools.pools.iter().any(|p| p.used < p.capacity) {
        return Ok(());
    }
    let full: Vec<String> = pools
        .pools
        .iter()
        .map(|p| format!("{} {}/{} used", p.cidr, p.used, p.capacity))
        .collect();
    Err(Error::NotAvailable {
        reason: format!(
            "every address pool is exhausted ({}): delete unused pods or give the node a larger pod CIDR",
            full.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_api::v1::IpPool;

    fn node(id: &str, level: HealthLevel, children: Vec<HealthNode>) -> HealthNode {
        HealthNode {
            id: id.into(),
            level: level as i32,
            message: format!("{id} says so"),
            since_unix_ms: 0,
            children,
        }
    }

    fn status(level: HealthLevel, modules: Vec<HealthNode>) -> StatusResponse {
        StatusResponse {
            version: "0.1.0".into(),
            uptime_ms: 1,
            level: level as i32,
            modules,
        }
    }

    #[test]
    fn ok_is_ready() {
        health(&status(
            HealthLevel::Ok,
            vec![node("ipam", HealthLevel::Ok, vec![])],
        ))
        .unwrap();
    }

    #[test]
    fn a_degraded_control_plane_module_is_50_naming_the_cause() {
        let s = status(
            HealthLevel::Degraded,
            vec![
                node("loader", HealthLevel::Ok, vec![]),
                node(
                    "ipam",
                    HealthLevel::Degraded,
                    vec![
                        node("ipam.restore", HealthLevel::Degraded, vec![]),
                        node("ipam.sync", HealthLevel::Ok, vec![]),
                    ],
                ),
            ],
        );
        let err = health(&s).unwrap_err();
        assert_eq!(err.code(), 50);
        let msg = err.to_string();
        assert!(
            msg.contains("ipam.restore degraded: ipam.restore says so"),
            "{msg}"
        );
        assert!(!msg.contains("ipam.sync"), "{msg}");
    }

    #[test]
    fn a_degraded_datapath_module_is_51() {
        for id in [
            "loader",
            "agent.datapath.loader.attach",
            "policy-repo.recompute",
        ] {
            let s = status(
                HealthLevel::Degraded,
                vec![node(id, HealthLevel::Degraded, vec![])],
            );
            assert_eq!(health(&s).unwrap_err().code(), 51, "{id}");
        }
        let s = status(
            HealthLevel::Stopped,
            vec![node("svc-lb", HealthLevel::Stopped, vec![])],
        );
        let err = health(&s).unwrap_err();
        assert_eq!(err.code(), 51);
        assert!(err.to_string().contains("the agent is stopped"), "{err}");
    }

    #[test]
    fn modules_that_have_not_reported_yet_do_not_keep_pods_out() {
        health(&status(
            HealthLevel::Unknown,
            vec![node("loader", HealthLevel::Unknown, vec![])],
        ))
        .unwrap();
    }

    #[test]
    fn an_unknown_level_is_not_available() {
        assert_eq!(
            health(&status(HealthLevel::Unspecified, vec![]))
                .unwrap_err()
                .code(),
            50
        );
    }

    fn pool(cidr: &str, used: u64, capacity: u64) -> IpPool {
        IpPool {
            cidr: cidr.into(),
            source: "config".into(),
            capacity,
            used,
            router: String::new(),
            allocations: vec![],
        }
    }

    #[test]
    fn one_free_address_anywhere_is_enough() {
        free_address(&ListIpamResponse {
            pools: vec![pool("10.0.0.0/30", 1, 1), pool("10.0.1.0/24", 10, 253)],
        })
        .unwrap();
    }

    #[test]
    fn full_or_missing_pools_are_50() {
        let err = free_address(&ListIpamResponse {
            pools: vec![pool("10.0.0.0/30", 1, 1)],
        })
        .unwrap_err();
        assert_eq!(err.code(), 50);
        assert!(err.to_string().contains("10.0.0.0/30 1/1 used"), "{err}");
        let err = free_address(&ListIpamResponse { pools: vec![] }).unwrap_err();
        assert_eq!(err.code(), 50);
        assert!(err.to_string().contains("no address pool"), "{err}");
    }

    #[test]
    fn connection_failures_become_not_available() {
        let e = not_available(Error::AgentNotRunning {
            socket: "/run/x.sock".into(),
            reason: "no such socket".into(),
        });
        assert_eq!(e.code(), 50);
        assert!(e.to_string().contains("not running at /run/x.sock"), "{e}");
    }
}

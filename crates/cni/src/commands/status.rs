//! STATUS: can the plugin serve ADD now?
//!
//! Success needs the agent reachable, its readiness saying it serves ADD, and a free address in
//! some pool. Otherwise:
//! - code 50 (not available) when the agent is unreachable, does not report its readiness, has
//!   no pool or only full pools, or cannot serve ADD while pods already running are unaffected;
//! - code 51 (not available, existing pods may have limited connectivity) when the agent says
//!   running pods are affected: a module that keeps their datapath current is not OK, so their
//!   policy, identities or service maps may be stale.
//!
//! Which modules keep the datapath current is the agent's knowledge (`Readiness` in
//! `Agent.Status`), not the plugin's: the plugin judges no module by its name.

use cellium_api::v1::ListIpamRequest;
use cellium_api::v1::{IpPool, ListIpamResponse, Readiness, StatusRequest, StatusResponse};

use super::Reply;
use crate::agent::Agent;
use crate::config::NetConf;
use crate::error::{Error, Result};
use crate::version::Verb;

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

/// Judges the agent's own verdict on its health.
fn health(status: &StatusResponse) -> Result<()> {
    let Some(readiness) = &status.readiness else {
        return Err(Error::NotAvailable {
            reason: format!(
                "the agent (version {}) does not report whether it can serve ADD: install the agent and cellium-cni from the same release",
                status.version
            ),
        });
    };
    if readiness.serves_add {
        return Ok(());
    }
    let reason = format!(
        "the agent cannot set up pods ({}): see `cellium status --verbose` and the agent's log",
        causes(readiness)
    );
    Err(if readiness.running_pods_affected {
        Error::LimitedConnectivity { reason }
    } else {
        Error::NotAvailable { reason }
    })
}

/// The places where the problems start, as the agent lists them.
fn causes(readiness: &Readiness) -> String {
    if readiness.causes.is_empty() {
        return "it names no module".to_string();
    }
    readiness
        .causes
        .iter()
        .map(|n| {
            let level = n.level().as_str_name().trim_start_matches("HEALTH_LEVEL_");
            format!("{} {}: {}", n.id, level.to_lowercase(), n.message)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Fails when no pool has a free address: ADD could not be served.
fn free_address(pools: &ListIpamResponse) -> Result<()> {
    if pools.pools.is_empty() {
        return Err(Error::NotAvailable {
            reason: "the agent has no address pool: give the node a pod CIDR (the agent's ipam configuration, or the Node's podCIDR in Kubernetes)".into(),
        });
    }
    // An address in quarantine (released a moment ago) cannot be handed out either.
    let taken = |p: &IpPool| p.used + p.quarantined.len() as u64;
    if pools.pools.iter().any(|p| taken(p) < p.capacity) {
        return Ok(());
    }
    let full: Vec<String> = pools
        .pools
        .iter()
        .map(|p| match p.quarantined.len() {
            0 => format!("{} {}/{} used", p.cidr, p.used, p.capacity),
            q => format!(
                "{} {}/{} used, {q} in quarantine after their release",
                p.cidr, p.used, p.capacity
            ),
        })
        .collect();
    let quarantine = pools.pools.iter().any(|p| !p.quarantined.is_empty());
    Err(Error::NotAvailable {
        reason: format!(
            "every address pool is exhausted ({}): {}",
            full.join(", "),
            if quarantine {
                "addresses in quarantine come free within ipam-release-quarantine; otherwise delete unused pods or give the node a larger pod CIDR"
            } else {
                "delete unused pods or give the node a larger pod CIDR"
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_api::v1::{HealthLevel, HealthNode, IpQuarantined};

    fn cause(id: &str, level: HealthLevel) -> HealthNode {
        HealthNode {
            id: id.into(),
            level: level as i32,
            message: format!("{id} says so"),
            since_unix_ms: 0,
            children: vec![],
        }
    }

    fn status(readiness: Option<Readiness>) -> StatusResponse {
        StatusResponse {
            version: "0.1.0".into(),
            uptime_ms: 1,
            level: HealthLevel::Ok as i32,
            modules: vec![],
            readiness,
            notes: vec![],
        }
    }

    #[test]
    fn ready_is_ready() {
        health(&status(Some(Readiness {
            serves_add: true,
            causes: vec![],
            running_pods_affected: false,
        })))
        .unwrap();
    }

    #[test]
    fn not_serving_add_is_50_naming_the_causes() {
        let err = health(&status(Some(Readiness {
            serves_add: false,
            causes: vec![cause("ipam.restore", HealthLevel::Degraded)],
            running_pods_affected: false,
        })))
        .unwrap_err();
        assert_eq!(err.code(), 50);
        let msg = err.to_string();
        assert!(
            msg.contains("ipam.restore degraded: ipam.restore says so"),
            "{msg}"
        );
    }

    #[test]
    fn running_pods_affected_is_51_whatever_the_modules_are_called() {
        let err = health(&status(Some(Readiness {
            serves_add: false,
            causes: vec![cause("anything.at.all", HealthLevel::Stopped)],
            running_pods_affected: true,
        })))
        .unwrap_err();
        assert_eq!(err.code(), 51);
        assert!(err.to_string().contains("anything.at.all stopped"), "{err}");
    }

    #[test]
    fn an_agent_that_does_not_say_is_not_available() {
        let err = health(&status(None)).unwrap_err();
        assert_eq!(err.code(), 50);
        assert!(err.to_string().contains("same release"), "{err}");
    }

    fn pool(cidr: &str, used: u64, capacity: u64) -> IpPool {
        IpPool {
            cidr: cidr.into(),
            source: "config".into(),
            capacity,
            used,
            router: String::new(),
            allocations: vec![],
            quarantined: vec![],
        }
    }

    #[test]
    fn addresses_in_quarantine_are_not_free() {
        let mut p = pool("10.0.0.0/29", 3, 5);
        p.quarantined = ["10.0.0.5", "10.0.0.6"]
            .into_iter()
            .map(|ip| IpQuarantined {
                ip: ip.into(),
                until_unix_ms: 0,
            })
            .collect();
        let err = free_address(&ListIpamResponse { pools: vec![p] }).unwrap_err();
        assert_eq!(err.code(), 50);
        assert!(err.to_string().contains("2 in quarantine"), "{err}");
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

//! The cluster's pods made real: one network namespace each and a CNI ADD through
//! `cellium-cni` with kubelet's `K8S_POD_NAMESPACE`/`K8S_POD_NAME`, a few at a time, as a
//! kubelet starting many pods would.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use crate::agent::Agent;
use crate::bench::{Shape, interrupted};
use crate::cni::{CniCall, CniProcess, result_ipv4};
use crate::error::{Error, Result};
use crate::netns::NetNs;

/// How many CNI ADDs run at once while the pods are created.
const PARALLEL_ADDS: usize = 8;

/// A pod of the cluster: its network namespace (removed on drop) and its address.
#[derive(Debug)]
pub struct BenchPod {
    /// `namespace/name`.
    pub key: String,
    /// The pod's network namespace.
    pub netns: NetNs,
    /// The address the ADD gave it.
    pub ip: Ipv4Addr,
}

/// Creates every pod of `shape` through the plugin; the pods' objects must be applied first
/// (their labels are the endpoints' labels). Pod `i` is element `i`.
pub fn create_pods(agent: &Agent, shape: Shape) -> Result<Vec<BenchPod>> {
    let mut netns = Vec::with_capacity(shape.pods);
    for _ in 0..shape.pods {
        interrupted()?;
        netns.push(NetNs::new()?);
    }
    let mut ips = Vec::with_capacity(shape.pods);
    let mut running: VecDeque<CniProcess> = VecDeque::new();
    for (i, ns) in netns.iter().enumerate() {
        let key = shape.pod_key(i);
        let (pod_ns, name) = key.split_once('/').unwrap_or_default();
        let call = CniCall::new("ADD", &format!("bench{i}x{}", std::process::id()))
            .netns(ns.path())
            .args(&format!("K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={name}"));
        interrupted()?;
        if running.len() >= PARALLEL_ADDS
            && let Some(p) = running.pop_front()
        {
            ips.push(wait_add(p)?);
        }
        running.push_back(agent.spawn_cni(&call)?);
    }
    for p in running {
        ips.push(wait_add(p)?);
    }
    Ok(netns
        .into_iter()
        .zip(ips)
        .enumerate()
        .map(|(i, (netns, ip))| BenchPod {
            key: shape.pod_key(i),
            netns,
            ip,
        })
        .collect())
}

/// Waits for an ADD; fails unless it succeeded. Returns the pod's address.
pub fn wait_add(p: CniProcess) -> Result<Ipv4Addr> {
    let (status, out) = p.wait()?;
    if !status.success() {
        return Err(Error::Unexpected {
            what: "CNI ADD failure",
            detail: format!("({status}): {out}"),
        });
    }
    result_ipv4(&out).ok_or_else(|| Error::Unexpected {
        what: "CNI ADD result",
        detail: format!("no address in {out}"),
    })
}

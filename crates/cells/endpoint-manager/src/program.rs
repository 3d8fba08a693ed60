//! Programming the datapath for an endpoint: its map entries and its attached programs.

use cellium_datapath_bpf::{Datapath, EndpointFlags, EndpointInfo, MacAddr};

use crate::endpoint::Endpoint;

/// What the datapath must enforce for an endpoint beyond its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Enforcement {
    /// The endpoint's ingress is restricted by policy.
    pub ingress: bool,
    /// The endpoint's egress is restricted by policy.
    pub egress: bool,
}

/// Writes the endpoint's entries, then attaches the programs to its host veth (replacing any
/// attached ones atomically). Entries go first, so the first packet through the programs
/// finds its endpoint.
pub fn program(
    dp: &Datapath,
    ep: &Endpoint,
    enforcement: Enforcement,
) -> cellium_datapath_bpf::Result<()> {
    let mut flags = EndpointFlags::NONE;
    if enforcement.ingress {
        flags = flags | EndpointFlags::ENFORCE_INGRESS;
    }
    if enforcement.egress {
        flags = flags | EndpointFlags::ENFORCE_EGRESS;
    }
    let info = EndpointInfo {
        ifindex: ep.host_ifindex,
        id: ep.id,
        flags,
        identity: ep.identity,
        host_mac: MacAddr(ep.host_mac),
        pod_mac: MacAddr(ep.pod_mac),
    };
    // IPv6 passes the datapath untouched for now: only IPv4 addresses get entries.
    for addr in ep.addresses.iter().filter(|a| a.ip.is_ipv4()) {
        dp.endpoints().put(addr.ip, &info)?;
    }
    dp.attach(ep.host_ifindex)?;
    Ok(())
}

/// Removes the endpoint's entries, policy and programs. What is already gone is fine.
pub fn unprogram(dp: &Datapath, ep: &Endpoint) -> cellium_datapath_bpf::Result<()> {
    for addr in ep.addresses.iter().filter(|a| a.ip.is_ipv4()) {
        // Only the entry that is still ours: the address may already serve a newer endpoint.
        if dp
            .endpoints()
            .get(addr.ip)?
            .is_some_and(|info| info.id == ep.id)
        {
            dp.endpoints().delete(addr.ip)?;
        }
    }
    dp.policy().clear_endpoint(ep.id)?;
    if ep.host_ifindex != 0 {
        dp.detach(ep.host_ifindex)?;
    }
    Ok(())
}

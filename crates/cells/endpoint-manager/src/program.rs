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

/// Writes the endpoint's entries in the endpoint map (one per IPv4 address) with its
/// identity and the directions enforced.
pub fn write_endpoint(
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
    Ok(())
}

/// What the endpoint map says the endpoint enforces (nothing if it has no entry).
pub fn read_enforcement(dp: &Datapath, ep: &Endpoint) -> Enforcement {
    let flags = ep
        .addresses
        .iter()
        .filter(|a| a.ip.is_ipv4())
        .find_map(|a| dp.endpoints().get(a.ip).ok().flatten())
        .filter(|info| info.id == ep.id)
        .map_or(0, |info| info.flags.0);
    Enforcement {
        ingress: flags & EndpointFlags::ENFORCE_INGRESS.0 != 0,
        egress: flags & EndpointFlags::ENFORCE_EGRESS.0 != 0,
    }
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

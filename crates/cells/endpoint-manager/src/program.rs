//! Programming the datapath for an endpoint: its map entries and its attached programs.

use std::net::IpAddr;

use cellium_datapath_bpf::{Datapath, EndpointFlags, EndpointInfo, MacAddr};

use crate::endpoint::Endpoint;

/// What the datapath must enforce for an endpoint beyond its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Enforcement {
    /// The endpoint's ingress is restricted by policy.
    pub ingress: bool,
    /// The endpoint's egress is restricted by policy.
    pub egress: bool,
    /// The ingress default deny is only audited (every policy that switched it on is in
    /// audit mode): what it would drop passes, reported as an audit verdict.
    pub ingress_audit: bool,
    /// The same for egress.
    pub egress_audit: bool,
}

/// Writes the endpoint's entries in the endpoint map (one per address, IPv4 and IPv6) with its
/// identity and the directions enforced: what the datapath checks sources against, finds
/// local destinations by, and enforces policy for, in both families.
///
/// An address the map did not name for this endpoint yet (a new endpoint, or one taking an
/// address over) loses its conntrack entries right after its entry is written: connections
/// recorded while the address was someone else's, or nobody's, would otherwise skip this
/// endpoint's policy. The entry comes first so that no packet can record state for the address
/// as a non-local destination once the flush ran. A packet that read the map just before the
/// write may still record one after the flush: such an entry is marked as recorded towards a
/// non-local destination, and the datapath checks this endpoint's ingress policy before it
/// delivers a packet of it (`ct_unchecked` in `bpf/lib/conntrack.h`), so no grace period is
/// waited for here.
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
    if enforcement.ingress_audit {
        flags = flags | EndpointFlags::AUDIT_INGRESS;
    }
    if enforcement.egress_audit {
        flags = flags | EndpointFlags::AUDIT_EGRESS;
    }
    let info = EndpointInfo {
        ifindex: ep.host_ifindex,
        id: ep.id,
        flags,
        identity: ep.identity,
        host_mac: MacAddr(ep.host_mac),
        pod_mac: MacAddr(ep.pod_mac),
        cluster_identity: ep.cluster_identity,
    };
    let mut taken = Vec::new();
    for addr in &ep.addresses {
        let current = dp.endpoints().get(addr.ip)?;
        dp.endpoints().put(addr.ip, &info)?;
        if !current.is_some_and(|c| names(&c, ep)) {
            taken.push(addr.ip);
        }
    }
    if !taken.is_empty() {
        dp.conntrack().flush_addresses(&taken)?;
    }
    Ok(())
}

/// What the endpoint map says the endpoint enforces (nothing if it has no entry).
pub fn read_enforcement(dp: &Datapath, ep: &Endpoint) -> Enforcement {
    let flags = ep
        .addresses
        .iter()
        .filter_map(|a| dp.endpoints().get(a.ip).ok().flatten())
        .find(|info| info.id == ep.id)
        .map_or(0, |info| info.flags.0);
    Enforcement::from_flags(EndpointFlags(flags))
}

impl Enforcement {
    /// What endpoint map flags say.
    pub fn from_flags(flags: EndpointFlags) -> Enforcement {
        Enforcement {
            ingress: flags.contains(EndpointFlags::ENFORCE_INGRESS),
            egress: flags.contains(EndpointFlags::ENFORCE_EGRESS),
            ingress_audit: flags.contains(EndpointFlags::AUDIT_INGRESS),
            egress_audit: flags.contains(EndpointFlags::AUDIT_EGRESS),
        }
    }
}

/// Removes the endpoint's entries (both families), the conntrack and NAT state of its
/// addresses, its policy map (retired: out of `cel_policy` in the background) and its
/// programs. What is already gone is fine.
///
/// Every removal path (CNI DEL, a failed create, a leftover found at restart) comes here, so
/// no connection recorded for a removed endpoint can be found by the next holder of its
/// address.
pub fn unprogram(dp: &Datapath, ep: &Endpoint) -> cellium_datapath_bpf::Result<()> {
    let mut released: Vec<IpAddr> = Vec::new();
    for addr in &ep.addresses {
        // Only the entry that is still ours: the address may already serve a newer endpoint,
        // whose connections are not ours to flush either.
        match dp.endpoints().get(addr.ip)? {
            Some(info) if info.id != ep.id => continue,
            Some(_) => {
                dp.endpoints().delete(addr.ip)?;
            }
            None => {}
        }
        released.push(addr.ip);
    }
    dp.conntrack().flush_addresses(&released)?;
    // Its entries are gone from the endpoint map: the policy map can leave `cel_policy` later,
    // off the DEL's path (that removal waits for a grace period).
    dp.policy().retire_endpoint(ep.id)?;
    if ep.host_ifindex != 0 {
        dp.detach(ep.host_ifindex)?;
    }
    Ok(())
}

/// Whether a map entry is this endpoint's, on its current interface.
fn names(info: &EndpointInfo, ep: &Endpoint) -> bool {
    info.id == ep.id && info.ifindex == ep.host_ifindex
}

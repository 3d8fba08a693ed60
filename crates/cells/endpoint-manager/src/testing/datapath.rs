//! The datapath's maps and attachments, in memory: a fake of [`EndpointDatapath`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Mutex;

use cellium_datapath_bpf::{EndpointInfo, MacAddr, PolicyEntry, Verdict};

use super::{Faults, Journal, lock};
use crate::datapath::EndpointDatapath;
use crate::endpoint::Endpoint;
use crate::program::Enforcement;

/// The datapath's endpoint map, policy map and attachments, in memory.
#[derive(Debug, Default)]
pub(crate) struct FakeDatapath {
    journal: Journal,
    faults: Faults,
    state: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    endpoints: BTreeMap<IpAddr, EndpointInfo>,
    policy: BTreeMap<PolicyEntry, Verdict>,
    attached: BTreeSet<u32>,
}

impl FakeDatapath {
    /// Empty, recording into `journal` and failing as `faults` say.
    pub(crate) fn new(journal: &Journal, faults: &Faults) -> FakeDatapath {
        FakeDatapath {
            journal: journal.clone(),
            faults: faults.clone(),
            state: Mutex::default(),
        }
    }

    fn fault(&self, call: &'static str, what: String) -> cellium_datapath_bpf::Result<()> {
        self.journal
            .push(format!("{call} {what}").trim_end().to_string());
        if self.faults.strikes(call) {
            return Err(cellium_datapath_bpf::Error::InvalidInput {
                what: call.into(),
                reason: "injected failure".into(),
            });
        }
        Ok(())
    }

    /// The endpoint-map entries.
    pub(crate) fn entries(&self) -> BTreeMap<IpAddr, EndpointInfo> {
        lock(&self.state).endpoints.clone()
    }

    /// The endpoint ids with policy entries.
    pub(crate) fn policy_ids(&self) -> BTreeSet<u16> {
        lock(&self.state)
            .policy
            .keys()
            .map(|e| e.endpoint_id)
            .collect()
    }

    /// The policy entries, read without recording a call.
    pub(crate) fn policy(&self) -> Vec<(PolicyEntry, Verdict)> {
        lock(&self.state)
            .policy
            .iter()
            .map(|(e, v)| (*e, *v))
            .collect()
    }

    /// The interfaces with programs.
    pub(crate) fn attachments(&self) -> BTreeSet<u32> {
        lock(&self.state).attached.clone()
    }

    /// Adds an endpoint-map entry and a policy entry, as a previous run would have left
    /// them, and attaches programs to `ifindex`.
    pub(crate) fn add_leftover(&self, ip: IpAddr, id: u16, ifindex: u32) {
        let mut maps = lock(&self.state);
        maps.endpoints.insert(
            ip,
            EndpointInfo {
                id,
                ifindex,
                ..EndpointInfo::default()
            },
        );
        maps.policy.insert(
            PolicyEntry {
                endpoint_id: id,
                direction: cellium_datapath_bpf::Direction::Ingress,
                identity: 0,
                l4: cellium_datapath_bpf::L4Match::Any,
            },
            Verdict::Allow,
        );
        maps.attached.insert(ifindex);
    }
}

impl EndpointDatapath for FakeDatapath {
    fn write_endpoint(
        &self,
        ep: &Endpoint,
        enforcement: Enforcement,
    ) -> cellium_datapath_bpf::Result<()> {
        self.fault(
            "write_endpoint",
            format!(
                "{} ingress={} egress={}",
                ep.id, enforcement.ingress, enforcement.egress
            ),
        )?;
        let mut maps = lock(&self.state);
        for addr in &ep.addresses {
            let mut flags = cellium_datapath_bpf::EndpointFlags::NONE;
            if enforcement.ingress {
                flags = flags | cellium_datapath_bpf::EndpointFlags::ENFORCE_INGRESS;
            }
            if enforcement.egress {
                flags = flags | cellium_datapath_bpf::EndpointFlags::ENFORCE_EGRESS;
            }
            maps.endpoints.insert(
                addr.ip,
                EndpointInfo {
                    ifindex: ep.host_ifindex,
                    id: ep.id,
                    flags,
                    identity: ep.identity,
                    host_mac: MacAddr(ep.host_mac),
                    pod_mac: MacAddr(ep.pod_mac),
                    cluster_identity: ep.cluster_identity,
                },
            );
        }
        Ok(())
    }

    fn read_enforcement(&self, ep: &Endpoint) -> Enforcement {
        let maps = lock(&self.state);
        let flags = ep
            .addresses
            .iter()
            .find_map(|a| maps.endpoints.get(&a.ip))
            .filter(|i| i.id == ep.id)
            .map_or(0, |i| i.flags.0);
        Enforcement::from_flags(cellium_datapath_bpf::EndpointFlags(flags))
    }

    fn apply_policy(
        &self,
        id: u16,
        current: &[(PolicyEntry, Verdict)],
        desired: &[(PolicyEntry, Verdict)],
    ) -> cellium_datapath_bpf::Result<()> {
        self.fault("apply_policy", format!("{id} ({} entries)", desired.len()))?;
        let mut maps = lock(&self.state);
        for (e, v) in desired {
            maps.policy.insert(*e, *v);
        }
        for (e, _) in current {
            if !desired.iter().any(|(d, _)| d == e) {
                maps.policy.remove(e);
            }
        }
        Ok(())
    }

    fn attach(&self, ifindex: u32) -> cellium_datapath_bpf::Result<()> {
        self.fault("attach", ifindex.to_string())?;
        lock(&self.state).attached.insert(ifindex);
        Ok(())
    }

    fn unprogram(&self, ep: &Endpoint) -> cellium_datapath_bpf::Result<()> {
        self.fault("unprogram", ep.id.to_string())?;
        let mut maps = lock(&self.state);
        for addr in &ep.addresses {
            if maps.endpoints.get(&addr.ip).is_some_and(|i| i.id == ep.id) {
                maps.endpoints.remove(&addr.ip);
            }
        }
        maps.policy.retain(|e, _| e.endpoint_id != ep.id);
        if ep.host_ifindex != 0 {
            maps.attached.remove(&ep.host_ifindex);
        }
        Ok(())
    }

    fn endpoint_entry(&self, ip: IpAddr) -> cellium_datapath_bpf::Result<Option<EndpointInfo>> {
        self.fault("endpoint_entry", ip.to_string())?;
        Ok(lock(&self.state).endpoints.get(&ip).copied())
    }

    fn endpoint_entries(&self) -> cellium_datapath_bpf::Result<Vec<(IpAddr, EndpointInfo)>> {
        self.fault("endpoint_entries", String::new())?;
        Ok(lock(&self.state)
            .endpoints
            .iter()
            .map(|(ip, i)| (*ip, *i))
            .collect())
    }

    fn delete_endpoint_entry(&self, ip: IpAddr) -> cellium_datapath_bpf::Result<bool> {
        self.fault("delete_endpoint_entry", ip.to_string())?;
        Ok(lock(&self.state).endpoints.remove(&ip).is_some())
    }

    fn policy_entries(&self) -> cellium_datapath_bpf::Result<Vec<(PolicyEntry, Verdict)>> {
        self.fault("policy_entries", String::new())?;
        Ok(lock(&self.state)
            .policy
            .iter()
            .map(|(e, v)| (*e, *v))
            .collect())
    }

    fn policy_endpoints(&self) -> cellium_datapath_bpf::Result<Vec<u16>> {
        self.fault("policy_endpoints", String::new())?;
        let mut ids: Vec<u16> = lock(&self.state)
            .policy
            .keys()
            .map(|e| e.endpoint_id)
            .collect();
        ids.dedup();
        Ok(ids)
    }

    fn clear_policy(&self, id: u16) -> cellium_datapath_bpf::Result<usize> {
        self.fault("clear_policy", id.to_string())?;
        let mut maps = lock(&self.state);
        let before = maps.policy.len();
        maps.policy.retain(|e, _| e.endpoint_id != id);
        Ok(before - maps.policy.len())
    }

    fn attached(&self) -> cellium_datapath_bpf::Result<Vec<u32>> {
        self.fault("attached", String::new())?;
        Ok(lock(&self.state).attached.iter().copied().collect())
    }

    fn detach(&self, ifindex: u32) -> cellium_datapath_bpf::Result<()> {
        self.fault("detach", ifindex.to_string())?;
        lock(&self.state).attached.remove(&ifindex);
        Ok(())
    }
}

//! What the endpoint manager writes into (and reads back from) the datapath, as a trait.
//!
//! The real implementation is the loaded [`Datapath`]; the order and failure handling of
//! create, delete, restore and sweep are unit-tested against a recording one that fails on
//! demand (`crate::testing`), and end to end against the real one under `integration/`.

use std::net::IpAddr;

use cellium_datapath_bpf::{Datapath, EndpointInfo, Hook, PolicyEntry, Result, Verdict};

use crate::endpoint::Endpoint;
use crate::program::{self, Enforcement};

/// The datapath as the endpoint manager uses it.
pub(crate) trait EndpointDatapath: Send + Sync {
    /// Writes the endpoint's entries in the endpoint map with its identity and the directions
    /// enforced.
    fn write_endpoint(&self, ep: &Endpoint, enforcement: Enforcement) -> Result<()>;

    /// What the endpoint map says the endpoint enforces (nothing if it has no entry).
    fn read_enforcement(&self, ep: &Endpoint) -> Enforcement;

    /// Turns endpoint `id`'s policy entries from `current` (what the caller knows the map
    /// holds) into `desired`, in an order that never allows more than either.
    fn apply_policy(
        &self,
        id: u16,
        current: &[(PolicyEntry, Verdict)],
        desired: &[(PolicyEntry, Verdict)],
    ) -> Result<()>;

    /// Attaches the programs to a host end, replacing older ones without a gap.
    fn attach(&self, ifindex: u32) -> Result<()>;

    /// Removes the endpoint's entries (those still its own), policy entries and programs.
    /// What is already gone is fine.
    fn unprogram(&self, ep: &Endpoint) -> Result<()>;

    /// The endpoint-map entry of `ip`.
    fn endpoint_entry(&self, ip: IpAddr) -> Result<Option<EndpointInfo>>;

    /// Every endpoint-map entry.
    fn endpoint_entries(&self) -> Result<Vec<(IpAddr, EndpointInfo)>>;

    /// Removes the endpoint-map entry of `ip` and the connections and NAT state naming `ip`
    /// (whoever has the address next must inherit none of them); returns whether there was
    /// an entry.
    fn delete_endpoint_entry(&self, ip: IpAddr) -> Result<bool>;

    /// Every policy entry of every endpoint.
    fn policy_entries(&self) -> Result<Vec<(PolicyEntry, Verdict)>>;

    /// The endpoints that have a policy map, empty or not.
    fn policy_endpoints(&self) -> Result<Vec<u16>>;

    /// Removes endpoint `id`'s policy map (for an id the endpoint map does not name); returns
    /// how many entries it held.
    fn clear_policy(&self, id: u16) -> Result<usize>;

    /// Gives each of `spares` (the ids the next endpoints get) an empty policy map in
    /// advance and finishes the removal of retired ones: the map changes that wait for an
    /// RCU grace period, done off the ADD and DEL paths.
    fn keep_policy_maps(&self, _spares: &[u16]) -> Result<()> {
        Ok(())
    }

    /// The interfaces (indexes) programs are attached to.
    fn attached(&self) -> Result<Vec<u32>>;

    /// Detaches the programs from interface `ifindex`. Nothing attached is fine.
    fn detach(&self, ifindex: u32) -> Result<()>;

    /// The bytes the datapath's encapsulation adds to pods' packets (tunnel mode), which
    /// their MTU leaves room for; 0 when it cannot be read.
    fn encap_overhead(&self) -> u32 {
        0
    }
}

impl EndpointDatapath for Datapath {
    fn write_endpoint(&self, ep: &Endpoint, enforcement: Enforcement) -> Result<()> {
        program::write_endpoint(self, ep, enforcement)
    }

    fn read_enforcement(&self, ep: &Endpoint) -> Enforcement {
        program::read_enforcement(self, ep)
    }

    fn apply_policy(
        &self,
        id: u16,
        current: &[(PolicyEntry, Verdict)],
        desired: &[(PolicyEntry, Verdict)],
    ) -> Result<()> {
        self.policy().apply_diff(id, current, desired).map(|_| ())
    }

    fn attach(&self, ifindex: u32) -> Result<()> {
        Datapath::attach(self, ifindex).map(|_| ())
    }

    fn unprogram(&self, ep: &Endpoint) -> Result<()> {
        program::unprogram(self, ep)
    }

    fn endpoint_entry(&self, ip: IpAddr) -> Result<Option<EndpointInfo>> {
        self.endpoints().get(ip)
    }

    fn endpoint_entries(&self) -> Result<Vec<(IpAddr, EndpointInfo)>> {
        self.endpoints().entries()
    }

    fn delete_endpoint_entry(&self, ip: IpAddr) -> Result<bool> {
        let removed = self.endpoints().delete(ip)?;
        self.conntrack().flush_addresses(&[ip])?;
        Ok(removed)
    }

    fn policy_entries(&self) -> Result<Vec<(PolicyEntry, Verdict)>> {
        self.policy().entries()
    }

    fn policy_endpoints(&self) -> Result<Vec<u16>> {
        self.policy().endpoint_ids()
    }

    fn clear_policy(&self, id: u16) -> Result<usize> {
        // Retired rather than removed: a restart that sweeps many maps does not wait for a
        // grace period for each.
        let held = self.policy().endpoint_entries(id)?.len();
        self.policy().retire_endpoint(id)?;
        Ok(held)
    }

    fn keep_policy_maps(&self, spares: &[u16]) -> Result<()> {
        let added = self.policy().maintain(spares)?;
        tracing::debug!(added, "spare endpoint policy maps");
        Ok(())
    }

    fn attached(&self) -> Result<Vec<u32>> {
        // The overlay device's program is node discovery's, not an endpoint's.
        Ok(Datapath::attached(self)?
            .into_iter()
            .filter(|a| Hook::ENDPOINT.contains(&a.hook))
            .map(|a| a.ifindex)
            .collect())
    }

    fn detach(&self, ifindex: u32) -> Result<()> {
        Datapath::detach(self, ifindex)
    }

    fn encap_overhead(&self) -> u32 {
        self.config().encap_overhead().unwrap_or(0)
    }
}

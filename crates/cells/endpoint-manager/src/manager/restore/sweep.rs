//! Removing what no endpoint accounts for: the debris of creates and deletes a crash cut
//! short.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use cellium_datapath_bpf::EndpointInfo;

use crate::endpoint::Endpoint;
use crate::error::chain;
use crate::manager::{Backends, EndpointManager};
use crate::store::Unreadable;

/// What the node holds that no known endpoint accounts for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Leftovers {
    /// Host ends (named like ours) of no endpoint, as (name, index).
    pub(crate) links: Vec<(String, u32)>,
    /// Endpoint-map entries of ids no endpoint has.
    pub(crate) entries: Vec<(IpAddr, EndpointInfo)>,
    /// Ids of no endpoint that have policy entries.
    pub(crate) policy: BTreeSet<u16>,
    /// Interfaces of no endpoint that have programs attached.
    pub(crate) attachments: BTreeSet<u32>,
}

impl Leftovers {
    /// Sorts what the node holds into what `known` endpoints account for and the rest.
    pub(crate) fn find(
        known: &[Arc<Endpoint>],
        links: Vec<(String, u32)>,
        entries: Vec<(IpAddr, EndpointInfo)>,
        policy_ids: impl IntoIterator<Item = u16>,
        attached: impl IntoIterator<Item = u32>,
    ) -> Leftovers {
        let names: HashSet<&str> = known.iter().map(|e| e.host_ifname.as_str()).collect();
        let ids: HashSet<u16> = known.iter().map(|e| e.id).collect();
        let ifindexes: HashSet<u32> = known.iter().map(|e| e.host_ifindex).collect();
        Leftovers {
            links: links
                .into_iter()
                .filter(|(n, _)| !names.contains(n.as_str()))
                .collect(),
            entries: entries
                .into_iter()
                .filter(|(_, info)| !ids.contains(&info.id))
                .collect(),
            policy: policy_ids
                .into_iter()
                .filter(|id| !ids.contains(id))
                .collect(),
            attachments: attached
                .into_iter()
                .filter(|i| !ifindexes.contains(i))
                .collect(),
        }
    }

    /// The endpoint ids these hold.
    pub(crate) fn ids(&self) -> BTreeSet<u16> {
        self.entries
            .iter()
            .map(|(_, info)| info.id)
            .chain(self.policy.iter().copied())
            .collect()
    }
}

/// What was kept of the leftovers because records could not be read.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    /// Host ends kept.
    pub(crate) links: usize,
    /// Addresses reserved in IPAM.
    pub(crate) addresses: BTreeSet<IpAddr>,
    /// Endpoint ids held back from new endpoints.
    pub(crate) ids: BTreeSet<u16>,
    /// What could not be read, with why.
    pub(crate) failures: Vec<String>,
}

impl Kept {
    /// `1 interface, 1 address (10.244.0.3), endpoint ids 2`.
    pub(crate) fn describe(&self) -> String {
        let ips: Vec<String> = self.addresses.iter().map(IpAddr::to_string).collect();
        let ids: Vec<String> = self.ids.iter().map(u16::to_string).collect();
        format!(
            "{} interface(s), {} address(es) [{}], endpoint ids [{}]",
            self.links,
            self.addresses.len(),
            ips.join(", "),
            ids.join(", ")
        )
    }
}

/// What a sweep did.
#[derive(Debug, Default)]
pub(crate) struct Swept {
    /// Leftovers removed.
    pub(crate) removed: usize,
    /// What could not be read or removed, with why.
    pub(crate) failures: Vec<String>,
    /// Ids whose policy entries may remain: not to be handed out.
    pub(crate) held_ids: BTreeSet<u16>,
}

impl EndpointManager {
    /// Keeps the leftovers from new endpoints instead of removing them, since they may belong
    /// to records that could not be read: their ids (and those the unreadable records' names
    /// give) are not handed out, and the addresses they hold (endpoint-map entries, routes
    /// through host ends no endpoint has) are reserved in IPAM. Links, entries and programs
    /// stay as they are, so those pods keep their connectivity and policy.
    pub(crate) async fn keep(
        &self,
        b: &Backends,
        leftovers: &Leftovers,
        unreadable: &[Unreadable],
    ) -> Kept {
        let mut kept = Kept {
            links: leftovers.links.len(),
            ids: leftovers.ids(),
            ..Kept::default()
        };
        kept.ids.extend(unreadable.iter().filter_map(|u| u.id));
        self.endpoints.hold_ids(kept.ids.iter().copied());
        let mut held: Vec<(IpAddr, String)> = leftovers
            .entries
            .iter()
            .map(|(ip, info)| (*ip, format!("endpoint {} (record unreadable)", info.id)))
            .collect();
        match b.interfaces.host_routes().await {
            Ok(routes) => {
                for (ip, oif) in routes {
                    if let Some((name, _)) = leftovers.links.iter().find(|(_, i)| *i == oif) {
                        held.push((ip, format!("endpoint on {name} (record unreadable)")));
                    }
                }
            }
            Err(e) => kept
                .failures
                .push(format!("listing routes to pods: {}", chain(&e))),
        }
        for (ip, owner) in held {
            // Refused when already held (by the same leftover, or a restored endpoint) or
            // outside the pools (then never handed out anyway): nothing to keep in either case.
            // Restored, not allocated: these addresses were never released.
            if self.ipam.restore(ip, &owner).is_ok() {
                kept.addresses.insert(ip);
            }
        }
        kept
    }

    /// What the node holds that no endpoint in the table accounts for. A listing that fails
    /// is a failure: the caller must not take the leftovers for complete.
    pub(crate) async fn leftovers(&self, b: &Backends) -> (Leftovers, Vec<String>) {
        let mut failures = Vec::new();
        let mut fail = |what: &str, e: &dyn std::error::Error| {
            failures.push(format!("listing {what}: {}", chain(e)));
        };
        let links = b.interfaces.host_links().await.map_or_else(
            |e| {
                fail("interfaces", &e);
                Vec::new()
            },
            |links| links.into_iter().map(|(n, l)| (n, l.index)).collect(),
        );
        let entries = b.datapath.endpoint_entries().unwrap_or_else(|e| {
            fail("endpoint-map entries", &e);
            Vec::new()
        });
        let policy = b.datapath.policy_endpoints().unwrap_or_else(|e| {
            fail("policy maps", &e);
            Vec::new()
        });
        let attached = b.datapath.attached().unwrap_or_else(|e| {
            fail("attachments", &e);
            Vec::new()
        });
        let found = Leftovers::find(&self.snapshot(), links, entries, policy, attached);
        (found, failures)
    }

    /// Removes the leftovers: host ends, endpoint-map entries, policy entries, attachments.
    /// Every removal is attempted; the ids of entries that could not be removed are held
    /// back from new endpoints, which would inherit them.
    pub(crate) async fn sweep(&self, b: &Backends, leftovers: &Leftovers) -> Swept {
        let mut swept = Swept::default();
        for (name, _) in &leftovers.links {
            match b.interfaces.teardown_pod(name).await {
                Ok(true) => {
                    tracing::info!(interface = %name, "leftover interface removed");
                    swept.removed += 1;
                }
                Ok(false) => {}
                Err(e) => swept
                    .failures
                    .push(format!("interface {name}: {}", chain(&e))),
            }
        }
        for (ip, info) in &leftovers.entries {
            match b.datapath.delete_endpoint_entry(*ip) {
                Ok(removed) => swept.removed += usize::from(removed),
                Err(e) => {
                    swept.held_ids.insert(info.id);
                    swept
                        .failures
                        .push(format!("endpoint-map entry of {ip}: {}", chain(&e)));
                }
            }
        }
        for id in &leftovers.policy {
            match b.datapath.clear_policy(*id) {
                Ok(n) => swept.removed += n,
                Err(e) => {
                    swept.held_ids.insert(*id);
                    swept
                        .failures
                        .push(format!("policy map of endpoint id {id}: {}", chain(&e)));
                }
            }
        }
        for ifindex in &leftovers.attachments {
            match b.datapath.detach(*ifindex) {
                Ok(()) => swept.removed += 1,
                Err(e) => swept
                    .failures
                    .push(format!("programs on interface {ifindex}: {}", chain(&e))),
            }
        }
        swept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::endpoint;

    fn info(id: u16, ifindex: u32) -> EndpointInfo {
        EndpointInfo {
            id,
            ifindex,
            ..EndpointInfo::default()
        }
    }

    #[test]
    fn leftovers_are_what_no_known_endpoint_has() {
        let known = vec![Arc::new(endpoint(1, "a")), Arc::new(endpoint(2, "b"))];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let found = Leftovers::find(
            &known,
            vec![
                ("lxc1".into(), 1),
                ("lxc2".into(), 2),
                ("lxcdead".into(), 30),
            ],
            vec![
                (ip("10.244.0.1"), info(1, 1)),
                (ip("10.244.0.9"), info(9, 30)),
            ],
            [1, 2, 9, 9, 11],
            [1, 2, 30],
        );
        assert_eq!(found.links, vec![("lxcdead".to_string(), 30)]);
        assert_eq!(found.entries, vec![(ip("10.244.0.9"), info(9, 30))]);
        assert_eq!(found.policy, BTreeSet::from([9, 11]));
        assert_eq!(found.attachments, BTreeSet::from([30]));
        assert_eq!(found.ids(), BTreeSet::from([9, 11]));
    }
}

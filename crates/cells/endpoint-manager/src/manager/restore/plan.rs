//! Deciding what the restore does with each record, before anything is changed.

use std::collections::{BTreeSet, HashMap};

use cellium_ipam::ROUTER_OWNER;

use crate::endpoint::{Endpoint, State};
use crate::error::{Error, Result, chain};
use crate::manager::{Backends, EndpointManager};
use crate::plumbing::Link;
use crate::store::Unreadable;

/// What the restore will do.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Endpoints to bring back, with their host end's index and MAC as found now, and their
    /// addresses reserved again.
    pub(crate) restore: Vec<Endpoint>,
    /// Those of them whose host end was found at another index or MAC than recorded: their
    /// records are to be written again.
    pub(crate) moved: BTreeSet<u16>,
    /// Endpoints to remove, each with why.
    pub(crate) remove: Vec<(Endpoint, String)>,
    /// Records that could not be read.
    pub(crate) unreadable: Vec<Unreadable>,
    /// Why the records could not be listed at all, if they could not.
    pub(crate) unlisted: Option<String>,
}

impl Plan {
    /// Why some of what the node holds may belong to endpoints the agent cannot know, if it
    /// may: a record that cannot be read, or records that cannot be listed.
    pub(crate) fn unknown(&self) -> Option<String> {
        if let Some(why) = &self.unlisted {
            return Some(format!("endpoint records cannot be listed ({why})"));
        }
        let each: Vec<String> = self
            .unreadable
            .iter()
            .map(|u| format!("endpoint record {} cannot be read ({})", u.file, u.reason))
            .collect();
        (!each.is_empty()).then(|| each.join(", "))
    }
}

/// Why a record is not restored, or `None` when it is: from its state and from whether its
/// host end still exists. That is what proves the pod's network namespace exists: the agent
/// cannot reopen it (the recorded path may be one only the runtime sees), but a veth pair lives
/// exactly as long as both its namespaces.
pub(crate) fn verdict(ep: &Endpoint, host: Option<&Link>) -> Option<String> {
    match ep.state {
        State::Creating => Some("its creation never finished".into()),
        State::Deleting => Some("its deletion never finished".into()),
        State::Ready if host.is_none() => Some(format!(
            "its interface {} is gone, and with it its network namespace {}",
            ep.host_ifname,
            ep.netns.display()
        )),
        State::Ready => None,
    }
}

/// Why an address cannot be reserved again for a restored endpoint.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The configured pod CIDRs do not cover it (or it is their network, broadcast or router
    /// address now).
    OutsidePodCidr(String),
    /// Another restored endpoint holds it.
    Taken(String),
}

impl EndpointManager {
    /// Reads the records and decides, for each, whether it is restored or removed. Nothing is
    /// changed but IPAM: the addresses of the endpoints to restore are reserved again (those
    /// of the endpoints to remove too, when free, so that their teardown finds them its own).
    pub(crate) async fn plan(&self, b: &Backends) -> Result<Plan> {
        let loaded = match self.store.load() {
            Ok(loaded) => loaded,
            Err(e) => {
                let why = chain(&e);
                tracing::error!(error = %why, "endpoint records cannot be listed: nothing restored, nothing removed");
                return Ok(Plan {
                    unlisted: Some(why),
                    ..Plan::default()
                });
            }
        };
        let mut plan = Plan {
            unreadable: loaded.unreadable,
            ..Plan::default()
        };
        for u in &plan.unreadable {
            tracing::error!(file = %u.file, reason = %u.reason, "unreadable endpoint record");
        }
        // One listing of the host ends for every record. A host end still there is what proves
        // that the pod's network namespace still exists: the agent cannot reopen the namespace
        // (no descriptor survives a restart, and the recorded path may be one only the runtime
        // can see), but a veth pair lives exactly as long as both of its namespaces.
        let links: HashMap<String, Link> = if loaded.records.is_empty() {
            HashMap::new()
        } else {
            b.interfaces
                .host_links()
                .await
                .map_err(|source| Error::Plumbing {
                    endpoint: "(host ends of the records)".into(),
                    source,
                })?
                .into_iter()
                .collect()
        };
        for mut ep in loaded.records {
            let host = if ep.state == State::Ready {
                links.get(&ep.host_ifname).cloned()
            } else {
                None
            };
            match verdict(&ep, host.as_ref()) {
                Some(why) => plan.remove.push((ep, why)),
                None => {
                    if let Some(link) = host
                        && (link.index, link.mac) != (ep.host_ifindex, ep.host_mac)
                    {
                        ep.host_ifindex = link.index;
                        ep.host_mac = link.mac;
                        plan.moved.insert(ep.id);
                    }
                    plan.restore.push(ep);
                }
            }
        }
        let candidates = std::mem::take(&mut plan.restore);
        let mut outside = Vec::new();
        for ep in candidates {
            match self.reserve(&ep) {
                Ok(()) => plan.restore.push(ep),
                Err(Refusal::Taken(why)) => plan.remove.push((ep, why)),
                Err(Refusal::OutsidePodCidr(why)) => outside.push((ep, why)),
            }
        }
        if !outside.is_empty() {
            // The configured CIDRs changed under running pods. Removing them is the user's
            // call, not a side effect of a restart: without the key, refuse to start with
            // nothing changed.
            if !self.cfg.remove_endpoints_outside_pod_cidr {
                for ep in &plan.restore {
                    self.release_addresses(ep);
                }
                return Err(self.outside_error(&outside));
            }
            plan.remove.extend(outside.into_iter().map(|(ep, why)| {
                (
                    ep,
                    format!("{why} (remove-endpoints-outside-pod-cidr is set)"),
                )
            }));
        }
        for (ep, _) in &plan.remove {
            let _ = self.reserve(ep);
        }
        Ok(plan)
    }

    /// The refusal to start over endpoints outside the pod CIDRs: each with its addresses,
    /// and the CIDRs configured now.
    fn outside_error(&self, outside: &[(Endpoint, String)]) -> Error {
        let cidrs: Vec<String> = self
            .ipam
            .pools()
            .iter()
            .map(|p| p.cidr.to_string())
            .collect();
        Error::OutsidePodCidr {
            endpoints: outside
                .iter()
                .map(|(ep, _)| {
                    let ips: Vec<String> = ep.addresses.iter().map(|a| a.ip.to_string()).collect();
                    format!("{} at {}", ep.describe(), ips.join(" and "))
                })
                .collect(),
            cidrs: cidrs.join(", "),
        }
    }

    /// Reserves the endpoint's addresses again, under its name; all of them or none.
    pub(crate) fn reserve(&self, ep: &Endpoint) -> Result<(), Refusal> {
        let owner = ep.describe();
        let mut taken = Vec::new();
        for addr in &ep.addresses {
            // Restored, not allocated: the address was never released, so a quarantine (all
            // free addresses are in one when IPAM's record could not be read) does not apply.
            let refusal = match self.ipam.restore(addr.ip, &owner) {
                Ok(_) => {
                    taken.push(addr.ip);
                    continue;
                }
                Err(e @ cellium_ipam::Error::InUse { .. })
                    if self.ipam.owner(addr.ip).as_deref() != Some(ROUTER_OWNER) =>
                {
                    Refusal::Taken(format!("its address cannot be reserved again: {e}"))
                }
                Err(e) => Refusal::OutsidePodCidr(format!(
                    "its address {} is not usable in the configured pod CIDRs: {e}",
                    addr.ip
                )),
            };
            for ip in taken {
                self.ipam.release(ip);
            }
            return Err(refusal);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Harness, endpoint};

    fn link() -> Link {
        Link {
            index: 9,
            mac: [2, 0, 0, 0, 0, 9],
            mtu: 1500,
            up: true,
        }
    }

    #[test]
    fn only_ready_records_whose_pod_and_interface_exist_are_restored() {
        let mut ep = endpoint(7, "c7");
        assert_eq!(verdict(&ep, Some(&link())), None);
        let gone = verdict(&ep, None).unwrap();
        assert!(
            gone.contains(
                "interface lxc7 is gone, and with it its network namespace /run/netns/c7"
            ),
            "{gone}"
        );
        ep.state = State::Creating;
        let half = verdict(&ep, Some(&link())).unwrap();
        assert!(half.contains("creation never finished"), "{half}");
        ep.state = State::Deleting;
        let half = verdict(&ep, Some(&link())).unwrap();
        assert!(half.contains("deletion never finished"), "{half}");
    }

    /// Two pods, one at 10.244.0.2 and one at 10.244.0.200; the agent restarted with
    /// 10.244.0.0/25, which covers only the first.
    async fn shrunk(cfg: crate::config::EndpointConfig) -> (Harness, Endpoint, Endpoint) {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let inside = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        let mut far = h.request("b");
        far.requested_ips = vec!["10.244.0.200".parse().unwrap()];
        let outside = h.manager.create(far).await.unwrap();
        h.configure(cfg);
        h.restart(&["10.244.0.0/25"]);
        h.journal.clear();
        (h, inside, outside)
    }

    #[tokio::test]
    async fn endpoints_outside_the_pod_cidr_stop_the_start_naming_them() {
        let (h, inside, outside) = shrunk(Default::default()).await;
        let err = h.start().await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::OutsidePodCidr { .. }), "{text}");
        assert!(
            text.contains("(10.244.0.0/25): endpoint 2 (container b) at 10.244.0.200;"),
            "{text}"
        );
        assert!(text.contains("remove-endpoints-outside-pod-cidr"), "{text}");
        assert!(!text.contains("endpoint 1"), "{text}");
        assert!(
            h.journal
                .only(&["teardown_pod", "unprogram", "attach "])
                .is_empty(),
            "{:?}",
            h.journal.calls()
        );
        let links = h.interfaces.links();
        assert!(links.contains(&inside.host_ifname) && links.contains(&outside.host_ifname));
        assert_eq!(
            h.owner("10.244.0.2"),
            None,
            "the plan's reservations are undone"
        );
        assert_eq!(h.record_state(outside.id).as_deref(), Some("ready"));
    }

    #[tokio::test]
    async fn with_the_key_set_endpoints_outside_the_pod_cidr_are_removed() {
        let cfg = crate::config::EndpointConfig {
            remove_endpoints_outside_pod_cidr: true,
            ..Default::default()
        };
        let (h, inside, outside) = shrunk(cfg).await;
        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("1 endpoints restored, 1 removed"),
            "{summary}"
        );
        assert_eq!(h.interfaces.links(), vec![inside.host_ifname.clone()]);
        assert_eq!(h.record_state(outside.id), None);
        assert_eq!(h.manager.find("a", "eth0").unwrap().state, State::Ready);
    }
}

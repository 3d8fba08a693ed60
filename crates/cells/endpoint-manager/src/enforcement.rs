//! Making the datapath enforce an endpoint's policy, and remembering what it enforces.
//!
//! Without a policy repository (an agent built without the `policy-repo` cell) every
//! endpoint's policy is [`unrestricted`]: no direction is enforced, so the datapath allows
//! all its traffic, and what a previous agent enforced on the same pinned maps is released.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_datapath_bpf::{PolicyEntry, Verdict, compile_policy};
use cellium_hive::Reporter;
use cellium_ipcache::{Ipcache, Source};
use cellium_policy_repo::{EndpointPolicy, PolicyRepository, Subject};
use cellium_resources::{NamedPort, Resources};
use ipnet::IpNet;
use prometheus_client::metrics::gauge::Gauge;

use crate::datapath::EndpointDatapath;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::labels;
use crate::program::Enforcement as Directions;

/// What the datapath enforces for one endpoint, as last written.
#[derive(Debug, Clone, Default)]
pub struct Enforced {
    /// The policy map entries (shared: reading them costs no copy).
    pub entries: Arc<Vec<(PolicyEntry, Verdict)>>,
    /// The directions the endpoint map entry enforces.
    pub enforcement: Directions,
    /// The identity the endpoint map entry carries (0 when not known).
    pub identity: u32,
    /// The policy those came from (its revision and peers), once computed.
    pub policy: Option<Arc<EndpointPolicy>>,
    /// The named ports of the endpoint's pod it was resolved with: kept for a Pod object that
    /// is gone while its endpoint lives, as its labels are.
    pub ports: Vec<NamedPort>,
    /// Set while the endpoint is locked down because its policy does not fit its share of the
    /// policy map: it enforces both directions with no entry.
    pub overflow: Option<Overflow>,
}

/// A policy that needs more policy map entries than one endpoint may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The entries the policy compiles to.
    pub needed: usize,
    /// `bpf-policy-map-max`.
    pub limit: usize,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "locked down: its policy needs {} policy map entries, more than bpf-policy-map-max ({}); all its traffic is denied both ways",
            self.needed, self.limit
        )
    }
}

/// Every endpoint's [`Enforced`] state, kept in memory so that a regeneration writes only
/// the differences (reading the policy map per endpoint would cost a pass over the whole map).
#[derive(Debug, Default)]
pub struct EnforcedTable(Mutex<HashMap<u16, Enforced>>);

impl EnforcedTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<u16, Enforced>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What endpoint `id` enforces.
    pub fn get(&self, id: u16) -> Option<Enforced> {
        self.lock().get(&id).cloned()
    }

    /// The endpoints locked down because their policy does not fit, by id.
    pub fn overflowing(&self) -> Vec<(u16, Overflow)> {
        let mut out: Vec<_> = self
            .lock()
            .iter()
            .filter_map(|(id, e)| e.overflow.map(|o| (*id, o)))
            .collect();
        out.sort_by_key(|(id, _)| *id);
        out
    }
}

/// The enforcement component: resolves endpoints' policies and writes what differs from what
/// the datapath enforces.
#[derive(Debug)]
pub(crate) struct Enforcement {
    /// `None`: no policy, nothing enforced.
    policy: Option<Arc<PolicyRepository>>,
    /// Where the pods' named ports are read (`None`: they have none).
    resources: Option<Arc<Resources>>,
    /// Where the endpoint's named ports are published for other endpoints' egress rules.
    ipcache: Option<Arc<Ipcache>>,
    enforced: EnforcedTable,
    /// `bpf-policy-map-max`: the most entries one endpoint's policy may write.
    policy_map_max: usize,
    /// Names the endpoints locked down for a policy that does not fit (`policy-maps`).
    reporter: Reporter,
    /// How many they are: `cellium_endpoint_policy_map_overflow`.
    overflowing: Gauge,
    /// Endpoints whose policy entries are not known since a write failed half-way: their
    /// next enforcement reads the map rather than trusting what it last wrote.
    unknown: Mutex<HashSet<u16>>,
}

impl Enforcement {
    pub(crate) fn new(
        policy: Option<Arc<PolicyRepository>>,
        resources: Option<Arc<Resources>>,
        ipcache: Option<Arc<Ipcache>>,
        policy_map_max: usize,
        reporter: Reporter,
    ) -> Enforcement {
        let enforcement = Enforcement {
            policy,
            resources,
            ipcache,
            enforced: EnforcedTable::default(),
            policy_map_max,
            reporter,
            overflowing: Gauge::default(),
            unknown: Mutex::default(),
        };
        enforcement.report();
        enforcement
    }

    /// Reports the endpoints locked down for a policy that does not fit. OK, not Degraded:
    /// each is held closed on its own, and a Degraded module would stop new pods' ADD on
    /// the whole node.
    fn report(&self) {
        let locked = self.enforced.overflowing();
        self.overflowing.set(locked.len() as i64);
        if locked.is_empty() {
            self.reporter.ok(format!(
                "every endpoint's policy fits bpf-policy-map-max ({})",
                self.policy_map_max
            ));
            return;
        }
        let each: Vec<String> = locked
            .iter()
            .map(|(id, o)| format!("endpoint {id} needs {}", o.needed))
            .collect();
        self.reporter.ok(format!(
            "{} endpoint(s) locked down (all traffic denied) for a policy over bpf-policy-map-max ({}): {}",
            locked.len(),
            self.policy_map_max,
            each.join(", ")
        ));
    }

    /// The gauge of the endpoints locked down for a policy that does not fit.
    pub(crate) fn overflow_gauge(&self) -> Gauge {
        self.overflowing.clone()
    }

    /// What every endpoint enforces.
    pub(crate) fn table(&self) -> &EnforcedTable {
        &self.enforced
    }

    /// The policy repository's current revision; `None` without a repository.
    pub(crate) fn revision(&self) -> Option<u64> {
        self.policy.as_ref().map(|p| p.revision())
    }

    /// Resolves the endpoint's policy and makes the datapath enforce it; returns the
    /// revision enforced.
    ///
    /// The order keeps every moment at least as strict as the endpoint's own policy: a
    /// direction that stops being enforced is released first, then the entries change, and
    /// only then does a direction that becomes enforced take effect (its allow entries are
    /// in place by then, so allowed traffic never meets a default deny).
    pub(crate) fn enforce(&self, dp: &dyn EndpointDatapath, ep: &Endpoint) -> Result<u64> {
        // Read fresh at every regeneration, so a change of the pod's ports reaches the
        // endpoints that name them even when its identity stays.
        let ports = self.publish_named_ports(ep);
        let policy = match &self.policy {
            Some(repo) => repo.resolve(&Subject {
                identity: ep.identity,
                labels: &ep.labels,
                named_ports: &ports,
            }),
            None => unrestricted(),
        };
        let datapath = |source| Error::Datapath {
            endpoint: ep.describe(),
            source,
        };
        let known = self.enforced.get(ep.id);
        let new = known.is_none();
        let mut before = known.unwrap_or_default();
        let unknown = self.unknown().contains(&ep.id);
        if unknown {
            let mut held = dp.policy_entries().map_err(datapath)?;
            held.retain(|(e, _)| e.endpoint_id == ep.id);
            before.entries = Arc::new(held);
        }
        let mut after = Directions {
            ingress: policy.ingress_enforced,
            egress: policy.egress_enforced,
            ingress_audit: policy.ingress_audit,
            egress_audit: policy.egress_audit,
        };
        // A new revision that leaves this endpoint's rules as they were (the usual case: most
        // changes concern a few endpoints) writes nothing; only the revision it enforces moves.
        let unchanged = !unknown
            && before
                .policy
                .as_ref()
                .is_some_and(|p| p.rules == policy.rules)
            && before.enforcement == after
            && before.identity == ep.identity;
        if unchanged {
            let revision = policy.revision;
            self.enforced.lock().insert(
                ep.id,
                Enforced {
                    policy: Some(policy),
                    ports,
                    ..before
                },
            );
            return Ok(revision);
        }
        let mut entries = compile_policy(ep.id, &policy.rules).map_err(datapath)?;
        // A policy that does not fit this endpoint's share of the map locks this endpoint
        // alone down, rather than filling the map for every other one: both directions
        // enforced, no entry. Going there only removes entries, which a full map never
        // refuses.
        let overflow = (entries.len() > self.policy_map_max).then_some(Overflow {
            needed: entries.len(),
            limit: self.policy_map_max,
        });
        if let Some(o) = overflow {
            tracing::warn!(endpoint = %ep.describe(), "{o}");
            entries = Vec::new();
            after = Directions {
                ingress: true,
                egress: true,
                ..Directions::default()
            };
        }
        // A new endpoint has allowed nothing yet: it is as strict as its policy from its first
        // entry on, so no connection gets into conntrack before that policy applies.
        let during = if new {
            after
        } else {
            Directions {
                ingress: before.enforcement.ingress && after.ingress,
                egress: before.enforcement.egress && after.egress,
                ingress_audit: before.enforcement.ingress_audit || after.ingress_audit,
                egress_audit: before.enforcement.egress_audit || after.egress_audit,
            }
        };
        let written = dp
            .write_endpoint(ep, during)
            .and_then(|()| dp.apply_policy(ep.id, &before.entries, &entries))
            .and_then(|()| {
                if during == after {
                    return Ok(());
                }
                dp.write_endpoint(ep, after)
            });
        if let Err(e) = written {
            // Some of the writes may have happened: the next attempt reads the map instead
            // of diffing from `before`, or it could leave entries of this attempt behind.
            self.unknown().insert(ep.id);
            return Err(datapath(e));
        }
        self.unknown().remove(&ep.id);
        let revision = policy.revision;
        let was_locked = self
            .enforced
            .get(ep.id)
            .is_some_and(|e| e.overflow.is_some());
        self.enforced.lock().insert(
            ep.id,
            Enforced {
                entries: Arc::new(entries),
                enforcement: after,
                identity: ep.identity,
                policy: Some(policy),
                ports,
                overflow,
            },
        );
        if was_locked != overflow.is_some() {
            self.report();
        }
        Ok(revision)
    }

    /// Publishes the named ports of the endpoint's pod on its addresses in the ipcache, where
    /// other endpoints' egress rules that name a port find them (the addresses must be
    /// claimed first); returns them.
    pub(crate) fn publish_named_ports(&self, ep: &Endpoint) -> Vec<NamedPort> {
        let ports = labels::named_ports(ep, self.resources.as_deref()).unwrap_or_else(|| {
            self.enforced
                .get(ep.id)
                .map(|e| e.ports)
                .unwrap_or_default()
        });
        if let Some(ipcache) = &self.ipcache {
            for addr in &ep.addresses {
                ipcache.set_named_ports(IpNet::from(addr.ip), Source::Endpoint, &ports);
            }
        }
        ports
    }

    /// Hands the named ports published so far to the policy repository at once, rather than
    /// when its feed gets to the ipcache's announcement: policies resolved from now on see
    /// them.
    pub(crate) fn take_named_ports(&self) {
        if let Some(repo) = &self.policy {
            repo.sync_named_ports();
        }
    }

    /// Takes what the datapath already enforces for a restored endpoint as the starting
    /// point of its first regeneration, so an agent restart rewrites nothing that has not
    /// changed (and never opens what the previous agent closed).
    pub(crate) fn adopt(
        &self,
        id: u16,
        entries: Vec<(PolicyEntry, Verdict)>,
        enforcement: Directions,
    ) {
        self.unknown().remove(&id);
        self.enforced.lock().insert(
            id,
            Enforced {
                entries: Arc::new(entries),
                enforcement,
                identity: 0,
                policy: None,
                ports: Vec::new(),
                overflow: None,
            },
        );
    }

    /// Forgets endpoint `id` (its datapath state is gone).
    pub(crate) fn forget(&self, id: u16) {
        let gone = self.enforced.lock().remove(&id);
        self.unknown().remove(&id);
        if gone.is_some_and(|e| e.overflow.is_some()) {
            self.report();
        }
    }

    fn unknown(&self) -> MutexGuard<'_, HashSet<u16>> {
        self.unknown.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The policy of every endpoint of an agent without a policy repository: no rule, and no
/// direction enforced (the datapath allows what is not enforced), at revision 0.
pub(crate) fn unrestricted() -> Arc<EndpointPolicy> {
    Arc::new(EndpointPolicy {
        revision: 0,
        ingress_enforced: false,
        egress_enforced: false,
        ingress_audit: false,
        egress_audit: false,
        rules: Vec::new(),
        origins: Default::default(),
    })
}

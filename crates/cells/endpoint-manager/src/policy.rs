//! Making the datapath enforce an endpoint's policy, and remembering what it enforces.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_datapath_bpf::{Datapath, PolicyEntry, Verdict, compile_policy};
use cellium_policy_repo::{EndpointPolicy, Subject};

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::labels;
use crate::manager::EndpointManager;
use crate::program::{self, Enforcement};

/// What the datapath enforces for one endpoint, as last written.
#[derive(Debug, Clone, Default)]
pub struct Enforced {
    /// The policy map entries (shared: reading them costs no copy).
    pub entries: Arc<Vec<(PolicyEntry, Verdict)>>,
    /// The directions the endpoint map entry enforces.
    pub enforcement: Enforcement,
    /// The identity the endpoint map entry carries (0 when not known).
    pub identity: u32,
    /// The policy those came from (its revision and peers), once computed.
    pub policy: Option<Arc<EndpointPolicy>>,
}

/// Every endpoint's [`Enforced`] state, kept in memory so that a regeneration writes only
/// the differences (reading the policy map per endpoint would cost a pass over the whole map).
#[derive(Debug, Default)]
pub struct EnforcedTable(Mutex<HashMap<u16, Enforced>>);

impl EnforcedTable {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<u16, Enforced>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What endpoint `id` enforces.
    pub fn get(&self, id: u16) -> Option<Enforced> {
        self.lock().get(&id).cloned()
    }
}

impl EndpointManager {
    /// Resolves the endpoint's policy and makes the datapath enforce it; returns the
    /// revision enforced.
    ///
    /// The order keeps every moment at least as strict as the endpoint's own policy: a
    /// direction that stops being enforced is released first, then the entries change, and
    /// only then does a direction that becomes enforced take effect (its allow entries are
    /// in place by then, so allowed traffic never meets a default deny).
    pub(crate) fn enforce(&self, dp: &Datapath, ep: &Endpoint) -> Result<u64> {
        let ports = labels::named_ports(ep, &self.resources);
        let policy = self.policy.resolve(&Subject {
            identity: ep.identity,
            labels: &ep.labels,
            named_ports: &ports,
        });
        let datapath = |source| Error::Datapath {
            endpoint: ep.describe(),
            source,
        };
        let known = self.enforced.get(ep.id);
        let new = known.is_none();
        let before = known.unwrap_or_default();
        let after = Enforcement {
            ingress: policy.ingress_enforced,
            egress: policy.egress_enforced,
        };
        // A new revision that leaves this endpoint's rules as they were (the usual case: most
        // changes concern a few endpoints) writes nothing; only the revision it enforces moves.
        let unchanged = before
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
                    ..before
                },
            );
            return Ok(revision);
        }
        let entries = compile_policy(ep.id, &policy.rules).map_err(datapath)?;
        // A new endpoint has allowed nothing yet: it is as strict as its policy from its first
        // entry on, so no connection gets into conntrack before that policy applies.
        let during = if new {
            after
        } else {
            Enforcement {
                ingress: before.enforcement.ingress && after.ingress,
                egress: before.enforcement.egress && after.egress,
            }
        };
        program::write_endpoint(dp, ep, during).map_err(datapath)?;
        dp.policy()
            .apply_diff(ep.id, &before.entries, &entries)
            .map_err(datapath)?;
        if during != after {
            program::write_endpoint(dp, ep, after).map_err(datapath)?;
        }
        let revision = policy.revision;
        self.enforced.lock().insert(
            ep.id,
            Enforced {
                entries: Arc::new(entries),
                enforcement: after,
                identity: ep.identity,
                policy: Some(policy),
            },
        );
        Ok(revision)
    }

    /// Takes what the datapath already enforces for a restored endpoint as the starting
    /// point of its first regeneration, so an agent restart rewrites nothing that has not
    /// changed (and never opens what the previous agent closed).
    pub(crate) fn adopt_enforced(
        &self,
        id: u16,
        entries: Vec<(PolicyEntry, Verdict)>,
        enforcement: Enforcement,
    ) {
        self.enforced.lock().insert(
            id,
            Enforced {
                entries: Arc::new(entries),
                enforcement,
                identity: 0,
                policy: None,
            },
        );
    }
}

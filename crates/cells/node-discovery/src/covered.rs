//! Other nodes' pods inside this node's ipBlocks: the node-local identities they take here.
//!
//! A pod whose address a NetworkPolicy ipBlock covers carries that ipBlock's `cidr:` label on
//! its own node (see the endpoint manager's labels), so that the ipBlock selects it as upstream
//! Kubernetes has it. Such a label set is numbered by each node for itself, so a node publishes
//! the pod's cluster identity only (its labels without `cidr:` labels), and every other node
//! derives its own local identity for the address here: the published identity's labels and
//! the `cidr:` labels of this node's ipBlocks covering the address. The datapath takes that
//! identity for the pod's traffic from its ipcache entry: directly in native routing, and out
//! of the tunnel when the entry names the sending node (the VNI carries the cluster identity).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cellium_identity::Identities;
use cellium_labels::Labels;
use cellium_policy_repo::PolicyRepository;

use crate::desired::Remote;

/// The local identities taken for other nodes' covered pods.
#[derive(Debug)]
pub(crate) struct Covered {
    policy: Arc<PolicyRepository>,
    identities: Arc<Identities>,
    /// One reference held per label set in use, with its number.
    held: Mutex<BTreeMap<Labels, u32>>,
}

impl Covered {
    pub(crate) fn new(policy: Arc<PolicyRepository>, identities: Arc<Identities>) -> Covered {
        Covered {
            policy,
            identities,
            held: Mutex::default(),
        }
    }

    /// Gives each pod entry of `claims` whose address an ipBlock covers its local identity
    /// (a pod whose published identity is not known here keeps it: there are no labels to add
    /// to). Returns the identities no longer used, to [`release`](Covered::release) once the
    /// ipcache no longer names them, and how many entries were given one.
    pub(crate) fn apply(&self, claims: &mut Remote) -> (Vec<u32>, usize) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut used: BTreeMap<Labels, u32> = BTreeMap::new();
        let mut covered = 0;
        for prefix in &claims.pods {
            let Some(entry) = claims.entries.get_mut(prefix) else {
                continue;
            };
            let Some(labels) = self.labels_of(prefix.addr(), entry.identity) else {
                continue;
            };
            let id = match used.get(&labels).or_else(|| held.get(&labels)) {
                Some(id) => *id,
                None => match self.identities.allocate(&labels) {
                    Ok(identity) => {
                        // Before the ipcache names it: a policy that does not know an identity
                        // denies it.
                        self.policy.identity_added(&identity);
                        identity.id
                    }
                    Err(e) => {
                        tracing::warn!(%prefix, %labels, error = %e, "no local identity for a remote pod inside an ipBlock; it keeps its cluster identity");
                        continue;
                    }
                },
            };
            used.insert(labels, id);
            entry.identity = id;
            covered += 1;
        }
        let stale = held
            .iter()
            .filter(|(labels, _)| !used.contains_key(*labels))
            .map(|(_, id)| *id)
            .collect();
        *held = used;
        (stale, covered)
    }

    /// Says when the `cidr:` labels of an address may have changed.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.policy.cidr_label_changes()
    }

    /// Gives back what [`apply`](Covered::apply) found unused.
    pub(crate) fn release(&self, stale: Vec<u32>) {
        for id in stale {
            self.identities.release(id);
        }
    }

    /// The labels of a remote pod at `ip` with cluster identity `id` here: its identity's and
    /// the `cidr:` labels covering `ip`; `None` when no ipBlock covers it or `id` is unknown.
    fn labels_of(&self, ip: std::net::IpAddr, id: u32) -> Option<Labels> {
        let cidr = self.policy.cidr_labels_for(ip);
        if cidr.is_empty() {
            return None;
        }
        let mut labels = self.identities.get(id)?.labels.clone();
        for label in cidr {
            labels.insert(label);
        }
        Some(labels)
    }
}

//! Giving endpoints their identity: labels, the numeric identity, the ipcache entries.
//!
//! Each collaborator is optional, for agents built without the cell that provides it:
//! without resources an endpoint's labels are only what the runtime named (its pod's
//! namespace), without identities every endpoint carries [`UNALLOCATED`], without an
//! ipcache its addresses are not published, without a policy repository its labels carry no
//! `cidr:` labels.

use std::net::IpAddr;
use std::sync::Arc;

use cellium_identity::{Identities, Reserved};
use cellium_ipcache::{Ipcache, Source};
use cellium_labels::Labels;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use ipnet::IpNet;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::labels;

/// The identity of every endpoint of an agent without identities (no `identity` cell):
/// `reserved:init` (5), which Cilium gives an endpoint whose security labels are not resolved
/// into an identity; in such an agent they never are. Nothing allocates or releases it.
pub(crate) const UNALLOCATED: Reserved = Reserved::Init;

/// The identity component: derives endpoints' labels, takes and gives back their identities,
/// and claims their addresses in the ipcache.
#[derive(Debug)]
pub(crate) struct Identifier {
    resources: Option<Arc<Resources>>,
    policy: Option<Arc<PolicyRepository>>,
    identities: Option<Arc<Identities>>,
    ipcache: Option<Arc<Ipcache>>,
    /// The `cluster-name` every pod's labels carry.
    cluster: String,
}

impl Identifier {
    pub(crate) fn new(
        resources: Option<Arc<Resources>>,
        policy: Option<Arc<PolicyRepository>>,
        identities: Option<Arc<Identities>>,
        ipcache: Option<Arc<Ipcache>>,
        cluster: String,
    ) -> Identifier {
        Identifier {
            resources,
            policy,
            identities,
            ipcache,
            cluster,
        }
    }

    /// The labels the endpoint's identity derives from now.
    pub(crate) fn labels(&self, ep: &Endpoint) -> Labels {
        labels::of(
            ep,
            self.resources.as_deref(),
            self.policy.as_deref(),
            &self.cluster,
        )
    }

    /// Whether the endpoint's identity is that of `fresh`, its labels now: it has one, of
    /// these labels, and the cluster did not give its number (or its cluster identity's) to
    /// other labels meanwhile (`Identities::retire`).
    pub(crate) fn is_current(&self, ep: &Endpoint, fresh: &Labels) -> bool {
        ep.identity != 0
            && *fresh == ep.labels
            && !self
                .identities
                .as_ref()
                .is_some_and(|i| i.is_retired(ep.identity) || i.is_retired(ep.cluster_identity))
    }

    /// The labels of identity `id` as text (empty when it is unknown; without identities,
    /// only the reserved ones are known).
    pub(crate) fn labels_of(&self, id: u32) -> Vec<String> {
        match &self.identities {
            Some(identities) => identities.get(id).map(|i| i.labels.to_strings()),
            None => Reserved::from_id(id).map(|r| r.labels().to_strings()),
        }
        .unwrap_or_default()
    }

    /// Learns the cluster-wide number of the endpoint's labels (without their `cidr:` labels,
    /// which are numbered on this node) when they changed and the identity mode numbers them
    /// cluster-wide (see `Identities::resolve`), so that [`identify`](Identifier::identify)
    /// can take it.
    pub(crate) async fn resolve(&self, ep: &Endpoint) -> Result<()> {
        let Some(identities) = &self.identities else {
            return Ok(());
        };
        let fresh = self.labels(ep);
        if self.is_current(ep, &fresh) {
            return Ok(());
        }
        identities
            .resolve(&fresh.without_cidr())
            .await
            .map_err(|source| Error::Identity {
                endpoint: ep.describe(),
                source,
            })
    }

    /// Computes the endpoint's labels and, when they changed (or it has no identity yet, or
    /// a number of its was retired), takes the identity of the new labels (and, when they hold `cidr:` labels, that of the
    /// rest: its [`cluster_identity`](Endpoint::cluster_identity)), points its addresses at it
    /// in the ipcache and gives back the old ones. Returns whether anything changed. Without
    /// identities the identity is always [`UNALLOCATED`].
    pub(crate) fn identify(&self, ep: &mut Endpoint) -> Result<bool> {
        let fresh = self.labels(ep);
        if self.is_current(ep, &fresh) {
            return Ok(false);
        }
        let (id, cluster) = match &self.identities {
            Some(identities) => {
                let id = self.take(identities, ep, &fresh)?;
                let cluster = if fresh.has_cidr() {
                    self.take(identities, ep, &fresh.without_cidr())
                        .inspect_err(|_| {
                            identities.release(id);
                        })?
                } else {
                    id
                };
                (id, cluster)
            }
            None => (UNALLOCATED.id(), UNALLOCATED.id()),
        };
        if let Some(ipcache) = &self.ipcache {
            for addr in &ep.addresses {
                if let Err(e) = ipcache.upsert(IpNet::from(addr.ip), id, Source::Endpoint) {
                    // The claim is kept and retried by the ipcache's sync job.
                    tracing::warn!(endpoint = %ep.describe(), error = %e, "ipcache write deferred");
                }
            }
        }
        let old = (ep.identity, ep.cluster_identity);
        (ep.identity, ep.cluster_identity) = (id, cluster);
        if let Some(identities) = &self.identities {
            release_held(identities, old);
        }
        ep.labels = fresh;
        Ok(true)
    }

    /// A reference to the identity of `labels`, for `ep`.
    fn take(&self, identities: &Identities, ep: &Endpoint, labels: &Labels) -> Result<u32> {
        let identity = identities
            .allocate(labels)
            .map_err(|source| Error::Identity {
                endpoint: ep.describe(),
                source,
            })?;
        // Telling the repository now, rather than when its feed gets to the event, lets the
        // policies of other endpoints that select this identity be resolved at once.
        if let Some(policy) = &self.policy {
            policy.identity_added(&identity);
        }
        Ok(identity.id)
    }

    /// Removes the ipcache entries of `owned` (the endpoint's addresses it still holds: an
    /// address another endpoint holds now is that one's entry) and gives back the endpoint's
    /// identity. The caller sets the endpoint's identity to 0 afterwards, so that it is
    /// never given back twice.
    pub(crate) fn unidentify(&self, ep: &Endpoint, owned: &[IpAddr]) {
        if let Some(ipcache) = &self.ipcache {
            for ip in owned {
                // A failed map write is not the endpoint's failure: the claim is gone, and the
                // ipcache's sync job removes the entry.
                if let Err(e) = ipcache.delete(IpNet::from(*ip), Source::Endpoint) {
                    tracing::warn!(endpoint = %ep.describe(), error = %e, "ipcache delete deferred");
                }
            }
        }
        if let Some(identities) = &self.identities {
            release_held(identities, (ep.identity, ep.cluster_identity));
        }
    }

    /// Drops what the previous run held and nobody claimed again: restored identities no
    /// endpoint took back, and ipcache entries nobody claimed (the contracts of
    /// `Identities::release_unclaimed` and `Ipcache::prune_stale`: called once, after every
    /// endpoint is restored).
    pub(crate) async fn release_unclaimed(&self) {
        if let Some(identities) = &self.identities {
            let dropped = identities.release_unclaimed();
            if !dropped.is_empty() {
                tracing::info!(identities = ?dropped, "unclaimed identities released");
            }
        }
        let Some(ipcache) = self.ipcache.clone() else {
            return;
        };
        match tokio::task::spawn_blocking(move || ipcache.prune_stale()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pruning the ipcache failed; its sync job retries")
            }
            Err(e) => tracing::warn!(error = %e, "pruning the ipcache panicked"),
        }
    }

    /// Reads the node's addresses into the ipcache (after the router addresses were added).
    pub(crate) async fn sync_host_addresses(&self) {
        let Some(ipcache) = &self.ipcache else {
            return;
        };
        if let Err(e) = ipcache.sync_host_addresses().await {
            tracing::warn!(error = %e, "reading the node's addresses failed; the ipcache job retries");
        }
    }
}

/// Gives back the references an endpoint holds with `(identity, cluster_identity)`: one to its
/// identity (none while it is 0), and one to its cluster identity when that is another.
fn release_held(identities: &Identities, (identity, cluster): (u32, u32)) {
    if identity == 0 {
        return;
    }
    identities.release(identity);
    if cluster != 0 && cluster != identity {
        identities.release(cluster);
    }
}

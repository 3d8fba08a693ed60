//! Giving endpoints their identity: labels, the numeric identity, the ipcache entries.

use std::net::IpAddr;
use std::sync::Arc;

use cellium_identity::Identities;
use cellium_ipcache::{Ipcache, Source};
use cellium_labels::Labels;
use cellium_policy_repo::PolicyRepository;
use cellium_resources::Resources;
use ipnet::IpNet;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::labels;

/// The identity component: derives endpoints' labels, takes and gives back their identities,
/// and claims their addresses in the ipcache.
#[derive(Debug)]
pub(crate) struct Identifier {
    resources: Arc<Resources>,
    policy: Arc<PolicyRepository>,
    identities: Arc<Identities>,
    ipcache: Arc<Ipcache>,
}

impl Identifier {
    pub(crate) fn new(
        resources: Arc<Resources>,
        policy: Arc<PolicyRepository>,
        identities: Arc<Identities>,
        ipcache: Arc<Ipcache>,
    ) -> Identifier {
        Identifier {
            resources,
            policy,
            identities,
            ipcache,
        }
    }

    /// The labels the endpoint's identity derives from now.
    pub(crate) fn labels(&self, ep: &Endpoint) -> Labels {
        labels::of(ep, &self.resources, &self.policy)
    }

    /// The labels of identity `id` as text (empty when it is unknown).
    pub(crate) fn labels_of(&self, id: u32) -> Vec<String> {
        self.identities
            .get(id)
            .map(|i| i.labels.to_strings())
            .unwrap_or_default()
    }

    /// Computes the endpoint's labels and, when they changed (or it has no identity yet),
    /// takes the identity of the new labels, points its addresses at it in the ipcache and
    /// gives back the old one. Returns whether anything changed.
    pub(crate) fn identify(&self, ep: &mut Endpoint) -> Result<bool> {
        let fresh = self.labels(ep);
        if ep.identity != 0 && fresh == ep.labels {
            return Ok(false);
        }
        let identity = self
            .identities
            .allocate(&fresh)
            .map_err(|source| Error::Identity {
                endpoint: ep.describe(),
                source,
            })?;
        // Telling the repository now, rather than when its feed gets to the event, lets the
        // policies of other endpoints that select this identity be resolved at once.
        self.policy.identity_added(&identity);
        for addr in &ep.addresses {
            if let Err(e) = self
                .ipcache
                .upsert(IpNet::from(addr.ip), identity.id, Source::Endpoint)
            {
                // The claim is kept and retried by the ipcache's sync job.
                tracing::warn!(endpoint = %ep.describe(), error = %e, "ipcache write deferred");
            }
        }
        let old = std::mem::replace(&mut ep.identity, identity.id);
        if old != 0 && old != identity.id {
            self.identities.release(old);
        }
        ep.labels = fresh;
        Ok(true)
    }

    /// Removes the ipcache entries of `owned` (the endpoint's addresses it still holds: an
    /// address another endpoint holds now is that one's entry) and gives back the endpoint's
    /// identity. The caller sets the endpoint's identity to 0 afterwards, so that it is
    /// never given back twice.
    pub(crate) fn unidentify(&self, ep: &Endpoint, owned: &[IpAddr]) {
        for ip in owned {
            // A failed map write is not the endpoint's failure: the claim is gone, and the
            // ipcache's sync job removes the entry.
            if let Err(e) = self.ipcache.delete(IpNet::from(*ip), Source::Endpoint) {
                tracing::warn!(endpoint = %ep.describe(), error = %e, "ipcache delete deferred");
            }
        }
        if ep.identity != 0 {
            self.identities.release(ep.identity);
        }
    }

    /// Drops what the previous run held and nobody claimed again: restored identities no
    /// endpoint took back, and ipcache entries nobody claimed (the contracts of
    /// `Identities::release_unclaimed` and `Ipcache::prune_stale`: called once, after every
    /// endpoint is restored).
    pub(crate) async fn release_unclaimed(&self) {
        let dropped = self.identities.release_unclaimed();
        if !dropped.is_empty() {
            tracing::info!(identities = ?dropped, "unclaimed identities released");
        }
        let ipcache = self.ipcache.clone();
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
        if let Err(e) = self.ipcache.sync_host_addresses().await {
            tracing::warn!(error = %e, "reading the node's addresses failed; the ipcache job retries");
        }
    }
}

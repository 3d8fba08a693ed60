//! Giving an endpoint its identity: labels, the numeric identity, the ipcache entries.

use cellium_ipcache::Source;
use ipnet::IpNet;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::labels;
use crate::manager::EndpointManager;

impl EndpointManager {
    /// Computes the endpoint's labels and, when they changed (or it has no identity yet),
    /// takes the identity of the new labels, points its addresses at it in the ipcache and
    /// gives back the old one. Returns whether anything changed.
    pub(crate) fn identify(&self, ep: &mut Endpoint) -> Result<bool> {
        let fresh = labels::of(ep, &self.resources, &self.policy);
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

    /// Removes the endpoint's ipcache entries and gives back its identity.
    pub(crate) fn unidentify(&self, ep: &Endpoint) {
        for addr in &ep.addresses {
            if let Err(e) = self.ipcache.delete(IpNet::from(addr.ip), Source::Endpoint) {
                tracing::warn!(endpoint = %ep.describe(), error = %e, "ipcache delete failed");
            }
        }
        if ep.identity != 0 {
            self.identities.release(ep.identity);
        }
    }
}

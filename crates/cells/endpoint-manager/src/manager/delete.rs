//! Deleting, checking and collecting endpoints: what the runtime's DEL, CHECK and GC ask.

use std::collections::HashSet;

use super::create::network;
use super::{Backends, EndpointManager};
use crate::endpoint::{Endpoint, State};
use crate::error::{Error, Result};
use crate::plumbing;

impl EndpointManager {
    /// Deletes the endpoint of (`container_id`, `ifname`); returns whether it existed.
    /// Deleting what is gone succeeds, and a veth pair left without a record is removed too.
    pub async fn delete(&self, container_id: &str, ifname: &str) -> Result<bool> {
        let backends = self.backends()?.clone();
        let _serial = self
            .endpoints
            .lock((container_id.to_string(), ifname.to_string()))
            .await;
        let Some(ep) = self.endpoints.find(container_id, ifname) else {
            let host = plumbing::host_ifname(container_id, ifname);
            backends
                .interfaces
                .teardown_pod(&host)
                .await
                .map_err(|source| Error::Plumbing {
                    endpoint: format!("of container {container_id}"),
                    source,
                })?;
            return Ok(false);
        };
        self.remove(&backends, &ep).await?;
        tracing::info!(endpoint = %ep.describe(), "endpoint deleted");
        Ok(true)
    }

    /// Takes the endpoint down (see [`EndpointManager::teardown`]).
    pub(super) async fn remove(&self, b: &Backends, ep: &Endpoint) -> Result<()> {
        self.teardown(b, ep).await
    }

    /// Checks that the endpoint's interfaces and datapath are as created.
    pub async fn check(&self, container_id: &str, ifname: &str) -> Result<Endpoint> {
        let b = self.backends()?.clone();
        let ep = self.find(container_id, ifname).ok_or_else(|| {
            Error::NotFound(format!("for container {container_id} interface {ifname}"))
        })?;
        let drift = |what: String| Error::Plumbing {
            endpoint: ep.describe(),
            source: plumbing::Error::Drift(what),
        };
        if ep.state != State::Ready {
            return Err(drift(format!("it is not ready but {:?}", ep.state)));
        }
        b.interfaces
            .check_pod(&ep.netns, &network(&ep))
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: ep.describe(),
                source,
            })?;
        for addr in ep.addresses.iter().filter(|a| a.ip.is_ipv4()) {
            let entry = b
                .datapath
                .endpoint_entry(addr.ip)
                .map_err(|source| Error::Datapath {
                    endpoint: ep.describe(),
                    source,
                })?;
            if entry.is_none_or(|e| e.id != ep.id) {
                return Err(drift(format!("the datapath has no entry for {}", addr.ip)));
            }
        }
        Ok(ep)
    }

    /// Deletes the endpoints of `network` whose (container id, interface) is not in `valid`.
    pub async fn gc(&self, network: &str, valid: &HashSet<(String, String)>) -> Result<Vec<u16>> {
        let stale: Vec<Endpoint> = self
            .list()
            .into_iter()
            .filter(|ep| ep.network == network && !valid.contains(&ep.key()))
            .collect();
        let mut removed = Vec::new();
        for ep in stale {
            if self.delete(&ep.container_id, &ep.ifname).await? {
                removed.push(ep.id);
            }
        }
        Ok(removed)
    }
}

//! Deleting, checking and collecting endpoints: what the runtime's DEL, CHECK and GC ask.

use std::collections::HashSet;

use super::create::network;
use super::{Backends, EndpointManager};
use crate::endpoint::{Endpoint, State};
use crate::error::{Error, Result, chain};
use crate::plumbing::{self, PodNetns};

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
        self.policy_maps.trigger();
        tracing::info!(endpoint = %ep.describe(), "endpoint deleted");
        Ok(true)
    }

    /// Records the deletion (state `Deleting`), then takes the endpoint down (see
    /// [`EndpointManager::teardown`]).
    ///
    /// The record comes first: when it cannot be written, the DEL fails with nothing changed
    /// (the endpoint stays ready, with its addresses); once it is written, a teardown that
    /// fails half-way, or a crash, leaves a record that the next DEL or the restore finishes.
    /// It is written even when the record already says `Deleting`: only the file on disk
    /// proves that a crash now would be finished by the restore.
    pub(super) async fn remove(&self, b: &Backends, ep: &Endpoint) -> Result<()> {
        let mut deleting = ep.clone();
        deleting.state = State::Deleting;
        self.store.save(&deleting)?;
        self.endpoints.insert(deleting.clone());
        // Consumers of the endpoint list (service backends) stop using it from now on.
        self.endpoints.changed();
        self.teardown(b, &deleting).await
    }

    /// Checks that the endpoint's interfaces, in the namespace the caller passed, and its
    /// datapath are as created.
    pub async fn check(
        &self,
        container_id: &str,
        ifname: &str,
        netns: &PodNetns,
    ) -> Result<Endpoint> {
        let b = self.backends()?.clone();
        let ep = self.find(container_id, ifname).ok_or_else(|| {
            Error::NotFound(format!("for container {container_id} interface {ifname}"))
        })?;
        let drift = |what: String| Error::Plumbing {
            endpoint: ep.describe(),
            source: plumbing::Error::Drift(what),
        };
        if ep.state != State::Ready {
            return Err(drift(format!(
                "it is {}: a create or delete of it did not finish",
                ep.state.name()
            )));
        }
        if netns.path() != ep.netns {
            return Err(drift(format!(
                "it was set up in {}, not {}",
                ep.netns.display(),
                netns.path().display()
            )));
        }
        b.interfaces
            .check_pod(netns, &network(&ep))
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: ep.describe(),
                source,
            })?;
        for addr in &ep.addresses {
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
    /// Every stale endpoint is tried, whatever happens to the others; the error, if any, lists
    /// each that could not be deleted (they stay recorded, for the next GC or DEL).
    pub async fn gc(&self, network: &str, valid: &HashSet<(String, String)>) -> Result<Vec<u16>> {
        let stale: Vec<Endpoint> = self
            .list()
            .into_iter()
            .filter(|ep| ep.network == network && !valid.contains(&ep.key()))
            .collect();
        let (mut removed, mut failures) = (Vec::new(), Vec::new());
        for ep in stale {
            match self.delete(&ep.container_id, &ep.ifname).await {
                Ok(true) => removed.push(ep.id),
                Ok(false) => {}
                Err(e) => failures.push(chain(&e)),
            }
        }
        if !failures.is_empty() {
            return Err(Error::Gc { removed, failures });
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use cellium_hive::Level;

    use super::*;
    use crate::testing::Harness;

    #[tokio::test]
    async fn a_del_whose_record_cannot_be_written_changes_nothing() {
        let h = Harness::new();
        h.start().await.unwrap();
        let ep = h.manager.create(h.request("a")).await.unwrap();
        h.journal.clear();
        let aside = h.break_records();
        let err = h.manager.delete("a", "eth0").await.unwrap_err();
        assert!(matches!(err, Error::State { .. }), "{err}");
        assert!(h.journal.calls().is_empty(), "{:?}", h.journal.calls());
        assert_eq!(h.manager.find("a", "eth0").unwrap().state, State::Ready);
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (container a)")
        );
        assert_eq!(h.datapath.entries().len(), 1);
        assert_eq!(h.interfaces.links(), vec![ep.host_ifname.clone()]);

        h.heal_records(&aside);
        assert!(h.manager.delete("a", "eth0").await.unwrap());
        assert!(h.manager.list().is_empty());
        assert_eq!(h.owner("10.244.0.2"), None);
    }

    #[tokio::test]
    async fn the_deletion_is_recorded_before_the_kernel_is_touched() {
        let h = Harness::new();
        h.start().await.unwrap();
        let ep = h.manager.create(h.request("a")).await.unwrap();
        h.journal.clear();
        h.observe_records();
        h.manager.delete("a", "eth0").await.unwrap();
        let calls = h.journal.calls();
        assert_eq!(
            calls[0],
            format!("teardown_pod {} [records: 1=deleting]", ep.host_ifname),
            "{calls:?}"
        );
        assert_eq!(calls[1], "unprogram 1 [records: 1=deleting]", "{calls:?}");
        assert_eq!(h.record_state(1), None);
    }

    #[tokio::test]
    async fn an_address_stays_taken_until_a_failed_del_is_finished() {
        let h = Harness::new();
        h.start().await.unwrap();
        let a = h.manager.create(h.request("a")).await.unwrap();
        h.faults.fail("teardown_pod", 1);
        h.manager.delete("a", "eth0").await.unwrap_err();
        assert_eq!(h.manager.find("a", "eth0").unwrap().state, State::Deleting);
        assert_eq!(h.record_state(a.id).as_deref(), Some("deleting"));
        assert_eq!(h.health("removals").unwrap().0, Level::Degraded);

        let b = h.manager.create(h.request("b")).await.unwrap();
        assert_ne!(
            b.addresses[0].ip, a.addresses[0].ip,
            "a's address is still a's"
        );
        assert!(
            h.manager.delete("a", "eth0").await.unwrap(),
            "the retried DEL"
        );
        let b_ip = b.addresses[0].ip;
        assert_eq!(h.datapath.entries()[&b_ip].id, b.id);
        assert!(h.ipcache.lookup(b_ip).is_some(), "b's ipcache entry is b's");
        assert_eq!(h.owner("10.244.0.2"), None);
        assert_eq!(h.health("removals").unwrap().0, Level::Ok);
    }

    #[tokio::test]
    async fn a_del_cut_short_is_finished_by_the_restore() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let a = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        h.faults.fail("unprogram", 1);
        h.manager.delete("a", "eth0").await.unwrap_err();
        assert_eq!(h.record_state(a.id).as_deref(), Some("deleting"));

        h.restart(&["10.244.0.0/24"]);
        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("0 endpoints restored, 1 removed"),
            "{summary}"
        );
        assert_eq!(h.record_state(a.id), None);
        assert!(h.datapath.entries().is_empty() && h.datapath.policy_ids().is_empty());
        assert_eq!(h.owner("10.244.0.2"), None);
        assert!(h.manager.list().is_empty());
    }

    #[tokio::test]
    async fn gc_tries_every_stale_endpoint_and_names_each_it_could_not_delete() {
        let h = Harness::new();
        h.start().await.unwrap();
        for c in ["a", "b", "c"] {
            h.manager.create(h.request(c)).await.unwrap();
        }
        let valid: HashSet<(String, String)> = [("b".to_string(), "eth0".to_string())].into();
        // The first teardown fails; GC goes on with the next stale endpoint.
        h.faults.fail("teardown_pod", 1);
        let err = h.manager.gc("cellium", &valid).await.unwrap_err();
        let Error::Gc { removed, failures } = &err else {
            panic!("{err}");
        };
        assert_eq!((removed.len(), failures.len()), (1, 1), "{err}");
        let left: Vec<String> = h
            .manager
            .list()
            .into_iter()
            .map(|e| e.container_id)
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.contains(&"b".to_string()), "{left:?}");
        // The next GC finishes the job.
        assert_eq!(h.manager.gc("cellium", &valid).await.unwrap().len(), 1);
        assert_eq!(h.manager.list().len(), 1);
    }

    #[tokio::test]
    async fn check_refuses_an_endpoint_that_is_not_ready() {
        let h = Harness::new();
        h.start().await.unwrap();
        h.manager.create(h.request("a")).await.unwrap();
        h.manager
            .check("a", "eth0", &PodNetns::unchecked("/run/netns/a"))
            .await
            .unwrap();
        h.faults.fail("teardown_pod", 1);
        h.manager.delete("a", "eth0").await.unwrap_err();
        let err = h
            .manager
            .check("a", "eth0", &PodNetns::unchecked("/run/netns/a"))
            .await
            .unwrap_err();
        let text = crate::error::chain(&err);
        assert!(text.contains("it is deleting"), "{text}");
    }
}

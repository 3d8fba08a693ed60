//! Taking an endpoint down: the one removal that DEL, a failed create's rollback and the
//! restore all use, and the health of endpoints it could not finish.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;

use cellium_hive::Reporter;

use super::{Backends, EndpointManager};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result, chain};

impl EndpointManager {
    /// Takes the endpoint down. Every step is attempted unless a step it depends on failed,
    /// and every failure (and every step held back) is reported in one [`Error::Teardown`]:
    ///
    /// 1. **interfaces**: the veth pair (the pod end and the node's route to the pod go with
    ///    it).
    /// 2. **datapath**: its endpoint-map entries (those still its own), policy entries and
    ///    programs; and 3. **identity**: its ipcache entries (of the addresses it still holds)
    ///    and its identity. Both only once its interfaces are gone: on a live interface,
    ///    removing its entries and programs would let traffic into the pod without policy,
    ///    and giving its identity back would let the number go to other labels while its
    ///    entries still carry it. They do not depend on each other.
    /// 4. **record**: removed only when every step above succeeded, so that the next attempt
    ///    (a DEL, or the restore) finds the endpoint and finishes the job.
    ///
    /// Its addresses are released, and the endpoint forgotten, only once the record is gone:
    /// an address freed earlier could go to a new pod while this one's entries remain. Each
    /// step is idempotent, so running the teardown again after a partial failure is safe.
    pub(crate) async fn teardown(&self, b: &Backends, ep: &Endpoint) -> Result<()> {
        let mut failures = Vec::new();
        let interfaces_gone = match b.interfaces.teardown_pod(&ep.host_ifname).await {
            Ok(_) => true,
            Err(e) => {
                failures.push(format!("interfaces: {}", chain(&e)));
                false
            }
        };
        if interfaces_gone {
            match b.datapath.unprogram(ep) {
                Ok(()) => self.enforcement.forget(ep.id),
                Err(e) => failures.push(format!("datapath: {}", chain(&e))),
            }
            self.identity.unidentify(ep, &self.owned_addresses(ep));
            // Given back once: a retry must not release the identity of whoever took it next.
            self.endpoints.update(ep, |e| e.identity = 0);
        } else {
            failures.push("datapath and identity: kept while its interfaces exist".into());
        }
        if failures.is_empty() {
            match self.store.remove(ep) {
                Ok(()) => {
                    self.release_addresses(ep);
                    self.endpoints.forget(ep);
                    self.removals.done(ep.id);
                    self.endpoints.changed();
                    return Ok(());
                }
                Err(e) => failures.push(format!("record: {}", chain(&e))),
            }
        }
        let err = Error::Teardown {
            endpoint: ep.describe(),
            failures,
        };
        self.removals.failed(ep.id, chain(&err));
        self.endpoints.changed();
        Err(err)
    }

    /// The endpoint's addresses that IPAM says it still holds: after a restart, or when a
    /// record was restored from a crash, an address may be someone else's by now, and then
    /// its ipcache entry and its allocation are theirs.
    pub(super) fn owned_addresses(&self, ep: &Endpoint) -> Vec<IpAddr> {
        let owner = ep.describe();
        ep.addresses
            .iter()
            .map(|a| a.ip)
            .filter(|ip| self.ipam.owner(*ip).as_deref() == Some(owner.as_str()))
            .collect()
    }

    /// Gives back the addresses the endpoint still holds.
    pub(super) fn release_addresses(&self, ep: &Endpoint) {
        for ip in self.owned_addresses(ep) {
            self.ipam.release(ip);
        }
    }
}

/// Endpoints a teardown could not finish, on the module's health: Degraded, naming each
/// and what is left, until they are removed.
#[derive(Debug)]
pub(crate) struct Removals {
    reporter: Reporter,
    pending: Mutex<BTreeMap<u16, String>>,
}

impl Removals {
    pub(crate) fn new(reporter: Reporter) -> Removals {
        Removals {
            reporter,
            pending: Mutex::default(),
        }
    }

    /// Endpoint `id` is left half-removed, for the reason given.
    pub(crate) fn failed(&self, id: u16, why: String) {
        let mut pending = self.lock();
        pending.insert(id, why);
        self.report(&pending);
    }

    /// Endpoint `id` is gone.
    pub(crate) fn done(&self, id: u16) {
        let mut pending = self.lock();
        if pending.remove(&id).is_some() {
            self.report(&pending);
        }
    }

    fn report(&self, pending: &BTreeMap<u16, String>) {
        if pending.is_empty() {
            self.reporter.ok("every removal finished");
            return;
        }
        let list: Vec<&str> = pending.values().map(String::as_str).collect();
        self.reporter.degraded(format!(
            "{} endpoint(s) not fully removed: {}",
            pending.len(),
            list.join(" | ")
        ));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, String>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use cellium_hive::Level;

    use crate::error::Error;
    use crate::testing::Harness;

    #[tokio::test]
    async fn a_live_interface_keeps_its_datapath_identity_record_and_address() {
        let h = Harness::new();
        h.start().await.unwrap();
        let ep = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        h.journal.clear();
        h.faults.fail("teardown_pod", 1);
        let err = h.manager.delete("a", "eth0").await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Teardown { .. }), "{text}");
        assert!(
            text.contains("interfaces: injected failure of teardown_pod"),
            "{text}"
        );
        assert!(
            text.contains("datapath and identity: kept while its interfaces exist"),
            "{text}"
        );
        assert_eq!(h.journal.only(&["unprogram"]), Vec::<String>::new());
        assert_eq!(h.datapath.entries().len(), 1, "the pod is still enforced");
        assert_eq!(h.references(ep.identity), 1, "its identity is still held");
        assert!(h.record_state(ep.id).is_some());
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (default/a)")
        );

        assert!(
            h.manager.delete("a", "eth0").await.unwrap(),
            "a retry finishes"
        );
        assert!(h.datapath.entries().is_empty() && h.datapath.attachments().is_empty());
        assert_eq!(h.references(ep.identity), 0);
        assert_eq!(h.record_state(ep.id), None);
        assert_eq!(h.owner("10.244.0.2"), None);
    }

    #[tokio::test]
    async fn every_step_is_attempted_and_an_identity_is_given_back_once() {
        let h = Harness::new();
        h.start().await.unwrap();
        let a = h
            .manager
            .create(h.pod_request("a", "a", "web"))
            .await
            .unwrap();
        let b = h
            .manager
            .create(h.pod_request("b", "b", "web"))
            .await
            .unwrap();
        assert_eq!(a.identity, b.identity, "same labels, one identity");
        assert_eq!(h.references(a.identity), 2);
        h.faults.fail("unprogram", 1);
        let err = h.manager.delete("a", "eth0").await.unwrap_err().to_string();
        assert!(
            err.contains("datapath: invalid unprogram: injected failure"),
            "{err}"
        );
        assert!(!err.contains("interfaces"), "{err}");
        assert_eq!(
            h.references(a.identity),
            1,
            "the identity step ran all the same"
        );
        assert!(
            h.record_state(a.id).is_some(),
            "the record waits for the datapath"
        );
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (default/a)")
        );
        assert!(
            h.health("removals")
                .unwrap()
                .1
                .contains("endpoint 1 (default/a)")
        );

        assert!(h.manager.delete("a", "eth0").await.unwrap());
        assert_eq!(
            h.references(a.identity),
            1,
            "b's reference is intact: the retry did not give the identity back again"
        );
        assert_eq!(h.owner("10.244.0.2"), None);
        assert_eq!(h.health("removals").unwrap().0, Level::Ok);
    }

    #[tokio::test]
    async fn the_address_is_released_only_once_the_record_is_gone() {
        let h = Harness::new();
        h.start().await.unwrap();
        let ep = h.manager.create(h.request("a")).await.unwrap();
        let aside = h.break_records();
        let err = h
            .manager
            .teardown(&h.backends(), &ep)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("record: "), "{err}");
        assert!(h.interfaces.links().is_empty(), "the kernel steps ran");
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (container a)"),
            "no new pod can get the address while the record says it is taken"
        );
        assert!(h.manager.find("a", "eth0").is_some());
        h.heal_records(&aside);
        assert!(h.manager.delete("a", "eth0").await.unwrap());
        assert_eq!(h.record_state(ep.id), None);
        assert_eq!(h.owner("10.244.0.2"), None);
        assert!(h.manager.list().is_empty());
    }
}

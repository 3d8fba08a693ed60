//! Creating an endpoint, all or nothing.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use cellium_labels::Labels;

use super::{Backends, EndpointManager};
use crate::endpoint::{Address, Endpoint, State};
use crate::error::{Error, Result, chain};
use crate::plumbing::{self, PodNetns, PodNetwork};
use crate::request::CreateRequest;

/// How long an ADD waits, in Kubernetes mode, for the pod it names to be known (from the
/// watch, or read from the API server): long enough for a slow API server, short enough that
/// the runtime's own timeout (minutes) is not reached and its retry comes soon.
const POD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl EndpointManager {
    /// Creates the endpoint of (`container_id`, `ifname`), or returns the existing one when
    /// the request repeats the one that made it. Returns once the datapath enforces it.
    ///
    /// All or nothing: the record is written (state `Creating`) before the kernel is touched,
    /// and any failure after that is rolled back by the same teardown a DEL uses. If the
    /// rollback itself fails, the endpoint stays recorded and a DEL (which the runtime sends
    /// after a failed ADD) or the next restart finishes it.
    pub async fn create(&self, req: CreateRequest) -> Result<Endpoint> {
        req.validate()?;
        self.learn_pod(&req).await?;
        let backends = self.backends()?.clone();
        let _serial = self
            .endpoints
            .lock((req.container_id.clone(), req.ifname.clone()))
            .await;
        if let Some(ep) = self.endpoints.find(&req.container_id, &req.ifname) {
            if ep.state == State::Ready {
                return self.existing(&req, &ep);
            }
            // What a failed create or delete of this attachment left: finish removing it, so
            // that this create starts from nothing.
            self.remove(&backends, &ep).await?;
        }
        let mtu = req.mtu.unwrap_or_else(|| {
            let overhead = backends.datapath.encap_overhead();
            self.cfg.mtu.saturating_sub(overhead)
        });
        let mut ep = self.endpoints.reserve(|id| record(id, &req, mtu))?;
        if let Err(e) = self.allocate(&mut ep, &req.requested_ips) {
            self.endpoints.forget(&ep);
            return Err(e);
        }
        if let Err(e) = self.store.save(&ep) {
            self.release_addresses(&ep);
            self.endpoints.forget(&ep);
            return Err(e);
        }
        match self.build(&backends, &req.netns, &mut ep).await {
            Ok(()) => {
                tracing::info!(endpoint = %ep.describe(), ips = ?ep.addresses.iter().map(|a| a.ip).collect::<Vec<_>>(), "endpoint ready");
                self.endpoints.changed();
                self.policy_maps.trigger();
                Ok(ep)
            }
            Err(e) => {
                tracing::warn!(endpoint = %ep.describe(), error = %chain(&e), "create failed, rolling back");
                if let Err(left) = self.teardown(&backends, &ep).await {
                    tracing::error!(error = %chain(&left), "rolling back a failed create");
                }
                Err(e)
            }
        }
    }

    /// In Kubernetes mode, makes sure the tables hold the pod the request names before anything
    /// is allocated: an endpoint must not start without the labels its policy selects by.
    /// (Standalone, a pod nobody applied has only its namespace, as before.)
    async fn learn_pod(&self, req: &CreateRequest) -> Result<()> {
        if let (Some(pod), Some(resources)) = (&req.pod, &self.resources) {
            resources
                .pod_for_add(&pod.namespace, &pod.name, POD_WAIT)
                .await
                .map_err(Error::PodUnknown)?;
        }
        Ok(())
    }

    /// The answer to an ADD for an attachment that has a ready endpoint.
    fn existing(&self, req: &CreateRequest, ep: &Endpoint) -> Result<Endpoint> {
        // A retry of the ADD that made it (the runtime timed out, say) gets the endpoint
        // again. Anything else must not: answering a request for another namespace with
        // this endpoint would tell the runtime that a pod has networking which has none.
        if is_retry_of(req, ep) {
            return Ok(ep.clone());
        }
        Err(Error::AttachmentExists {
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            id: ep.id,
            netns: ep.netns.clone(),
            addresses: ips_text(ep.addresses.iter().map(|a| a.ip)),
            requested: format!(
                "{} with {}",
                req.netns.path().display(),
                if req.requested_ips.is_empty() {
                    "any address".to_string()
                } else {
                    ips_text(req.requested_ips.iter().copied())
                }
            ),
        })
    }

    /// The requested addresses, or one of each configured family: all or none (IPAM refuses a
    /// request naming an address twice, and a refusal allocates nothing and quarantines
    /// nothing).
    fn allocate(&self, ep: &mut Endpoint, requested: &[IpAddr]) -> Result<()> {
        let owner = ep.describe();
        let allocated = self
            .ipam
            .allocate_many(requested, &owner)
            .map_err(|source| Error::Ipam {
                owner: owner.clone(),
                source,
            })?;
        ep.addresses.extend(allocated.into_iter().map(|a| Address {
            ip: a.ip,
            pool: a.cidr,
            gateway: a.router,
        }));
        if ep.addresses.is_empty() {
            return Err(Error::Ipam {
                owner,
                source: cellium_ipam::Error::NoPool { family: 4 },
            });
        }
        Ok(())
    }

    /// Interfaces (in `netns`, the namespace the caller passed), identity, policy, programs;
    /// then the record says `Ready`. The programs are attached last: by the first packet, the
    /// endpoint's policy is in place.
    async fn build(&self, b: &Backends, netns: &PodNetns, ep: &mut Endpoint) -> Result<()> {
        let iface = b
            .interfaces
            .setup_pod(netns, &network(ep))
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: ep.describe(),
                source,
            })?;
        ep.host_ifindex = iface.host.index;
        ep.host_mac = iface.host.mac;
        ep.pod_mac = iface.pod.mac;
        self.identity.resolve(ep).await?;
        self.identity.identify(ep)?;
        // In the table with its identity from here on: a rollback from a later step gives
        // that identity back, and must find the endpoint's current state there.
        self.endpoints.insert(ep.clone());
        self.enforcement.enforce(&*b.datapath, ep)?;
        b.datapath
            .attach(ep.host_ifindex)
            .map_err(|source| Error::Datapath {
                endpoint: ep.describe(),
                source,
            })?;
        let mut ready = ep.clone();
        ready.state = State::Ready;
        self.store.save(&ready)?;
        *ep = ready;
        self.endpoints.insert(ep.clone());
        Ok(())
    }
}

/// A new record with an id, in state `Creating`, without addresses yet.
fn record(id: u16, req: &CreateRequest, mtu: u32) -> Endpoint {
    Endpoint {
        id,
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        netns: req.netns.path().to_path_buf(),
        network: req.network.clone(),
        pod: req.pod.clone(),
        addresses: Vec::new(),
        host_ifname: plumbing::host_ifname(&req.container_id, &req.ifname),
        host_ifindex: 0,
        host_mac: [0; 6],
        pod_mac: [0; 6],
        mtu,
        labels: Labels::new(),
        identity: 0,
        cluster_identity: 0,
        port_mappings: req.port_mappings.clone(),
        state: State::Creating,
        created_unix_ms: now_ms(),
    }
}

/// Whether `req` asks for what `ep` already is: the same network namespace, addresses it
/// holds (or none in particular), the same published ports (an answer that they are published
/// when they are not would be a lie too).
fn is_retry_of(req: &CreateRequest, ep: &Endpoint) -> bool {
    req.netns.path() == ep.netns
        && req.port_mappings == ep.port_mappings
        && req
            .requested_ips
            .iter()
            .all(|ip| ep.addresses.iter().any(|a| a.ip == *ip))
}

fn ips_text(ips: impl Iterator<Item = IpAddr>) -> String {
    ips.map(|ip| ip.to_string()).collect::<Vec<_>>().join(", ")
}

/// What the endpoint's interface must look like.
pub(crate) fn network(ep: &Endpoint) -> PodNetwork {
    PodNetwork {
        host_ifname: ep.host_ifname.clone(),
        ifname: ep.ifname.clone(),
        mtu: ep.mtu,
        addresses: ep.addresses.iter().map(|a| (a.ip, a.gateway)).collect(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Harness, endpoint};

    #[tokio::test]
    async fn the_record_comes_before_the_kernel_and_the_programs_last() {
        let h = Harness::new();
        h.start().await.unwrap();
        h.observe_records();
        let ep = h.manager.create(h.request("a")).await.unwrap();
        assert_eq!(ep.state, State::Ready);
        let host = plumbing::host_ifname("a", "eth0");
        assert_eq!(
            h.journal
                .only(&["setup_pod", "write_endpoint", "apply_policy", "attach "]),
            [
                &format!("setup_pod {host} [records: 1=creating]"),
                "write_endpoint 1 ingress=false egress=false [records: 1=creating]",
                "apply_policy 1 (0 entries) [records: 1=creating]",
                "attach 1 [records: 1=creating]",
            ]
        );
        assert_eq!(h.record_state(1).as_deref(), Some("ready"));
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (container a)")
        );
    }

    #[tokio::test]
    async fn a_failed_create_is_rolled_back_completely() {
        let h = Harness::new();
        h.start().await.unwrap();
        let req = h.pod_request("a", "web", "web");
        h.faults.fail("attach", 1);
        let err = h.manager.create(req).await.unwrap_err();
        assert!(matches!(err, Error::Datapath { .. }), "{err}");
        let calls = h
            .journal
            .only(&["setup_pod", "attach ", "teardown_pod", "unprogram"]);
        assert_eq!(calls.len(), 4, "{calls:?}");
        assert!(calls[2].starts_with("teardown_pod") && calls[3].starts_with("unprogram"));
        assert!(h.manager.list().is_empty());
        assert_eq!(h.record_state(1), None);
        assert_eq!(h.owner("10.244.0.2"), None, "the address is free again");
        assert!(h.interfaces.links().is_empty());
        assert!(h.datapath.entries().is_empty() && h.datapath.policy_ids().is_empty());
        assert!(
            h.identities.list().iter().all(|i| i.references == 0),
            "the identity was given back"
        );
    }

    #[tokio::test]
    async fn a_rollback_that_fails_leaves_the_endpoint_recorded_for_a_del() {
        let h = Harness::new();
        h.start().await.unwrap();
        h.faults.fail("attach", 1);
        h.faults.fail("teardown_pod", 1);
        h.manager.create(h.request("a")).await.unwrap_err();
        let left = h.manager.find("a", "eth0").expect("kept for a retry");
        assert_eq!(left.state, State::Creating);
        assert_eq!(h.record_state(1).as_deref(), Some("creating"));
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (container a)")
        );
        let (level, message) = h.health("removals").unwrap();
        assert_eq!(level, cellium_hive::Level::Degraded);
        assert!(
            message.contains("endpoint 1 (container a) is not fully removed"),
            "{message}"
        );
        assert!(
            message.contains("interfaces: injected failure of teardown_pod"),
            "{message}"
        );

        assert!(h.manager.delete("a", "eth0").await.unwrap());
        assert_eq!(h.record_state(1), None);
        assert_eq!(h.owner("10.244.0.2"), None);
        assert!(h.interfaces.links().is_empty() && h.datapath.entries().is_empty());
        assert_eq!(h.health("removals").unwrap().0, cellium_hive::Level::Ok);
    }

    #[tokio::test]
    async fn an_add_after_a_failed_rollback_starts_from_nothing() {
        let h = Harness::new();
        h.start().await.unwrap();
        h.faults.fail("attach", 1);
        h.faults.fail("teardown_pod", 1);
        h.manager.create(h.request("a")).await.unwrap_err();
        let ep = h.manager.create(h.request("a")).await.unwrap();
        assert_eq!(ep.state, State::Ready);
        assert_eq!(ep.id, 2, "a new endpoint, not the half-removed one");
        assert_eq!(h.record_state(1), None);
        assert_eq!(h.manager.list().len(), 1);
    }

    #[tokio::test]
    async fn a_record_that_cannot_be_written_fails_the_create_before_the_kernel() {
        let h = Harness::new();
        h.start().await.unwrap();
        h.journal.clear();
        let aside = h.break_records();
        let err = h.manager.create(h.request("a")).await.unwrap_err();
        assert!(matches!(err, Error::State { .. }), "{err}");
        assert!(h.journal.calls().is_empty(), "{:?}", h.journal.calls());
        assert!(h.manager.list().is_empty());
        assert_eq!(h.owner("10.244.0.2"), None);
        h.heal_records(&aside);
        h.manager.create(h.request("a")).await.unwrap();
    }

    fn request(netns: &str, ips: &[&str]) -> CreateRequest {
        CreateRequest {
            container_id: "c1".into(),
            netns: PodNetns::unchecked(netns),
            ifname: "eth0".into(),
            pod: None,
            requested_ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            network: "cellium".into(),
            mtu: None,
            port_mappings: vec![],
        }
    }

    #[test]
    fn only_a_request_for_what_the_endpoint_is_counts_as_a_retry() {
        let ep = endpoint(7, "c1");
        assert!(is_retry_of(&request("/run/netns/c1", &[]), &ep));
        assert!(is_retry_of(&request("/run/netns/c1", &["10.244.0.7"]), &ep));
        assert!(!is_retry_of(&request("/run/netns/b", &[]), &ep));
        assert!(!is_retry_of(
            &request("/run/netns/c1", &["10.244.0.6"]),
            &ep
        ));
    }
}

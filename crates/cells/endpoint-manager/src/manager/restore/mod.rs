//! Bringing endpoints back at start, and removing what a crash left behind.
//!
//! In three phases: `plan` reads the records and decides (changing nothing but IPAM
//! reservations), the node is set up, then the plan is carried out and leftovers swept.

mod plan;
mod sweep;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellium_datapath_bpf::{DatapathConfig, PolicyEntry, Verdict};
use cellium_hive::BoxError;
use cellium_loader::Loader;

use super::{Backends, EndpointManager};
use crate::datapath::EndpointDatapath;
use crate::endpoint::{Endpoint, State};
use crate::error::{Error, Result, chain};
use crate::plumbing::{self, Netlink};

impl EndpointManager {
    /// The start hook: restores the endpoints with the node's netlink connection and the
    /// loaded datapath, setting the node up (forwarding, the router addresses) once the plan
    /// is made; from then on the manager serves requests.
    pub(super) async fn start(&self, loader: &Loader) -> Result<(), BoxError> {
        let node_error = |source| Error::Plumbing {
            endpoint: "the node (its set-up)".into(),
            source,
        };
        let node = Netlink::node().map_err(node_error)?;
        let datapath = loader.datapath()?;
        // A node with pods of both families splits the world by family, as Cilium's
        // dual-stack mode does: addresses outside the ipcache are world-ipv4 or world-ipv6.
        let families = self.ipam.families();
        let dual_stack = families.contains(&4) && families.contains(&6);
        datapath
            .config()
            .set_flag(DatapathConfig::WORLD_PER_FAMILY, dual_stack)?;
        // Each endpoint's policy map holds its limit: one fits whatever is not locked down.
        datapath
            .policy()
            .set_endpoint_max(u32::try_from(self.cfg.bpf_policy_map_max).unwrap_or(u32::MAX));
        let backends = Backends {
            interfaces: Arc::new(node.clone()),
            datapath,
        };
        let routers: Vec<_> = self.ipam.routers().into_iter().map(|(ip, _)| ip).collect();
        let setup = async move {
            plumbing::setup_host(&node, &routers)
                .await
                .map_err(node_error)
        };
        let summary = self.restore(backends, setup).await?;
        self.reporter.ok(summary);
        Ok(())
    }

    /// Restores every finished endpoint whose pod still exists and removes the rest, then
    /// removes interfaces, datapath entries and program attachments that no endpoint owns.
    /// `setup_node` runs once the plan is made, before anything else changes. Returns a
    /// one-line summary.
    pub(crate) async fn restore(
        &self,
        b: Backends,
        setup_node: impl Future<Output = Result<()>>,
    ) -> Result<String> {
        let mut took = Phases::default();
        let mut plan = self.plan(&b).await?;
        took.mark("plan");
        setup_node.await?;
        // The router addresses just added are the node's: classified as host from now on.
        self.identity.sync_host_addresses().await;
        let _ = self.backends.set(b.clone());
        took.mark("node");

        let mut previous = enforced_entries(&*b.datapath);
        let restored = plan.restore.len();
        // Every endpoint is identified before any is enforced: an egress rule that names a
        // port resolves against the ports the peers' pods publish on their addresses, and an
        // endpoint enforced before its peers were back would close, until they were, what
        // the previous agent's entries allow.
        let identified: Vec<Arc<Endpoint>> = std::mem::take(&mut plan.restore)
            .into_iter()
            .filter_map(|ep| {
                let entries = previous.remove(&ep.id).unwrap_or_default();
                let moved = plan.moved.contains(&ep.id);
                self.identify_restored(&b, ep, entries, moved)
            })
            .collect();
        self.enforcement.take_named_ports();
        took.mark("identify");
        // Every endpoint's policy is in force before any gets this agent's programs: a new
        // program delivers to a peer by the peer's policy map, which an upgrade may have just
        // recreated (another layout), and a peer without one drops (`NO_POLICY_MAP`).
        let enforced: Vec<&Arc<Endpoint>> = identified
            .iter()
            .filter(|ep| self.enforce_restored(&b, ep))
            .collect();
        took.mark("enforce");
        for ep in enforced {
            self.settle_restored(&b, ep);
        }
        took.mark("attach");
        let mut removed = 0;
        for (mut ep, why) in std::mem::take(&mut plan.remove) {
            tracing::info!(endpoint = %ep.describe(), why, "endpoint not restored, removing it");
            if self.endpoints.get(ep.id).is_none() {
                // Never claimed in this run: nothing to give back.
                ep.identity = 0;
            }
            // Known to the table whatever happens next: the sweep keeps what is its own, and
            // a DEL finds it.
            self.endpoints.insert(ep.clone());
            match self.remove(&b, &ep).await {
                Ok(()) => removed += 1,
                // Its deletion could not be recorded, so nothing was touched: it waits, out
                // of regeneration, for a DEL or the next restart.
                Err(e @ Error::State { .. }) => {
                    self.endpoints.update(&ep, |e| e.state = State::Deleting);
                    self.removals.failed(
                        ep.id,
                        format!(
                            "{}: cannot record its removal ({why}): {}",
                            ep.describe(),
                            chain(&e)
                        ),
                    );
                }
                // The teardown reported itself.
                Err(_) => {}
            }
        }
        took.mark("remove");
        let (leftovers, mut problems) = self.leftovers(&b).await;
        let last = match plan.unknown() {
            // What no readable record accounts for may be an unreadable one's: nothing is
            // removed, and its addresses and ids are kept from new pods.
            Some(unknown) => {
                let kept = self.keep(&b, &leftovers, &plan.unreadable).await;
                problems.extend(kept.failures.iter().cloned());
                problems.insert(
                    0,
                    format!(
                        "{unknown}: kept what no readable record accounts for ({}), swept nothing, released no identity or ipcache entry of the previous run; repair or remove what cannot be read and restart the agent",
                        kept.describe()
                    ),
                );
                "sweep skipped: endpoint records cannot be read".to_string()
            }
            None => {
                let swept = self.sweep(&b, &leftovers).await;
                problems.extend(
                    swept
                        .failures
                        .iter()
                        .map(|f| format!("leftover not removed: {f}")),
                );
                self.endpoints.hold_ids(swept.held_ids.iter().copied());
                // Every endpoint has claimed its identity and addresses again: what nobody
                // claimed is the previous run's and goes now.
                self.identity.release_unclaimed().await;
                format!("{} leftovers swept", swept.removed)
            }
        };
        took.mark("sweep");
        // Where a restart's time goes, for whoever wonders why it was slow.
        tracing::info!(restored, removed, took = %took, "endpoints restored");
        let restore = self.reporter.child("restore");
        if problems.is_empty() {
            restore.ok("every record read, every leftover removed");
        } else {
            for p in &problems {
                tracing::error!(problem = %p, "restoring endpoints");
            }
            restore.degraded(problems.join(" | "));
        }
        self.endpoints.changed();
        Ok(format!(
            "{restored} endpoints restored, {removed} removed, {last}"
        ))
    }

    /// The first half of restoring an endpoint whose addresses are reserved again: takes what
    /// the policy map holds for it from the previous run (`previous`) as what it enforces,
    /// gives it its identity, claims its addresses in the ipcache and publishes its pod's
    /// named ports there. Returns it, or `None` when its identity could not be taken (the
    /// `regenerate` job retries it; meanwhile the previous agent's programs and entries keep
    /// enforcing its old policy).
    ///
    /// Its record is written again (by [`EndpointManager::settle_restored`]) only if what it
    /// says changed: the host end (`moved`), the labels or the identity.
    fn identify_restored(
        &self,
        b: &Backends,
        mut ep: Endpoint,
        previous: Vec<(PolicyEntry, Verdict)>,
        moved: bool,
    ) -> Option<Arc<Endpoint>> {
        let recorded = (ep.identity, ep.labels.clone());
        // Claimed again now: the same labels give the same identity as before, since the
        // identity table was restored.
        ep.identity = 0;
        self.enforcement
            .adopt(ep.id, previous, b.datapath.read_enforcement(&ep));
        // Attaching replaces the programs of the old agent's links atomically: traffic is
        // enforced by the old programs until the new ones take over, never by none.
        self.regeneration.needs_attach(ep.id);
        let identified = self.identity.identify(&mut ep);
        if moved || (identified.is_ok() && (ep.identity, &ep.labels) != (recorded.0, &recorded.1)) {
            self.regeneration.needs_save(ep.id);
        }
        self.endpoints.insert(ep.clone());
        if let Err(e) = identified {
            tracing::warn!(endpoint = %ep.describe(), error = %chain(&e), "restored endpoint not identified yet; retrying");
            self.regeneration.trigger.trigger();
            return None;
        }
        self.enforcement.publish_named_ports(&ep);
        Some(Arc::new(ep))
    }

    /// The second half: makes the datapath enforce the identified endpoint's policy; returns
    /// whether it does. It is restored whatever fails here: its pod exists, and the previous
    /// agent's programs and entries keep enforcing its old policy; what failed is retried by
    /// the `regenerate` job until it succeeds, and named on the module's health meanwhile.
    fn enforce_restored(&self, b: &Backends, ep: &Endpoint) -> bool {
        match self.enforcement.enforce(&*b.datapath, ep) {
            Ok(_) => true,
            Err(e) => {
                self.retry_restored(ep, &e);
                false
            }
        }
    }

    /// The third: attaches its programs and writes its record if it changed (as the second,
    /// retried on failure).
    fn settle_restored(&self, b: &Backends, ep: &Endpoint) {
        if let Err(e) = self.settle(b, ep) {
            self.retry_restored(ep, &e);
        }
    }

    fn retry_restored(&self, ep: &Endpoint, e: &Error) {
        tracing::warn!(endpoint = %ep.describe(), error = %chain(e), "restored endpoint not regenerated yet; retrying");
        self.regeneration.trigger.trigger();
    }
}

/// How long each phase of the restore took.
#[derive(Debug)]
struct Phases {
    last: Instant,
    took: Vec<(&'static str, Duration)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: Instant::now(),
            took: Vec::new(),
        }
    }
}

impl Phases {
    /// Ends phase `name` now.
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.took.push((name, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    /// `plan 12.1ms, node 0.3ms, ...`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, d)) in self.took.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{name} {d:.1?}")?;
        }
        Ok(())
    }
}

/// The policy map's entries grouped by endpoint: read once for all restored endpoints.
fn enforced_entries(dp: &dyn EndpointDatapath) -> HashMap<u16, Vec<(PolicyEntry, Verdict)>> {
    let mut by_endpoint: HashMap<u16, Vec<(PolicyEntry, Verdict)>> = HashMap::new();
    for (entry, verdict) in dp.policy_entries().unwrap_or_default() {
        by_endpoint
            .entry(entry.endpoint_id)
            .or_default()
            .push((entry, verdict));
    }
    by_endpoint
}

#[cfg(test)]
mod tests {
    use cellium_hive::Level;
    use cellium_ipcache::Source;

    use super::*;
    use crate::testing::{Harness, endpoint};

    #[tokio::test]
    async fn what_finished_is_restored_and_what_did_not_is_removed() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let a = h.manager.create(h.request("a")).await.unwrap();
        let b = h.manager.create(h.request("b")).await.unwrap();
        h.faults.fail("attach", 1);
        h.faults.fail("teardown_pod", 1);
        h.manager.create(h.request("c")).await.unwrap_err();
        h.interfaces.remove_netns(&b.netns);

        h.restart(&["10.244.0.0/24"]);
        h.journal.clear();
        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("1 endpoints restored, 2 removed"),
            "{summary}"
        );
        let restored = h.manager.find("a", "eth0").expect("a is back");
        assert_eq!((restored.id, restored.state), (a.id, State::Ready));
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (container a)")
        );
        assert!(
            h.journal
                .calls()
                .contains(&format!("attach {}", a.host_ifindex))
        );
        assert_eq!(h.interfaces.links(), vec![a.host_ifname.clone()]);
        assert_eq!((h.record_state(2), h.record_state(3)), (None, None));
        assert_eq!((h.owner("10.244.0.3"), h.owner("10.244.0.4")), (None, None));
        assert_eq!(h.datapath.entries().len(), 1);
    }

    /// Whether endpoint `id`'s policy entries allow egress to `peer` on TCP `port`.
    fn allows_egress(h: &Harness, id: u16, peer: u32, port: u16) -> bool {
        h.datapath.policy().iter().any(|(e, v)| {
            e.endpoint_id == id
                && e.direction == cellium_datapath_bpf::Direction::Egress
                && e.identity == peer
                && e.l4.matches(cellium_datapath_bpf::Protocol::Tcp, port)
                && *v == Verdict::Allow
        })
    }

    #[tokio::test]
    async fn an_egress_rule_naming_a_port_of_an_endpoint_restored_later_stays_open() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        // The client may send only to ports named `http`; the server's pod names 8080 so.
        h.resources
            .apply(
                "test.yaml",
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: out, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: client}}\n  policyTypes: [Egress]\n  egress: [{ports: [{port: http}]}]\n",
            )
            .unwrap();
        h.policy.sync_resources(&h.resources);
        let client = h
            .manager
            .create(h.pod_request("c", "client", "client"))
            .await
            .unwrap();
        let request = h.pod_request("s", "server", "server");
        h.resources
            .apply(
                "test.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: server, namespace: default, labels: {app: server}}\nspec: {containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}\n",
            )
            .unwrap();
        let server = h.manager.create(request).await.unwrap();
        // What the repository's feed does when the ipcache announces new named ports.
        h.policy.sync_named_ports();
        assert!(h.manager.regenerate_all().await.failed.is_empty());
        assert!(allows_egress(&h, client.id, server.identity, 8080));

        // The client's record is read first at the restart.
        assert!(client.id < server.id);
        h.restart(&["10.244.0.0/24"]);
        h.policy.sync_resources(&h.resources);
        let (datapath, server_identity) = (h.datapath.clone(), server.identity);
        h.journal.observe(move || {
            let open = datapath.policy().iter().any(|(e, v)| {
                e.endpoint_id == 1
                    && e.identity == server_identity
                    && e.l4.matches(cellium_datapath_bpf::Protocol::Tcp, 8080)
                    && *v == Verdict::Allow
            });
            format!("open={open}")
        });
        let summary = h.start().await.unwrap();
        assert!(summary.starts_with("2 endpoints restored"), "{summary}");
        assert_eq!(h.manager.get(server.id).unwrap().identity, server.identity);
        let closed: Vec<String> = h
            .journal
            .calls()
            .into_iter()
            .filter(|c| c.contains("open=false"))
            .collect();
        assert!(closed.is_empty(), "closed during the restore: {closed:?}");
        assert!(allows_egress(&h, client.id, server.identity, 8080));
    }

    #[tokio::test]
    async fn unchanged_records_are_not_written_again_and_moved_ones_are() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let a = h.manager.create(h.request("a")).await.unwrap();
        let b = h.manager.create(h.request("b")).await.unwrap();
        h.restart(&["10.244.0.0/24"]);
        // b's host end is found at another index than its record says.
        h.interfaces.add_link(&b.host_ifname, 77);
        let record = |id: u16| std::fs::read(h.dir.path().join(format!("endpoints/{id}.json")));
        let (a_before, b_before) = (record(a.id).unwrap(), record(b.id).unwrap());
        // A record written again would be replaced by a new file.
        let inode = |id: u16| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(h.dir.path().join(format!("endpoints/{id}.json")))
                .unwrap()
                .ino()
        };
        let (a_inode, b_inode) = (inode(a.id), inode(b.id));
        h.start().await.unwrap();
        assert_eq!(record(a.id).unwrap(), a_before);
        assert_eq!(inode(a.id), a_inode, "a's record was written again");
        assert_ne!(inode(b.id), b_inode, "b's record was not written again");
        assert_ne!(record(b.id).unwrap(), b_before);
        assert_eq!(h.manager.get(b.id).unwrap().host_ifindex, 77);
    }

    #[tokio::test]
    async fn removing_a_record_leaves_what_another_endpoint_holds_at_its_address() {
        let h = Harness::new();
        let mut holder = endpoint(6, "holder");
        holder.addresses[0].ip = "10.244.0.5".parse().unwrap();
        let mut stale = endpoint(5, "stale");
        stale.state = State::Creating;
        h.write_record(&holder);
        h.write_record(&stale);
        h.datapath
            .add_leftover("10.244.0.5".parse().unwrap(), 6, holder.host_ifindex);
        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("1 endpoints restored, 1 removed"),
            "{summary}"
        );
        assert_eq!(
            h.owner("10.244.0.5").as_deref(),
            Some("endpoint 6 (container holder)")
        );
        let entry = h.datapath.entries()[&"10.244.0.5".parse().unwrap()];
        assert_eq!(
            entry.id, 6,
            "the stale record's teardown left the holder's entry"
        );
        let (_, identity, source) = h.ipcache.lookup("10.244.0.5".parse().unwrap()).unwrap();
        assert_eq!(
            (identity, source),
            (h.manager.get(6).unwrap().identity, Source::Endpoint),
            "and its ipcache entry"
        );
        assert_eq!(h.interfaces.links(), vec!["lxc6".to_string()]);
    }

    #[tokio::test]
    async fn leftovers_are_swept_and_an_id_whose_entries_remain_is_not_handed_out() {
        let h = Harness::new();
        h.interfaces.add_link("lxcdead", 40);
        h.datapath
            .add_leftover("10.244.0.50".parse().unwrap(), 2, 40);
        h.faults.fail("clear_policy", 1);
        let summary = h.start().await.unwrap();
        assert!(summary.contains("leftovers swept"), "{summary}");
        assert!(h.interfaces.links().is_empty());
        assert!(h.datapath.entries().is_empty() && h.datapath.attachments().is_empty());
        assert_eq!(h.datapath.policy_ids(), [2].into(), "its clear failed");
        let (level, message) = h.health("restore").unwrap();
        assert_eq!(level, Level::Degraded);
        assert!(
            message.contains("leftover not removed: policy map of endpoint id 2: "),
            "{message}"
        );
        let first = h.manager.create(h.request("a")).await.unwrap();
        let second = h.manager.create(h.request("b")).await.unwrap();
        assert_eq!(
            (first.id, second.id),
            (1, 3),
            "id 2 would inherit the entries left"
        );
    }

    #[tokio::test]
    async fn an_unreadable_record_keeps_what_may_be_its_own_and_degrades_the_module() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let a = h.manager.create(h.request("a")).await.unwrap();
        let b = h
            .manager
            .create(h.pod_request("b", "b", "web"))
            .await
            .unwrap();
        let b_ip = b.addresses[0].ip;
        h.restart(&["10.244.0.0/24"]);
        let file = h.dir.path().join("endpoints/2.json");
        std::fs::write(&file, b"{ not json").unwrap();
        // And a host end with a route to a pod, as a create cut short would leave it.
        h.interfaces.add_link("lxcorphan", 50);
        h.interfaces.add_route("10.244.0.60".parse().unwrap(), 50);

        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("1 endpoints restored, 0 removed, sweep skipped"),
            "{summary}"
        );
        assert_eq!(h.manager.find("a", "eth0").unwrap().id, a.id);
        assert!(
            h.interfaces.links().contains(&b.host_ifname),
            "b's pod keeps its link"
        );
        assert!(h.interfaces.links().contains(&"lxcorphan".to_string()));
        assert_eq!(
            h.datapath.entries()[&b_ip].id,
            b.id,
            "and its datapath entry"
        );
        assert!(
            h.datapath.attachments().contains(&b.host_ifindex),
            "and its programs"
        );
        assert_eq!(
            h.owner(&b_ip.to_string()).as_deref(),
            Some("endpoint 2 (record unreadable)")
        );
        assert_eq!(
            h.owner("10.244.0.60").as_deref(),
            Some("endpoint on lxcorphan (record unreadable)")
        );
        let (level, message) = h.health("restore").unwrap();
        assert_eq!(level, Level::Degraded, "{message}");
        assert!(
            message
                .contains("endpoint record endpoints/2.json cannot be read (key must be a string"),
            "{message}"
        );
        assert!(
            message.contains("2 interface(s), 2 address(es)"),
            "{message}"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"{ not json",
            "left for a person"
        );

        let c = h.manager.create(h.request("c")).await.unwrap();
        assert_ne!(c.id, b.id, "b's id is held: c would overwrite b's record");
        assert_ne!(c.addresses[0].ip, b_ip);
    }

    #[tokio::test]
    async fn records_that_cannot_be_listed_restore_nothing_and_remove_nothing() {
        let mut h = Harness::new();
        h.start().await.unwrap();
        let a = h.manager.create(h.request("a")).await.unwrap();
        h.restart(&["10.244.0.0/24"]);
        let _aside = h.break_records();
        let summary = h.start().await.unwrap();
        assert!(
            summary.starts_with("0 endpoints restored, 0 removed, sweep skipped"),
            "{summary}"
        );
        assert_eq!(h.interfaces.links(), vec![a.host_ifname.clone()]);
        assert_eq!(h.datapath.entries().len(), 1);
        assert_eq!(
            h.owner("10.244.0.2").as_deref(),
            Some("endpoint 1 (record unreadable)")
        );
        let (level, message) = h.health("restore").unwrap();
        assert_eq!(level, Level::Degraded);
        assert!(
            message.starts_with("endpoint records cannot be listed ("),
            "{message}"
        );
    }
}

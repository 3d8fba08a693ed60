//! Bringing endpoints back at start, and sweeping what a crash left behind.

use std::collections::{HashMap, HashSet};

use cellium_datapath_bpf::{Datapath, PolicyEntry, Verdict};

use crate::endpoint::{Endpoint, State};
use crate::error::{Error, Result};
use crate::manager::EndpointManager;
use crate::plumbing::{self, Netlink};
use crate::program;

impl EndpointManager {
    /// Restores every finished endpoint whose pod still exists and removes the rest, then
    /// removes interfaces, datapath entries and program attachments that no endpoint owns.
    /// Returns a one-line summary.
    pub(crate) async fn restore(&self) -> Result<String> {
        let node = Netlink::node().map_err(|source| Error::Plumbing {
            endpoint: "(node setup)".into(),
            source,
        })?;
        let routers: Vec<_> = self.ipam.routers().into_iter().map(|(ip, _)| ip).collect();
        plumbing::setup_host(&node, &routers)
            .await
            .map_err(|source| Error::Plumbing {
                endpoint: "(node setup)".into(),
                source,
            })?;
        let _ = self.node.set(node.clone());
        // The router addresses just added are the node's: classified as host from now on.
        if let Err(e) = self.ipcache.sync_host_addresses().await {
            tracing::warn!(error = %e, "reading the node's addresses failed; the ipcache job retries");
        }

        let dp = self.loader.datapath()?;
        let mut enforced = enforced_entries(&dp);
        let (mut restored, mut removed) = (0, 0);
        for ep in self.store.load()? {
            let previous = enforced.remove(&ep.id).unwrap_or_default();
            match self.restore_one(&node, &dp, ep.clone(), previous).await {
                Ok(()) => restored += 1,
                Err(why) => {
                    tracing::info!(endpoint = %ep.describe(), why, "endpoint not restored, removing it");
                    self.table().insert(ep.clone());
                    self.remove(&node, &ep).await;
                    removed += 1;
                }
            }
        }
        let swept = self.sweep(&node).await;
        self.finish_restore().await;
        self.changed();
        Ok(format!(
            "{restored} endpoints restored, {removed} removed, {swept} leftovers swept"
        ))
    }

    /// Every endpoint has claimed its identity and addresses again: what nobody claimed is
    /// the previous run's and goes now (the contract of `Identities::release_unclaimed` and
    /// `Ipcache::prune_stale`).
    async fn finish_restore(&self) {
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

    /// Restores one endpoint, or says why it cannot be. `previous` is what the policy map
    /// holds for it from the previous run.
    async fn restore_one(
        &self,
        node: &Netlink,
        dp: &Datapath,
        mut ep: Endpoint,
        previous: Vec<(PolicyEntry, Verdict)>,
    ) -> Result<(), String> {
        if ep.state == State::Creating {
            return Err("its creation never finished".into());
        }
        // Not the recorded path: it may be one only the runtime can see.
        let host = plumbing::restorable_host_end(node, &ep.host_ifname)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "its interface {} is gone, and with it its network namespace {}",
                    ep.host_ifname,
                    ep.netns.display()
                )
            })?;
        ep.host_ifindex = host.index;
        ep.host_mac = host.mac;
        let owner = ep.describe();
        for addr in &ep.addresses {
            self.ipam
                .allocate(addr.ip, &owner)
                .map_err(|e| format!("its address cannot be reserved again: {e}"))?;
        }
        // The same labels give the same identity as before: the identity table was restored.
        ep.identity = 0;
        self.identify(&mut ep).map_err(|e| e.to_string())?;
        self.table().insert(ep.clone());
        self.adopt_enforced(ep.id, previous, program::read_enforcement(dp, &ep));
        self.enforce(dp, &ep).map_err(|e| e.to_string())?;
        // Attaching replaces the programs of the old agent's links atomically: traffic is
        // enforced by the old programs until the new ones take over, never by none.
        dp.attach(ep.host_ifindex).map_err(|e| e.to_string())?;
        if let Err(e) = self.store.save(&ep) {
            tracing::warn!(endpoint = %owner, error = %e, "rewriting the record failed");
        }
        Ok(())
    }

    /// Removes host veths, endpoint map entries and attachments that no endpoint owns: the
    /// debris of creates or deletes a crash interrupted. Returns how many were removed.
    async fn sweep(&self, node: &Netlink) -> usize {
        let endpoints = self.list();
        let names: HashSet<&str> = endpoints.iter().map(|e| e.host_ifname.as_str()).collect();
        let ids: HashSet<u16> = endpoints.iter().map(|e| e.id).collect();
        let ifindexes: HashSet<u32> = endpoints.iter().map(|e| e.host_ifindex).collect();
        let mut swept = 0;
        match plumbing::host_links(&node.handle).await {
            Ok(links) => {
                for (name, _) in links.iter().filter(|(n, _)| !names.contains(n.as_str())) {
                    if plumbing::teardown_pod(node, name).await.unwrap_or(false) {
                        tracing::info!(interface = %name, "leftover interface removed");
                        swept += 1;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing interfaces for leftovers failed"),
        }
        let Ok(dp) = self.loader.datapath() else {
            return swept;
        };
        for (ip, info) in dp.endpoints().entries().unwrap_or_default() {
            if !ids.contains(&info.id) && dp.endpoints().delete(ip).unwrap_or(false) {
                swept += 1;
            }
        }
        let stale_ids: HashSet<u16> = dp
            .policy()
            .entries()
            .unwrap_or_default()
            .into_iter()
            .map(|(e, _)| e.endpoint_id)
            .filter(|id| !ids.contains(id))
            .collect();
        for id in stale_ids {
            swept += dp.policy().clear_endpoint(id).unwrap_or(0);
        }
        let stale_links: HashSet<u32> = dp
            .attached()
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.ifindex)
            .filter(|i| !ifindexes.contains(i))
            .collect();
        for ifindex in stale_links {
            if dp.detach(ifindex).is_ok() {
                swept += 1;
            }
        }
        swept
    }
}

/// The policy map's entries grouped by endpoint: read once for all restored endpoints.
fn enforced_entries(dp: &Datapath) -> HashMap<u16, Vec<(PolicyEntry, Verdict)>> {
    let mut by_endpoint: HashMap<u16, Vec<(PolicyEntry, Verdict)>> = HashMap::new();
    for (entry, verdict) in dp.policy().entries().unwrap_or_default() {
        by_endpoint
            .entry(entry.endpoint_id)
            .or_default()
            .push((entry, verdict));
    }
    by_endpoint
}

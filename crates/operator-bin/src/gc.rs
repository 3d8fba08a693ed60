//! The `gc` cell: deletes what no agent deletes, because the agent that would is gone or
//! does not know.
//!
//! - **Owns** three timer jobs, each acting only while this operator leads:
//!   - `gc.identities`, every `identity-gc-interval`: CiliumIdentities no CiliumEndpoint
//!     uses (`status.identity.id`). An unused identity is marked in one round and deleted in
//!     the next if still unused, so it outlives its last user by at least one interval: an
//!     agent that just created one for a pod whose CiliumEndpoint is not written yet keeps
//!     it.
//!   - `gc.endpoints`, every `endpoint-gc-interval`: CiliumEndpoints whose Pod (same
//!     namespace and name) is gone, which an agent that went with its node leaves behind.
//!   - `gc.nodes`, every `nodes-gc-interval`: CiliumNodes whose Node is gone, marked in one
//!     round and deleted in the next (their pod CIDRs go back to the pool).
//! - **Provides** nothing; its invoke adds the jobs.
//! - **Depends on** `k8s-client` and `leader-election`.
//! - **Config keys**: see [`GcConfig`].
//! - **Degraded** (`gc.<job>`) while a round fails (the API server away); OK, with what the
//!   last round did, otherwise.
//!
//! Each round lists what it may delete before what proves it used (identities before
//! endpoints, endpoints before pods, CiliumNodes before Nodes): an object listed first
//! whose user appears before the second list is seen as used. Each delete carries the uid
//! listed as a precondition, so an object deleted and created again under the same name
//! meanwhile is kept. Marks are this leader's memory: a new leader starts marking afresh,
//! which only delays deletion.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_hive::{BoxError, Config, Jobs, Module};
use kube::api::{Api, DeleteParams, DynamicObject, Preconditions};
use serde_json::Value;

use crate::client::{Client, Kind, field, key, list_all, list_meta};
use crate::config::GcConfig;
use crate::error::{Error, Result};
use crate::leader::Leadership;

/// The `gc` module.
pub fn cell() -> Module {
    Module::new(
        "gc",
        "Deletes unused CiliumIdentities, and CiliumEndpoints and CiliumNodes whose Pod or Node is gone",
    )
    .config::<GcConfig>()
    .invoke(start)
}

/// What a round collects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collect {
    Identities,
    Endpoints,
    Nodes,
}

/// The invoke: one timer job per kind.
fn start(cfg: Config<GcConfig>, client: Arc<Client>, leadership: Arc<Leadership>, jobs: Jobs) {
    for (collect, name, interval) in [
        (Collect::Identities, "identities", cfg.identity_gc_interval),
        (Collect::Endpoints, "endpoints", cfg.endpoint_gc_interval),
        (Collect::Nodes, "nodes", cfg.nodes_gc_interval),
    ] {
        let gc = Arc::new(Gc {
            collect,
            client: client.clone(),
            leadership: leadership.clone(),
            marks: Mutex::default(),
        });
        jobs.timer(name, interval.max(Duration::from_millis(100)), move |ctx| {
            let (gc, reporter) = (gc.clone(), ctx.reporter().clone());
            async move {
                match gc.round().await {
                    Ok(Some(round)) => reporter.ok(format!("leading: {round}")),
                    Ok(None) => reporter.ok("not leading"),
                    Err(e) => return Err(Box::new(e) as BoxError),
                }
                Ok(())
            }
        })
        .add();
    }
}

/// What one round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Round {
    kept: usize,
    marked: usize,
    deleted: usize,
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "last round: {} in use, {} marked, {} deleted",
            self.kept, self.marked, self.deleted
        )
    }
}

struct Gc {
    collect: Collect,
    client: Arc<Client>,
    leadership: Arc<Leadership>,
    /// uid -> name of what the last round found unused.
    marks: Mutex<HashMap<String, String>>,
}

impl Gc {
    /// One round; `None` when this operator does not lead.
    async fn round(&self) -> Result<Option<Round>> {
        if !self.leadership.leading() {
            self.lock_marks().clear();
            return Ok(None);
        }
        let round = match self.collect {
            Collect::Identities => self.identities().await?,
            Collect::Endpoints => self.endpoints().await?,
            Collect::Nodes => self.nodes().await?,
        };
        tracing::debug!(collect = ?self.collect, "{round}");
        Ok(Some(round))
    }

    fn lock_marks(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn identities(&self) -> Result<Round> {
        let api = self.client.api(Kind::CiliumIdentity).await?;
        let identities = list_all(&api, Kind::CiliumIdentity).await?;
        let ceps = self.client.api(Kind::CiliumEndpoint).await?;
        let used: HashSet<String> = list_all(&ceps, Kind::CiliumEndpoint)
            .await?
            .iter()
            .filter_map(|cep| match field(cep, &["status", "identity", "id"])? {
                Value::Number(n) => Some(n.to_string()),
                Value::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect();
        let candidates = identities
            .iter()
            .map(|o| (o.metadata.clone(), used.contains(&key(&o.metadata))));
        self.two_rounds(&api, Kind::CiliumIdentity, candidates)
            .await
    }

    async fn nodes(&self) -> Result<Round> {
        let api = self.client.api(Kind::CiliumNode).await?;
        let cilium_nodes = list_all(&api, Kind::CiliumNode).await?;
        let nodes = self.client.api(Kind::Node).await?;
        let present: HashSet<String> = list_meta(&nodes, Kind::Node)
            .await?
            .iter()
            .map(key)
            .collect();
        let candidates = cilium_nodes
            .iter()
            .map(|o| (o.metadata.clone(), present.contains(&key(&o.metadata))));
        self.two_rounds(&api, Kind::CiliumNode, candidates).await
    }

    async fn endpoints(&self) -> Result<Round> {
        let api = self.client.api(Kind::CiliumEndpoint).await?;
        let ceps = list_meta(&api, Kind::CiliumEndpoint).await?;
        let pods = self.client.api(Kind::Pod).await?;
        let present: HashSet<String> = list_meta(&pods, Kind::Pod).await?.iter().map(key).collect();
        let mut round = Round::default();
        for cep in ceps {
            if present.contains(&key(&cep)) {
                round.kept += 1;
            } else if self.delete(&api, Kind::CiliumEndpoint, &cep).await? {
                tracing::info!(cep = %key(&cep), "CiliumEndpoint deleted: its Pod is gone");
                round.deleted += 1;
            }
        }
        Ok(round)
    }

    /// Marks the unused objects and deletes those the last round marked.
    async fn two_rounds(
        &self,
        api: &Api<DynamicObject>,
        kind: Kind,
        candidates: impl Iterator<Item = (kube::api::ObjectMeta, bool)>,
    ) -> Result<Round> {
        let mut round = Round::default();
        let last = std::mem::take(&mut *self.lock_marks());
        let mut marks = HashMap::new();
        for (meta, used) in candidates {
            let uid = meta.uid.clone().unwrap_or_default();
            if used {
                round.kept += 1;
            } else if last.contains_key(&uid) {
                if self.delete(api, kind, &meta).await? {
                    tracing::info!(object = %key(&meta), "{} deleted: unused for two rounds", kind.name());
                    round.deleted += 1;
                }
            } else {
                marks.insert(uid, key(&meta));
                round.marked += 1;
            }
        }
        *self.lock_marks() = marks;
        Ok(round)
    }

    /// Deletes the object if it is still the one listed (same uid); false when it is gone
    /// or another took its name.
    async fn delete(
        &self,
        api: &Api<DynamicObject>,
        kind: Kind,
        meta: &kube::api::ObjectMeta,
    ) -> Result<bool> {
        // Checked before each delete, not once per round: leadership may go mid-round.
        if !self.leadership.leading() {
            return Ok(false);
        }
        let name = meta.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: meta.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let api = match &meta.namespace {
            Some(ns) => Api::namespaced_with(self.client.get().await?, ns, &kind.resource()),
            None => api.clone(),
        };
        match api.delete(&name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(Error::api(format!(
                "deleting {} {}",
                kind.name(),
                key(meta)
            ))(e)),
        }
    }
}

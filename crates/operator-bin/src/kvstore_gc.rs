//! The `kvstore-gc` cell: with `kvstore: etcd`, the identities in etcd that no node uses
//! (`cilium/state/identities/v1/id/<N>` with no `value/<labels key>/` key), deleted in two
//! rounds, every `identity-gc-interval`, while this operator leads (see
//! `cellium_kvstore::IdentityGc` and `docs/kvstore.md`).
//!
//! - **Owns** the timer job `kvstore-gc.identities` and its etcd client.
//! - **Depends on** `leader-election`, and the kvstore keys (`kvstore`, `kvstore-endpoints`
//!   or `kvstore-opt etcd.config`, the agents' etcd configuration file with its TLS) and
//!   `identity-gc-interval`. A configuration that cannot work (a file missing, a key that
//!   does not go with its certificate) stops the operator at start, naming the file and key.
//! - **Degraded** while a round fails (etcd away, or refusing the operator's certificate,
//!   with etcd's reason): nothing is deleted then, and the marks are kept for the next round.

use std::sync::Arc;
use std::time::Duration;

use cellium_hive::{BoxError, Config, Jobs, Module};
use cellium_kvstore::{EtcdAccess, IdentityGc, KvstoreConfig, KvstoreKind};
use tokio::sync::Mutex;

use crate::config::GcConfig;
use crate::leader::Leadership;

/// The `kvstore-gc` module.
pub fn cell() -> Module {
    Module::new(
        "kvstore-gc",
        "Deletes the identities in etcd that no node uses (kvstore: etcd)",
    )
    .config::<KvstoreConfig>()
    .invoke(start)
}

fn start(
    kv: Config<KvstoreConfig>,
    gc: Config<GcConfig>,
    leadership: Arc<Leadership>,
    jobs: Jobs,
) -> Result<(), cellium_kvstore::Error> {
    if kv.kvstore != KvstoreKind::Etcd {
        return Ok(());
    }
    let access = EtcdAccess::from_config(&kv).map_err(cellium_kvstore::Error::Config)?;
    let state: Arc<Mutex<(Option<etcd_client::Client>, IdentityGc)>> =
        Arc::new(Mutex::new((None, IdentityGc::new())));
    let interval = gc.identity_gc_interval.max(Duration::from_millis(100));
    jobs.timer("identities", interval, move |ctx| {
        let (state, access, leadership) = (state.clone(), access.clone(), leadership.clone());
        async move {
            let mut state = state.lock().await;
            if !leadership.leading() {
                // Marks are the leader's memory: a new leader starts afresh.
                state.1 = IdentityGc::new();
                ctx.reporter().ok("not leading");
                return Ok(());
            }
            if state.0.is_none() {
                let client = access
                    .connect()
                    .await
                    .map_err(|e| format!("etcd at {}: {e}", access.endpoints.join(",")))?;
                state.0 = Some(client);
            }
            let (client, gc) = &mut *state;
            let Some(client) = client.as_mut() else {
                return Ok(());
            };
            let round = gc.round(client).await?;
            ctx.reporter().ok(format!(
                "leading: last round: {} in use, {} marked, {} deleted",
                round.in_use,
                round.marked,
                round.deleted.len()
            ));
            Ok::<(), BoxError>(())
        }
    })
    .add();
    Ok(())
}

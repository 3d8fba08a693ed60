//! Bringing the datapath's map in line with the desired state.

use std::collections::HashMap;

use cellium_datapath_bpf::{Datapath, IpcacheInfo};
use ipnet::IpNet;

use crate::error::{Error, Result};
use crate::ipcache::State;
use crate::table::Change;

/// What a reconciliation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Prefixes in the desired state.
    pub entries: usize,
    /// Map entries written because they were missing or different.
    pub written: usize,
    /// Map entries removed because no claim backs them.
    pub removed: usize,
}

/// Writes one change in effect to the map.
pub(crate) fn write(dp: &Datapath, change: Change) -> Result<()> {
    match change.after {
        Some(info) => dp
            .ipcache()
            .put(change.prefix, info)
            .map_err(|source| Error::Write {
                prefix: change.prefix,
                identity: info.identity,
                source,
            }),
        None => dp
            .ipcache()
            .delete(change.prefix)
            .map(|_| ())
            .map_err(|source| Error::Remove {
                prefix: change.prefix,
                source,
            }),
    }
}

/// Writes every desired entry the map lacks or has wrong, and with `prune` removes every
/// map entry that is not desired. Every entry is tried; the first failure is returned.
pub(crate) fn reconcile(state: &State, prune: bool) -> Result<SyncStats> {
    let dp = state.datapath.clone().ok_or(Error::NotMirrored)?;
    let actual: HashMap<IpNet, IpcacheInfo> = dp
        .ipcache()
        .entries()
        .map_err(Error::List)?
        .into_iter()
        .collect();
    let desired = state.table.desired();
    let mut stats = SyncStats {
        entries: desired.len(),
        ..SyncStats::default()
    };
    let mut first_err = None;
    for (&prefix, &info) in &desired {
        if actual.get(&prefix) == Some(&info) {
            continue;
        }
        let change = Change {
            prefix,
            before: actual.get(&prefix).copied(),
            after: Some(info),
        };
        match write(&dp, change) {
            Ok(()) => stats.written += 1,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if prune {
        for (&prefix, &info) in &actual {
            if desired.contains_key(&prefix) {
                continue;
            }
            tracing::debug!(%prefix, identity = info.identity, "stale ipcache entry removed");
            let change = Change {
                prefix,
                before: Some(info),
                after: None,
            };
            match write(&dp, change) {
                Ok(()) => stats.removed += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    first_err.map_or(Ok(stats), Err)
}

//! Restoring the table written by the previous run, and writing it for the next.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cellium_hive::error_chain as chain;
use cellium_labels::Labels;

use crate::error::{Error, Result};
use crate::identities::{Identities, IdentityEvent, Persister};
use crate::identity::{Identity, Scope};
use crate::persist;

/// What the restore found.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// How many identities were restored.
    pub(crate) count: usize,
    /// What was not restored, and where it was kept: each makes the module Degraded.
    pub(crate) problems: Vec<String>,
}

impl Identities {
    /// Loads the table written by the previous run. Nothing is dropped silently: a file that
    /// cannot be read is left as it is and never written over by this run; a file that
    /// cannot be decoded, or holds records that cannot be restored, is kept as read in
    /// `identities.json.corrupt` (or, if that copy cannot be written, left in place and
    /// never written over); every such problem is returned, naming the file.
    pub(crate) fn restore(&self) -> Restored {
        let Some(persister) = &self.persister else {
            return Restored::default();
        };
        let bytes = match persist::read(&persister.dir) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Restored::default(),
            Err(e) => {
                let reason = format!(
                    "{} (left as it is, and not written over while this agent runs; identities get new numbers)",
                    chain(&e)
                );
                persister.hold(reason.clone());
                return Restored {
                    count: 0,
                    problems: vec![reason],
                };
            }
        };
        let (records, mut problems) = match persist::decode(&bytes) {
            Ok(decoded) => decoded,
            Err(e) => (
                Vec::new(),
                vec![format!("{}: every identity gets a new number", chain(&e))],
            ),
        };
        let (count, in_use) = self.insert_restored(records);
        problems.extend(in_use);
        if !problems.is_empty() {
            let kept = match persister.dir.write(persist::KEPT, &bytes) {
                Ok(()) => format!("{} kept as read in {}", persist::FILE, persist::KEPT),
                Err(e) => {
                    let reason = format!(
                        "{} cannot be kept aside ({}); left as it is, and not written over while this agent runs",
                        persist::FILE,
                        chain(&e)
                    );
                    persister.hold(reason.clone());
                    reason
                }
            };
            for p in &problems {
                tracing::error!(file = persist::FILE, "{p}");
            }
            problems.insert(
                0,
                format!("{}: {} records not restored", persist::FILE, problems.len()),
            );
            problems.push(kept);
        }
        Restored { count, problems }
    }

    /// Adds restored identities (unreferenced) and announces them; a number or label set
    /// already in use (allocated before the restore) keeps its live identity.
    /// Returns how many were restored and why the others were not.
    fn insert_restored(&self, records: Vec<(u32, Labels)>) -> (usize, Vec<String>) {
        let mut table = self.write();
        // Whether everything in the table is on disk already (nothing was allocated before
        // the restore): then what is about to be read needs no writing back.
        let clean = self
            .persister
            .as_ref()
            .is_some_and(|p| p.written.load(Ordering::SeqCst) == table.generation);
        let mut restored = 0;
        let mut skipped = Vec::new();
        for (id, labels) in records {
            if table.by_id.contains_key(&id) || table.by_labels.contains_key(&labels) {
                skipped.push(format!(
                    "identity {id} ({labels}) skipped: its number or labels were allocated before the restore"
                ));
                continue;
            }
            let identity = Arc::new(Identity { id, labels });
            table.insert(identity.clone(), 0, true);
            let _ = self.events.send(IdentityEvent::Added(identity));
            restored += 1;
        }
        // New numbers continue after the restored ones rather than filling the gaps, which
        // the previous run may have released a moment ago.
        for scope in [Scope::Cluster, Scope::Local] {
            let range = table.range(scope).ids.clone();
            if let Some((&last, _)) = table.by_id.range(range).next_back() {
                table.set_cursor(scope, last);
            }
        }
        if clean && let Some(p) = &self.persister {
            p.written.store(table.generation, Ordering::SeqCst);
        }
        (restored, skipped)
    }

    /// Writes the table if it changed since the last write; returns how many identities
    /// were written, or `None` when nothing had changed.
    pub(crate) fn persist(&self) -> Result<Option<usize>> {
        let Some(persister) = &self.persister else {
            return Ok(None);
        };
        if let Some(reason) = persister.held() {
            return Err(Error::Held {
                file: persist::FILE,
                reason,
            });
        }
        let (generation, count, bytes) = {
            let table = self.read();
            if table.generation == persister.written.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let bytes = persist::encode(
                table
                    .by_id
                    .values()
                    // A retired number is not its labels' any more: they get a new one.
                    .filter(|e| !e.retired)
                    .map(|e| (e.identity.id, &e.identity.labels)),
            );
            (table.generation, table.by_id.len(), bytes)
        };
        persist::write(&persister.dir, &bytes)?;
        persister.written.fetch_max(generation, Ordering::SeqCst);
        Ok(Some(count))
    }
}

impl Persister {
    fn hold(&self, reason: String) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
    }

    fn held(&self) -> Option<String> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use cellium_hive::Trigger;
    use cellium_statedir::StateDir;

    use super::*;
    use crate::table::Table;

    fn labels(s: &str) -> Labels {
        s.parse().unwrap()
    }

    fn persisted(dir: &Arc<StateDir>) -> Identities {
        Identities::build(
            Table::default(),
            Some(Persister {
                dir: dir.clone(),
                trigger: Trigger::new(),
                written: AtomicU64::new(0),
                held: Default::default(),
            }),
        )
    }

    #[test]
    fn the_table_survives_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        let first = persisted(&dir);
        let web = first.allocate(&labels("k8s:app=web")).unwrap();
        let db = first.allocate(&labels("k8s:app=db")).unwrap();
        let gone = first.allocate(&labels("k8s:app=gone")).unwrap();
        let net = first
            .allocate(&Labels::for_cidr("10.0.0.0/8".parse().unwrap()))
            .unwrap();
        assert!(first.release(gone.id));
        assert_eq!(first.persist().unwrap(), Some(3));
        assert_eq!(first.persist().unwrap(), None, "nothing changed since");

        let second = persisted(&dir);
        let (snapshot, mut events) = second.snapshot_and_subscribe();
        assert_eq!(snapshot.len(), 10);
        assert_eq!(second.restore().count, 3);
        assert_eq!(
            second.persist().unwrap(),
            None,
            "what was read needs no writing"
        );
        for _ in 0..3 {
            assert!(matches!(events.try_recv(), Ok(IdentityEvent::Added(_))));
        }
        let restored = second.list().into_iter().filter(|i| i.restored).count();
        assert_eq!(restored, 3);
        // The endpoint manager re-allocates what it restores and gets the same numbers.
        assert_eq!(second.allocate(&labels("k8s:app=web")).unwrap().id, web.id);
        assert_eq!(
            second
                .allocate(&Labels::for_cidr("10.0.0.0/8".parse().unwrap()))
                .unwrap()
                .id,
            net.id
        );
        // New numbers continue after the restored ones.
        assert_eq!(
            second.allocate(&labels("k8s:app=new")).unwrap().id,
            db.id + 1
        );
        // Releasing an unclaimed restored identity does nothing; release_unclaimed does.
        assert!(!second.release(db.id));
        assert_eq!(second.release_unclaimed(), vec![db.id]);
        assert!(second.get(db.id).is_none());
        assert!(second.release_unclaimed().is_empty());
        let removed: Vec<u32> = std::iter::from_fn(|| events.try_recv().ok())
            .filter_map(|e| match e {
                IdentityEvent::Removed(i) => Some(i.id),
                IdentityEvent::Added(_) => None,
            })
            .collect();
        assert_eq!(removed, vec![db.id]);
        assert!(second.list().iter().all(|i| !i.restored));
    }

    #[test]
    fn a_live_allocation_wins_over_a_restored_record() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        let first = persisted(&dir);
        first.allocate(&labels("k8s:app=web")).unwrap();
        first.persist().unwrap();
        let second = persisted(&dir);
        // Allocated before the restore ran: the same number by chance, other labels.
        assert_eq!(second.allocate(&labels("k8s:app=early")).unwrap().id, 256);
        let restored = second.restore();
        assert_eq!(restored.count, 0);
        assert!(
            restored.problems[1].starts_with("identity 256 (k8s:app=web) skipped: its number or labels were allocated before the restore"),
            "{:?}",
            restored.problems
        );
        assert_eq!(second.get(256).unwrap().labels, labels("k8s:app=early"));
        // The early allocation is still to be written.
        assert_eq!(second.persist().unwrap(), Some(1));
    }

    #[test]
    fn an_undecodable_table_is_kept_aside_and_the_agent_starts_fresh() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        dir.write(persist::FILE, b"{garbage").unwrap();
        let ids = persisted(&dir);
        let restored = ids.restore();
        assert_eq!(restored.count, 0);
        assert_eq!(
            restored.problems[0],
            "identities.json: 1 records not restored"
        );
        assert!(
            restored.problems[1]
                .starts_with("the identity table identities.json cannot be decoded: "),
            "{:?}",
            restored.problems
        );
        assert_eq!(
            restored.problems[2],
            "identities.json kept as read in identities.json.corrupt"
        );
        assert_eq!(
            dir.read("identities.json.corrupt").unwrap().as_deref(),
            Some(&b"{garbage"[..])
        );
        assert_eq!(ids.allocate(&labels("k8s:app=web")).unwrap().id, 256);
        assert_eq!(ids.persist().unwrap(), Some(1));
        assert_eq!(persisted(&dir).restore().count, 1);
    }

    #[test]
    fn no_file_means_nothing_to_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        assert_eq!(persisted(&dir).restore().count, 0);
        assert_eq!(Identities::in_memory().restore().count, 0);
        assert_eq!(Identities::in_memory().persist().unwrap(), None);
    }

    #[test]
    fn records_that_do_not_fit_are_reported_and_the_file_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        let text = br#"{"version":1,"identities":[{"id":256,"labels":["k8s:app=web"]},{"id":257,"labels":["k8s:=bad"]}]}"#;
        dir.write(persist::FILE, text).unwrap();
        let ids = persisted(&dir);
        let restored = ids.restore();
        assert_eq!(restored.count, 1);
        assert!(
            restored.problems[1].starts_with("identity 257 (k8s:=bad) skipped: "),
            "{:?}",
            restored.problems
        );
        assert_eq!(dir.read(persist::KEPT).unwrap().as_deref(), Some(&text[..]));
        // The table is written without the bad record; the copy keeps it.
        ids.allocate(&labels("k8s:app=db")).unwrap();
        ids.persist().unwrap();
        assert_eq!(dir.read(persist::KEPT).unwrap().as_deref(), Some(&text[..]));
    }

    #[test]
    fn a_table_that_cannot_be_read_is_never_written_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        // A directory where the file should be: reading it fails (EISDIR).
        std::fs::create_dir(tmp.path().join(persist::FILE)).unwrap();
        std::fs::write(tmp.path().join("identities.json/inside"), b"kept").unwrap();
        let ids = persisted(&dir);
        let restored = ids.restore();
        assert_eq!(restored.count, 0);
        assert!(
            restored.problems[0]
                .starts_with("cannot read the identity table identities.json: read ")
                && restored.problems[0].contains("(os error 21)"),
            "{:?}",
            restored.problems
        );
        ids.allocate(&labels("k8s:app=web")).unwrap();
        let err = ids.persist().unwrap_err().to_string();
        assert!(
            err.starts_with("not writing the identity table identities.json: "),
            "{err}"
        );
        assert_eq!(
            std::fs::read(tmp.path().join("identities.json/inside")).unwrap(),
            b"kept"
        );
    }
}

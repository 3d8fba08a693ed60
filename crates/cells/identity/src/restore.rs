//! Restoring the table written by the previous run, and writing it for the next.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cellium_labels::Labels;

use crate::error::Result;
use crate::identities::{Identities, IdentityEvent};
use crate::identity::{Identity, Scope};
use crate::persist;

impl Identities {
    /// Loads the table written by the previous run; returns how many identities it holds.
    /// A file that cannot be decoded is kept aside as `identities.json.corrupt` and the
    /// table starts empty.
    pub(crate) fn restore(&self) -> Result<usize> {
        let Some(persister) = &self.persister else {
            return Ok(0);
        };
        let Some(bytes) = persist::read(&persister.dir)? else {
            return Ok(0);
        };
        let records = match persist::decode(&bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "stored identities lost: every identity gets a new number");
                let aside = format!("{}.corrupt", persist::FILE);
                if let Err(e) = persister.dir.write(&aside, &bytes) {
                    tracing::warn!(error = %e, "cannot keep the undecodable identity table");
                }
                return Ok(0);
            }
        };
        Ok(self.insert_restored(records))
    }

    /// Adds restored identities (unreferenced) and announces them; a number or label set
    /// already in use (allocated before the restore) keeps its live identity.
    fn insert_restored(&self, records: Vec<(u32, Labels)>) -> usize {
        let mut table = self.write();
        // Whether everything in the table is on disk already (nothing was allocated before
        // the restore): then what is about to be read needs no writing back.
        let clean = self
            .persister
            .as_ref()
            .is_some_and(|p| p.written.load(Ordering::SeqCst) == table.generation);
        let mut restored = 0;
        for (id, labels) in records {
            if table.by_id.contains_key(&id) || table.by_labels.contains_key(&labels) {
                tracing::warn!(id, %labels, "stored identity skipped: number or labels in use");
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
        restored
    }

    /// Writes the table if it changed since the last write; returns how many identities
    /// were written, or `None` when nothing had changed.
    pub(crate) fn persist(&self) -> Result<Option<usize>> {
        let Some(persister) = &self.persister else {
            return Ok(None);
        };
        let (generation, count, bytes) = {
            let table = self.read();
            if table.generation == persister.written.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let bytes = persist::encode(
                table
                    .by_id
                    .values()
                    .map(|e| (e.identity.id, &e.identity.labels)),
            );
            (table.generation, table.by_id.len(), bytes)
        };
        persist::write(&persister.dir, &bytes)?;
        persister.written.fetch_max(generation, Ordering::SeqCst);
        Ok(Some(count))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use cellium_hive::Trigger;
    use cellium_statedir::StateDir;

    use super::*;
    use crate::identities::Persister;
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
        assert_eq!(second.restore().unwrap(), 3);
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
        assert_eq!(second.restore().unwrap(), 0);
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
        assert_eq!(ids.restore().unwrap(), 0);
        assert_eq!(
            dir.read("identities.json.corrupt").unwrap().as_deref(),
            Some(&b"{garbage"[..])
        );
        assert_eq!(ids.allocate(&labels("k8s:app=web")).unwrap().id, 256);
        assert_eq!(ids.persist().unwrap(), Some(1));
        assert_eq!(persisted(&dir).restore().unwrap(), 1);
    }

    #[test]
    fn no_file_means_nothing_to_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(StateDir::open_at(tmp.path()).unwrap());
        assert_eq!(persisted(&dir).restore().unwrap(), 0);
        assert_eq!(Identities::in_memory().restore().unwrap(), 0);
        assert_eq!(Identities::in_memory().persist().unwrap(), None);
    }
}

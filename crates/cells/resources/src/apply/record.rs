//! The record of applied objects in the state directory, as a cluster keeps them in etcd: in
//! standalone mode they are the only record of the node's policies, and an agent that forgot
//! them at a restart would open what they close.
//!
//! Layout, under the state directory:
//!
//! ```text
//! resources/<Kind>~<namespace>~<name>.yaml   one per object: its document as applied
//! resources/journal/<sequence>.json          a committed change not yet merged into them
//! ```
//!
//! The commit protocol makes a change (every object of one applied file, or every object
//! one delete removes, a namespace's contents included) all or nothing, also across a crash:
//!
//! 1. The change is written as one journal file (temp file, fsync, rename, fsync of the
//!    directory): the rename is the commit. A failure here fails the call and changes
//!    nothing; the tables are changed only after it succeeded.
//! 2. The change is merged: the object files are written and removed, flushed (each file,
//!    then the directory), and the journal file is removed. A failure here keeps the journal file, which already
//!    holds the change, and is retried before the next commit.
//! 3. At start, the object files are read and every journal file found is laid over them in
//!    sequence order (then merged), so a change whose journal file exists is in force in
//!    full, and one whose journal file does not exist left no trace.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cellium_statedir::StateDir;
use serde::{Deserialize, Serialize};

pub(crate) use cellium_hive::error_chain;
use cellium_k8s_objects::ObjectKey;

const DIR: &str = "resources";
const JOURNAL: &str = "resources/journal";
const VERSION: u32 = 1;

/// One change: the object files it writes, with their documents, and those it removes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Transaction {
    /// The format.
    version: u32,
    /// Where the change came from, for a person reading the journal.
    pub(crate) source: String,
    /// Object files written: name -> document.
    pub(crate) put: BTreeMap<String, String>,
    /// Object files removed.
    pub(crate) remove: BTreeSet<String>,
}

impl Transaction {
    /// An empty change from `source`.
    pub(crate) fn new(source: &str) -> Transaction {
        Transaction {
            version: VERSION,
            source: source.to_string(),
            ..Transaction::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.put.is_empty() && self.remove.is_empty()
    }
}

/// The record: what is on disk, and the journal files committed but not merged yet.
#[derive(Debug)]
pub(crate) struct Record {
    dir: Arc<StateDir>,
    /// Every object file as it is once the journal is merged: its document, or `None` for
    /// one that could not be read (it is still on disk, and a delete of its object removes it).
    files: BTreeMap<String, Option<String>>,
    /// Committed changes not yet merged into the object files, oldest first.
    pending: Vec<(u64, Transaction)>,
    /// The next journal sequence number.
    next: u64,
}

/// What the record held at start.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    /// Every object file that could be read, with its document: namespaces first (the other
    /// objects need theirs to exist), then by name.
    pub(crate) objects: Vec<(String, String)>,
    /// What could not be read, each as (path in the state directory, reason). Nothing of it
    /// was removed.
    pub(crate) problems: Vec<(String, String)>,
}

/// A merge that failed: the journal file is kept and the change is still in force.
#[derive(Debug)]
pub(crate) struct MergeError {
    /// The oldest journal file not merged.
    pub(crate) journal: String,
    /// Why.
    pub(crate) source: cellium_statedir::Error,
}

impl Record {
    /// Reads the record: object files, then the journal laid over them.
    pub(crate) fn open(dir: Arc<StateDir>) -> (Record, Loaded) {
        let mut record = Record {
            dir,
            files: BTreeMap::new(),
            pending: Vec::new(),
            next: 1,
        };
        let mut problems = Vec::new();
        record.read_objects(&mut problems);
        record.read_journal(&mut problems);
        let mut objects: Vec<(String, String)> = record
            .files
            .iter()
            .filter_map(|(f, text)| Some((f.clone(), text.clone()?)))
            .collect();
        objects.sort_by_key(|(f, _)| (!f.starts_with("Namespace~"), f.clone()));
        (record, Loaded { objects, problems })
    }

    fn read_objects(&mut self, problems: &mut Vec<(String, String)>) {
        let names = match self.dir.list(DIR) {
            Ok(names) => names,
            Err(e) => {
                problems.push((format!("{DIR}/"), error_chain(&e)));
                return;
            }
        };
        for name in names.into_iter().filter(|n| n.ends_with(".yaml")) {
            let rel = format!("{DIR}/{name}");
            let text = match self.dir.read(&rel) {
                Ok(Some(bytes)) => match String::from_utf8(bytes) {
                    Ok(text) => Some(text),
                    Err(_) => {
                        problems.push((rel, "not UTF-8 text".into()));
                        None
                    }
                },
                // Removed between listing and reading: not ours to worry about.
                Ok(None) => continue,
                Err(e) => {
                    problems.push((rel, error_chain(&e)));
                    None
                }
            };
            self.files.insert(name, text);
        }
    }

    fn read_journal(&mut self, problems: &mut Vec<(String, String)>) {
        let names = match self.dir.list(JOURNAL) {
            Ok(names) => names,
            Err(e) => {
                problems.push((format!("{JOURNAL}/"), error_chain(&e)));
                return;
            }
        };
        let mut sequenced: Vec<(u64, String)> = names
            .into_iter()
            .filter_map(|n| Some((n.strip_suffix(".json")?.parse().ok()?, n)))
            .collect();
        sequenced.sort();
        for (seq, name) in sequenced {
            self.next = self.next.max(seq + 1);
            let rel = format!("{JOURNAL}/{name}");
            let tx = match self.dir.read(&rel) {
                Ok(Some(bytes)) => serde_json::from_slice::<Transaction>(&bytes)
                    .map_err(|e| format!("cannot be decoded: {e}")),
                Ok(None) => continue,
                Err(e) => Err(error_chain(&e)),
            };
            match tx {
                Ok(tx) => {
                    self.lay_over(&tx);
                    self.pending.push((seq, tx));
                }
                // Kept on disk and never merged: a person decides what it was.
                Err(reason) => problems.push((rel, reason)),
            }
        }
    }

    /// The name of `kind`/`key`'s object file (`~` appears in no Kubernetes name).
    pub(crate) fn file_name(kind: &str, key: &ObjectKey) -> String {
        format!("{kind}~{}~{}.yaml", key.namespace, key.name)
    }

    /// The kind and key an object file holds, from its name.
    pub(crate) fn parse_file_name(name: &str) -> Option<(&str, ObjectKey)> {
        let mut parts = name.strip_suffix(".yaml")?.split('~');
        let (kind, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || kind.is_empty() || name.is_empty() {
            return None;
        }
        Some((kind, ObjectKey::namespaced(namespace, name)))
    }

    /// The path of an object file in the state directory, as messages name it.
    pub(crate) fn path_of(file: &str) -> String {
        format!("{DIR}/{file}")
    }

    /// Whether an object file exists (once the journal is merged).
    pub(crate) fn holds(&self, file: &str) -> bool {
        self.files.contains_key(file)
    }

    /// Whether an object file holds exactly `text`.
    pub(crate) fn holds_text(&self, file: &str, text: &str) -> bool {
        matches!(self.files.get(file), Some(Some(t)) if t == text)
    }

    /// The object files of namespaced objects in `namespace`.
    pub(crate) fn files_in_namespace(&self, namespace: &str) -> Vec<String> {
        self.files
            .keys()
            .filter(|f| Record::parse_file_name(f).is_some_and(|(_, k)| k.namespace == namespace))
            .cloned()
            .collect()
    }

    /// Commits `tx` (step 1 of the protocol): when this returns `Ok`, the change survives a
    /// crash; when it returns an error, nothing of it is on disk. An empty change writes
    /// nothing.
    pub(crate) fn commit(&mut self, tx: Transaction) -> Result<(), cellium_statedir::Error> {
        if tx.is_empty() {
            return Ok(());
        }
        // Serializing strings cannot fail.
        let bytes = serde_json::to_vec(&tx).unwrap_or_default();
        let seq = self.next;
        self.dir.write(journal_file(seq), &bytes)?;
        self.next += 1;
        self.lay_over(&tx);
        self.pending.push((seq, tx));
        Ok(())
    }

    /// Merges every committed change into the object files (step 2); on failure the journal
    /// files not merged are kept, to be merged by a later call or at the next start.
    pub(crate) fn merge(&mut self) -> Result<(), MergeError> {
        let Some(&(first, _)) = self.pending.first() else {
            return Ok(());
        };
        let fail = |source| MergeError {
            journal: journal_file(first),
            source,
        };
        for (_, tx) in &self.pending {
            for (file, text) in &tx.put {
                self.dir
                    .write_volatile(Record::path_of(file), text.as_bytes())
                    .map_err(fail)?;
            }
            for file in &tx.remove {
                self.dir.remove(Record::path_of(file)).map_err(fail)?;
            }
        }
        // Flushed (each file written, then the directory's entries) before the journal goes.
        for (_, tx) in &self.pending {
            for file in tx.put.keys() {
                self.dir.sync_file(Record::path_of(file)).map_err(fail)?;
            }
        }
        self.dir.sync_dir(DIR).map_err(fail)?;
        for (seq, _) in std::mem::take(&mut self.pending) {
            if let Err(e) = self.dir.remove(journal_file(seq)) {
                // Harmless: merging it again at the next start writes the same files.
                tracing::warn!(journal = journal_file(seq), error = %error_chain(&e), "cannot remove a merged journal file");
            }
        }
        Ok(())
    }

    /// Whether committed changes wait to be merged.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn lay_over(&mut self, tx: &Transaction) {
        for (file, text) in &tx.put {
            self.files.insert(file.clone(), Some(text.clone()));
        }
        for file in &tx.remove {
            self.files.remove(file);
        }
    }
}

fn journal_file(seq: u64) -> String {
    format!("{JOURNAL}/{seq:020}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &std::path::Path) -> (Record, Loaded) {
        Record::open(Arc::new(StateDir::open_at(path).unwrap()))
    }

    fn tx(put: &[(&str, &str)], remove: &[&str]) -> Transaction {
        let mut tx = Transaction::new("t.yaml");
        for (f, t) in put {
            tx.put.insert(f.to_string(), t.to_string());
        }
        for f in remove {
            tx.remove.insert(f.to_string());
        }
        tx
    }

    #[test]
    fn file_names_round_trip() {
        let key = ObjectKey::namespaced("shop", "web");
        let name = Record::file_name("Pod", &key);
        assert_eq!(name, "Pod~shop~web.yaml");
        assert_eq!(Record::parse_file_name(&name), Some(("Pod", key)));
        assert_eq!(
            Record::parse_file_name("Namespace~~shop.yaml"),
            Some(("Namespace", ObjectKey::cluster("shop")))
        );
        for bad in ["Pod~a.yaml", "Pod~a~b~c.yaml", "~a~b.yaml", "Pod~a~b.json"] {
            assert_eq!(Record::parse_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_committed_change_is_in_force_merged_or_not() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut record, _) = open(tmp.path());
        record
            .commit(tx(
                &[("Namespace~~a.yaml", "ns a"), ("Pod~a~p.yaml", "pod p")],
                &[],
            ))
            .unwrap();
        record.merge().unwrap();
        // Committed but never merged, as after a crash between the two steps.
        record
            .commit(tx(&[("Pod~a~q.yaml", "pod q")], &["Pod~a~p.yaml"]))
            .unwrap();
        assert!(
            tmp.path()
                .join("resources/journal/00000000000000000002.json")
                .exists()
        );
        drop(record);

        let (mut record, loaded) = open(tmp.path());
        assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
        let files: Vec<_> = loaded.objects.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(files, ["Namespace~~a.yaml", "Pod~a~q.yaml"]);
        assert!(record.has_pending());
        record.merge().unwrap();
        assert!(!tmp.path().join("resources/Pod~a~p.yaml").exists());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("resources/Pod~a~q.yaml")).unwrap(),
            "pod q"
        );
        assert_eq!(record.dir.list(JOURNAL).unwrap(), Vec::<String>::new());
        // Numbers go on after the highest seen.
        record.commit(tx(&[("Pod~a~r.yaml", "r")], &[])).unwrap();
        assert!(
            tmp.path()
                .join("resources/journal/00000000000000000003.json")
                .exists()
        );
    }

    #[test]
    fn what_cannot_be_read_is_reported_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("resources");
        std::fs::create_dir_all(dir.join("journal")).unwrap();
        std::fs::write(dir.join("Pod~a~bin.yaml"), [0xff, 0xfe]).unwrap();
        std::fs::write(dir.join("journal/00000000000000000007.json"), "{torn").unwrap();
        std::fs::write(dir.join("Pod~a~ok.yaml"), "fine").unwrap();
        let (mut record, loaded) = open(tmp.path());
        let problems: Vec<_> = loaded.problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            problems,
            [
                "resources/Pod~a~bin.yaml",
                "resources/journal/00000000000000000007.json"
            ]
        );
        assert_eq!(loaded.objects.len(), 1);
        assert!(
            record.holds("Pod~a~bin.yaml"),
            "a delete can still remove it"
        );
        record.commit(tx(&[("Pod~a~n.yaml", "n")], &[])).unwrap();
        record.merge().unwrap();
        assert!(dir.join("journal/00000000000000000007.json").exists());
        assert!(dir.join("Pod~a~bin.yaml").exists());
    }
}

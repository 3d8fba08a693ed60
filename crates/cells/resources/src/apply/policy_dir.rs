//! `policy-dir`: a directory of Kubernetes YAML files applied as they change.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file of the directory is applied through the apply
//! path (the same as `cellium apply -f`: limits, validation, the record, all or nothing) when
//! its content changes; the objects a file no longer holds (it was edited, or removed) are
//! deleted, unless another file of the directory still holds them. A file that does not apply
//! changes nothing: its objects keep their previous state, and the error is logged once and
//! reported on the job's health until the file is fixed.
//!
//! The work a file costs is bounded: a file larger than `apply-max-bytes` is refused from its
//! size, unread; a file whose content did not change since it was applied or refused is not
//! decoded again. A refused file is tried again only when its content changes or the tables
//! do (its namespace may have appeared since); a file that could not be recorded (a failing
//! disk) is tried again on every pass.
//!
//! The directory is polled (every [`POLL`]): a poll reads a few small files, and needs no
//! inotify watch that a replaced directory or a rename-into-place editor could escape.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cellium_hive::Jobs;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::apply::record::error_chain;
use crate::error::Error;
use crate::resources::{Action, Resources};
use cellium_k8s_objects::ObjectKey;

/// How often the directory is read.
pub const POLL: Duration = Duration::from_secs(2);

/// An object a file holds: (kind, key).
type ObjectRef = (&'static str, ObjectKey);

/// What was last seen of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Nothing yet.
    Nothing,
    /// Its content.
    Content(String),
    /// Only its size and time, as it was too large to be read.
    TooLarge {
        len: u64,
        modified: Option<SystemTime>,
    },
}

/// What the watcher knows of one file.
#[derive(Debug)]
struct FileState {
    /// What was last seen: applied, or refused when `error` is set.
    seen: Seen,
    /// The objects of the content last applied.
    objects: BTreeSet<ObjectRef>,
    /// Why what was last seen was refused.
    error: Option<String>,
    /// The tables' revision when it was refused.
    refused_at: u64,
}

impl Default for FileState {
    fn default() -> Self {
        FileState {
            seen: Seen::Nothing,
            objects: BTreeSet::new(),
            error: None,
            refused_at: 0,
        }
    }
}

/// The watcher's state: every file seen.
#[derive(Debug, Default)]
pub struct PolicyDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// How many times a file was decoded (applied or refused), for the record of the work.
    decoded: u64,
}

/// Adds the `policy-dir` job.
pub(crate) fn watch(jobs: &Jobs, dir: PathBuf, resources: Arc<Resources>) {
    let state = Arc::new(Mutex::new(PolicyDir::new(dir)));
    jobs.timer("policy-dir", POLL, move |ctx| {
        let (state, resources) = (state.clone(), resources.clone());
        async move {
            let mut state = state.lock_owned().await;
            let (errors, summary) = tokio::task::spawn_blocking(move || {
                let errors = state.sync(&resources);
                errors.map(|e| (e, state.summary()))
            })
            .await??;
            if errors.is_empty() {
                ctx.reporter().ok(summary);
            } else {
                ctx.reporter().degraded(errors.join("; "));
            }
            Ok(())
        }
    })
    .add();
}

impl PolicyDir {
    /// A watcher of `dir`, which has seen nothing yet.
    pub fn new(dir: PathBuf) -> PolicyDir {
        PolicyDir {
            dir,
            ..PolicyDir::default()
        }
    }

    /// "/etc/cellium/policies: 3 files, 7 objects".
    pub fn summary(&self) -> String {
        let objects: usize = self.files.values().map(|f| f.objects.len()).sum();
        format!(
            "{}: {} files, {} objects",
            self.dir.display(),
            self.files.len(),
            objects
        )
    }

    /// How many times a file's content was decoded so far (applied or refused).
    pub fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Applies what changed since the last call. Returns the problems of the files that do
    /// not apply (each also logged once); fails only when the directory cannot be read.
    pub fn sync(&mut self, resources: &Resources) -> Result<Vec<String>, Error> {
        let read_err = |source| Error::PolicyDir {
            path: self.dir.clone(),
            source,
        };
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(read_err)? {
            let path = entry.map_err(read_err)?.path();
            if is_manifest(&path) {
                paths.push(path);
            }
        }
        // In name order, so `00-namespaces.yaml` applies before the policies that need them.
        paths.sort();
        let mut seen = BTreeSet::new();
        for path in paths {
            // A file that vanished between listing and reading is handled as removed.
            let Some(now) = look(&path, resources.limits().max_bytes) else {
                continue;
            };
            seen.insert(path.clone());
            self.visit(resources, path, now);
        }
        let removed: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !seen.contains(*p))
            .cloned()
            .collect();
        for path in removed {
            if let Some(state) = self.files.remove(&path) {
                let source = path.display().to_string();
                tracing::info!(file = %source, "policy file removed");
                self.delete_unheld(resources, &source, state.objects.into_iter().collect());
            }
        }
        Ok(self
            .files
            .values()
            .filter_map(|f| f.error.clone())
            .collect())
    }

    /// Applies one file if it needs it.
    fn visit(&mut self, resources: &Resources, path: PathBuf, now: Seen) {
        let revision = resources.revision();
        let state = self.files.entry(path.clone()).or_default();
        let unchanged = state.seen == now;
        // A refusal may be the state's (a namespace not there yet): retried once that moved.
        if unchanged && (state.error.is_none() || state.refused_at == revision) {
            return;
        }
        let source = path.display().to_string();
        let result = match &now {
            Seen::Content(text) => {
                self.decoded += 1;
                apply(resources, &source, text)
            }
            Seen::TooLarge { len, .. } => Err(Error::TooLarge {
                origin: source.clone(),
                size: usize::try_from(*len).unwrap_or(usize::MAX),
                limit: resources.limits().max_bytes,
            }),
            Seen::Nothing => return,
        };
        let state = self.files.entry(path.clone()).or_default();
        let dropped = match result {
            Ok(objects) => {
                let dropped: Vec<ObjectRef> = state.objects.difference(&objects).cloned().collect();
                state.objects = objects;
                state.error = None;
                state.seen = now;
                tracing::info!(file = %source, "policy file applied");
                dropped
            }
            Err(e) => {
                let message = format!("{} not applied: {}", path.display(), error_chain(&e));
                if state.error.as_ref() != Some(&message) {
                    tracing::warn!("{message}");
                }
                state.error = Some(message);
                // A failed record is no verdict on the file: read and tried again next pass.
                if !matches!(e, Error::Record { .. }) {
                    state.seen = now;
                    state.refused_at = revision;
                }
                Vec::new()
            }
        };
        self.delete_unheld(resources, &source, dropped);
    }

    /// Deletes the objects of `dropped` that no file holds any more.
    fn delete_unheld(&self, resources: &Resources, source: &str, dropped: Vec<ObjectRef>) {
        let held: BTreeSet<&ObjectRef> = self.files.values().flat_map(|f| &f.objects).collect();
        let gone: Vec<ObjectRef> = dropped.into_iter().filter(|o| !held.contains(o)).collect();
        if gone.is_empty() {
            return;
        }
        match resources.delete_objects(source, gone) {
            Ok(outcomes) => {
                for o in outcomes.iter().filter(|o| o.action == Action::Deleted) {
                    tracing::info!(file = %source, kind = o.kind, object = %o.key, "deleted: no longer in the policy directory");
                }
            }
            Err(e) => {
                tracing::warn!(file = %source, "deleting removed objects failed: {}", error_chain(&e))
            }
        }
    }
}

/// What `path` holds now: its content, or only its size when it is too large to be read;
/// `None` when it cannot be read (it vanished).
fn look(path: &Path, max_bytes: usize) -> Option<Seen> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > max_bytes as u64 {
        return Some(Seen::TooLarge {
            len: meta.len(),
            modified: meta.modified().ok(),
        });
    }
    std::fs::read_to_string(path).ok().map(Seen::Content)
}

fn apply(resources: &Resources, source: &str, content: &str) -> Result<BTreeSet<ObjectRef>, Error> {
    if content.trim().is_empty() {
        return Ok(BTreeSet::new());
    }
    let outcomes = resources.apply_cancellable(source, content, &CancellationToken::new())?;
    Ok(outcomes.into_iter().map(|o| (o.kind, o.key)).collect())
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    !hidden
        && path.is_file()
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n";
    const NP_A: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a, namespace: shop}\nspec: {podSelector: {}}\n";
    const NP_B: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b, namespace: shop}\nspec: {podSelector: {}}\n";
    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 80}]}\n";

    fn np(r: &Resources, name: &str) -> bool {
        r.network_policies
            .get(&ObjectKey::namespaced("shop", name))
            .is_some()
    }

    #[test]
    fn files_apply_edits_remove_and_bad_files_keep_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let r = Resources::new();
        let mut w = PolicyDir::new(dir.path().to_path_buf());
        std::fs::write(dir.path().join("0-ns.yaml"), NS).unwrap();
        std::fs::write(
            dir.path().join("1-pol.yaml"),
            format!("{NP_A}---\n{NP_B}---\n{SVC}"),
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        assert!(w.sync(&r).unwrap().is_empty());
        assert!(np(&r, "a") && np(&r, "b") && r.services.len() == 1);

        // An edit that drops b and the service deletes them.
        std::fs::write(dir.path().join("1-pol.yaml"), NP_A).unwrap();
        assert!(w.sync(&r).unwrap().is_empty());
        assert!(np(&r, "a") && !np(&r, "b") && r.services.is_empty());

        // A broken edit changes nothing and is reported until fixed.
        std::fs::write(
            dir.path().join("1-pol.yaml"),
            NP_A.replace("podSelector", "podSelectr"),
        )
        .unwrap();
        let errors = w.sync(&r).unwrap();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("1-pol.yaml not applied"), "{errors:?}");
        assert!(
            errors[0].contains("spec.podSelectr: unknown field"),
            "{errors:?}"
        );
        assert!(np(&r, "a"));
        assert_eq!(w.sync(&r).unwrap().len(), 1, "still reported");

        // Moving an object to another file keeps it.
        std::fs::write(dir.path().join("2-more.yaml"), NP_A).unwrap();
        std::fs::remove_file(dir.path().join("1-pol.yaml")).unwrap();
        assert!(w.sync(&r).unwrap().is_empty());
        assert!(np(&r, "a"));

        std::fs::remove_file(dir.path().join("2-more.yaml")).unwrap();
        assert!(w.sync(&r).unwrap().is_empty());
        assert!(!np(&r, "a"));
        assert!(
            w.summary().ends_with("1 files, 1 objects"),
            "{}",
            w.summary()
        );
    }

    #[test]
    fn a_file_is_decoded_again_only_when_it_or_the_tables_change() {
        let dir = tempfile::tempdir().unwrap();
        let r = Resources::new();
        let mut w = PolicyDir::new(dir.path().to_path_buf());
        std::fs::write(dir.path().join("a.yaml"), NP_A).unwrap();
        let broken = "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n";
        std::fs::write(dir.path().join("b.yaml"), broken).unwrap();
        // a.yaml needs its namespace, b.yaml is broken: both refused once.
        assert_eq!(w.sync(&r).unwrap().len(), 2);
        assert_eq!(w.decoded(), 2);
        for _ in 0..3 {
            assert_eq!(w.sync(&r).unwrap().len(), 2);
        }
        assert_eq!(w.decoded(), 2, "nothing changed, nothing decoded");

        // The namespace appears (through the CLI, say): the refused files are tried again.
        r.apply("ns.yaml", NS).unwrap();
        assert_eq!(w.sync(&r).unwrap().len(), 1);
        assert!(np(&r, "a"));
        assert_eq!(w.decoded(), 4);
        w.sync(&r).unwrap();
        assert_eq!(w.decoded(), 4);

        // An oversized file is refused from its size, never read.
        let huge = format!("# {}\n", "x".repeat(r.limits().max_bytes));
        std::fs::write(dir.path().join("b.yaml"), &huge).unwrap();
        let errors = w.sync(&r).unwrap();
        assert!(
            errors[0].ends_with(&format!(
                "b.yaml not applied: {}/b.yaml: {} bytes is more than apply-max-bytes (3145728)",
                dir.path().display(),
                huge.len()
            )),
            "{errors:?}"
        );
        w.sync(&r).unwrap();
        assert_eq!(w.decoded(), 4);
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let mut w = PolicyDir::new("/nonexistent/cellium-policies".into());
        let err = w.sync(&Resources::new()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read the policy directory /nonexistent/cellium-policies"),
            "{err}"
        );
    }
}

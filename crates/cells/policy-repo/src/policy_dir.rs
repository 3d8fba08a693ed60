//! `--policy-dir`: a directory of Kubernetes YAML files applied as they change.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file of the directory is applied through
//! `Resources::apply` (the same path as `cellium apply -f`) when its content changes; the
//! objects a file no longer holds (it was edited, or removed) are deleted through
//! `Resources::delete`, unless another file of the directory still holds them. A file that
//! does not apply changes nothing (apply is all-or-nothing): its objects keep their previous
//! state, the error is logged and reported on the job's health until the file is fixed.
//!
//! The directory is polled (every [`POLL`]): a poll reads a few small files, and needs no
//! inotify watch that a replaced directory or a rename-into-place editor could escape.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cellium_hive::Jobs;
use cellium_resources::{Action, Outcome, Resources};
use tokio::sync::Mutex;

use crate::error::Error;

/// How often the directory is read.
pub const POLL: Duration = Duration::from_secs(2);

/// An object a file holds: (kind, namespace, name).
type ObjectRef = (String, String, String);

/// What the watcher knows of one file.
#[derive(Debug, Default)]
struct FileState {
    /// The content last read (applied, or refused when `error` is set).
    content: String,
    /// The objects of the content last applied.
    objects: BTreeSet<ObjectRef>,
    /// Why the content last seen was refused.
    error: Option<String>,
}

/// The watcher's state: every file seen.
#[derive(Debug, Default)]
pub struct PolicyDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

/// Adds the `policy-dir` job.
pub fn watch(jobs: &Jobs, dir: PathBuf, resources: Arc<Resources>) {
    let state = Arc::new(Mutex::new(PolicyDir::new(dir)));
    jobs.timer("policy-dir", POLL, move |ctx| {
        let (state, resources) = (state.clone(), resources.clone());
        async move {
            let mut state = state.lock().await;
            let errors = state.sync(&resources)?;
            if errors.is_empty() {
                ctx.reporter().ok(state.summary());
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
            files: BTreeMap::new(),
        }
    }

    /// "3 files, 7 objects".
    pub fn summary(&self) -> String {
        let objects: usize = self.files.values().map(|f| f.objects.len()).sum();
        format!(
            "{}: {} files, {} objects",
            self.dir.display(),
            self.files.len(),
            objects
        )
    }

    /// Applies what changed since the last call. Returns the problems of the files that do
    /// not apply (each also logged once); fails only when the directory cannot be read.
    pub fn sync(&mut self, resources: &Resources) -> Result<Vec<String>, Error> {
        let read_err = |source| Error::Read {
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
            let Ok(content) = std::fs::read_to_string(&path) else {
                continue;
            };
            seen.insert(path.clone());
            let state = self.files.entry(path.clone()).or_default();
            // A refused file is tried again on every pass: it may need an object of
            // another file that has been fixed since.
            if state.content == content && state.error.is_none() {
                continue;
            }
            let source = path.display().to_string();
            let dropped = match apply(resources, &source, &content) {
                Ok(objects) => {
                    let dropped: Vec<ObjectRef> =
                        state.objects.difference(&objects).cloned().collect();
                    state.objects = objects;
                    state.error = None;
                    tracing::info!(file = %source, "policy file applied");
                    dropped
                }
                Err(reason) => {
                    let e = Error::Apply {
                        path: path.clone(),
                        reason,
                    }
                    .to_string();
                    if state.error.as_ref() != Some(&e) {
                        tracing::warn!("{e}");
                    }
                    state.error = Some(e);
                    Vec::new()
                }
            };
            state.content = content;
            self.delete_unheld(resources, &source, dropped);
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

    /// Deletes the objects of `dropped` that no file holds any more.
    fn delete_unheld(&self, resources: &Resources, source: &str, dropped: Vec<ObjectRef>) {
        let held: BTreeSet<&ObjectRef> = self.files.values().flat_map(|f| &f.objects).collect();
        let docs: Vec<String> = dropped
            .iter()
            .filter(|o| !held.contains(o))
            .filter_map(|(kind, ns, name)| {
                let api = api_version(kind)?;
                let ns = if ns.is_empty() {
                    String::new()
                } else {
                    format!(", namespace: {ns:?}")
                };
                Some(format!(
                    "apiVersion: {api}\nkind: {kind}\nmetadata: {{name: {name:?}{ns}}}\n"
                ))
            })
            .collect();
        if docs.is_empty() {
            return;
        }
        match resources.delete(source, &docs.join("---\n")) {
            Ok(outcomes) => {
                for o in outcomes.iter().filter(|o| o.action == Action::Deleted) {
                    tracing::info!(file = %source, kind = o.kind, object = %o.key, "deleted: no longer in the policy directory");
                }
            }
            Err(e) => tracing::warn!(file = %source, "deleting removed objects failed: {e}"),
        }
    }
}

fn apply(
    resources: &Resources,
    source: &str,
    content: &str,
) -> Result<BTreeSet<ObjectRef>, String> {
    if content.trim().is_empty() {
        return Ok(BTreeSet::new());
    }
    let outcomes = resources
        .apply(source, content)
        .map_err(|e| e.to_string())?;
    Ok(outcomes.iter().map(object_ref).collect())
}

fn object_ref(o: &Outcome) -> ObjectRef {
    (
        o.kind.to_string(),
        o.key.namespace.clone(),
        o.key.name.clone(),
    )
}

fn api_version(kind: &str) -> Option<&'static str> {
    match kind {
        "Namespace" | "Pod" => Some("v1"),
        "NetworkPolicy" => Some("networking.k8s.io/v1"),
        "CiliumNetworkPolicy" | "CiliumClusterwideNetworkPolicy" => Some("cilium.io/v2"),
        _ => None,
    }
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
    use cellium_resources::ObjectKey;

    const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n";
    const NP_A: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a, namespace: shop}\nspec: {podSelector: {}}\n";
    const NP_B: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b, namespace: shop}\nspec: {podSelector: {}}\n";

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
        std::fs::write(dir.path().join("1-pol.yaml"), format!("{NP_A}---\n{NP_B}")).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        assert!(w.sync(&r).unwrap().is_empty());
        assert!(np(&r, "a") && np(&r, "b"));

        // An edit that drops b deletes it.
        std::fs::write(dir.path().join("1-pol.yaml"), NP_A).unwrap();
        assert!(w.sync(&r).unwrap().is_empty());
        assert!(np(&r, "a") && !np(&r, "b"));

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
    fn a_missing_directory_is_an_error() {
        let mut w = PolicyDir::new("/nonexistent/cellium-policies".into());
        let err = w.sync(&Resources::new()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read /nonexistent/cellium-policies"),
            "{err}"
        );
    }
}

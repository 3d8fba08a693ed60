//! The object store: one table per kind, one global resourceVersion, a bounded event
//! history and the open watches. Every write goes through here, from HTTP or direct calls.

mod list;
mod watch;

pub use list::Page;
use list::Snapshot;
use watch::{Event, Watcher};
pub use watch::{EventType, WatchMsg, WatchSpec};

use crate::defaults::{self, IpAllocator};
use crate::error::{Error, Result};
use crate::registry::{KINDS, Kind};
use crate::util;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Objects of one kind keyed by (namespace, name); cluster-scoped objects have an empty namespace.
pub type Table = BTreeMap<(String, String), Arc<Value>>;

/// The whole state behind one lock.
pub struct Store {
    rv: u64,
    tables: Vec<Table>,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Events after this resourceVersion are all in `history`; a watch from older gets 410.
    compacted: u64,
    watchers: Vec<Watcher>,
    next_id: u64,
    snapshots: HashMap<u64, Snapshot>,
    snapshot_order: VecDeque<u64>,
    ips: IpAllocator,
}

/// The namespace of an object (empty when cluster-scoped or unset).
pub fn namespace_of(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The name of an object (empty when unset).
pub fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn not_found(kind: &Kind, name: &str) -> Error {
    Error::NotFound {
        kind: kind.qualified(),
        name: name.to_string(),
    }
}

/// Whether two objects differ outside `metadata` and `status` (bumps `generation`).
fn spec_changed(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut m = v.as_object().cloned().unwrap_or_default();
        m.remove("metadata");
        m.remove("status");
        m
    };
    strip(a) != strip(b)
}

impl Store {
    /// An empty store with the default namespaces.
    pub fn new(history_limit: usize) -> Store {
        let mut store = Store {
            rv: 0,
            tables: vec![Table::new(); KINDS.len()],
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 0,
            watchers: Vec::new(),
            next_id: 0,
            snapshots: HashMap::new(),
            snapshot_order: VecDeque::new(),
            ips: IpAllocator::default(),
        };
        let ns = crate::registry::by_kind("v1", "Namespace").expect("namespaces are registered");
        for name in ["default", "kube-system", "kube-public"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            store.create(ns, None, obj, false).expect("fresh store");
        }
        // The kubernetes Service's address, so allocation never hands it out.
        store.ips.reserve("10.96.0.1");
        store
    }

    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// One object.
    pub fn get(&self, kind: usize, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.tables[kind]
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn key_for(
        &self,
        kind: usize,
        url_ns: Option<&str>,
        obj: &mut Value,
    ) -> Result<(String, String)> {
        let k = &KINDS[kind];
        let obj_ns = namespace_of(obj).to_string();
        let ns = if k.namespaced {
            let ns = match (url_ns, obj_ns.as_str()) {
                (Some(u), o) if !o.is_empty() && o != u => {
                    return Err(Error::BadRequest(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ));
                }
                (Some(u), _) => u.to_string(),
                (None, "") => "default".to_string(),
                (None, o) => o.to_string(),
            };
            obj["metadata"]["namespace"] = json!(ns);
            ns
        } else {
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("namespace");
            }
            String::new()
        };
        Ok((ns, name_of(obj).to_string()))
    }

    fn check_namespace(&self, kind: usize, ns: &str) -> Result<()> {
        if KINDS[kind].namespaced {
            let nsk = crate::registry::by_kind("v1", "Namespace").expect("registered");
            if self.get(nsk, "", ns).is_none() {
                return Err(Error::NotFound {
                    kind: "namespaces".into(),
                    name: ns.into(),
                });
            }
        }
        Ok(())
    }

    fn prepare(kind: usize, obj: &mut Value) -> Result<()> {
        let k = &KINDS[kind];
        if !obj.is_object() {
            return Err(Error::BadRequest("the object is not a JSON object".into()));
        }
        if let Some(kind_field) = obj.get("kind").and_then(Value::as_str)
            && kind_field != k.kind
        {
            return Err(Error::BadRequest(format!(
                "the kind {kind_field:?} does not match the resource {}",
                k.qualified()
            )));
        }
        obj["apiVersion"] = json!(k.api_version());
        obj["kind"] = json!(k.kind);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        Ok(())
    }

    /// Creates an object; `url_ns` is the namespace of the request path.
    pub fn create(
        &mut self,
        kind: usize,
        url_ns: Option<&str>,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>> {
        let k = &KINDS[kind];
        Self::prepare(kind, &mut obj)?;
        if name_of(&obj).is_empty() {
            let prefix = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(Error::Invalid(format!(
                    "{} is invalid: metadata.name: Required value: name or generateName is required",
                    k.kind
                )));
            }
            obj["metadata"]["name"] = json!(format!("{prefix}{}", util::random_suffix()));
        }
        let key = self.key_for(kind, url_ns, &mut obj)?;
        self.check_namespace(kind, &key.0)?;
        if self.tables[kind].contains_key(&key) {
            return Err(Error::AlreadyExists {
                kind: k.qualified(),
                name: key.1,
            });
        }
        if dry_run {
            return Ok(Arc::new(obj));
        }
        defaults::apply(k.kind, &mut obj, None, &mut self.ips);
        let meta = obj["metadata"].as_object_mut().expect("prepared");
        meta.insert("uid".into(), json!(util::new_uid()));
        meta.insert("creationTimestamp".into(), json!(util::now_rfc3339()));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let obj = Arc::new(obj);
        self.tables[kind].insert(key, obj.clone());
        self.emit(kind, EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Replaces an object (PUT); with `status_only` only its `status` changes, otherwise a
    /// kind with a status subresource keeps its stored status.
    pub fn update(
        &mut self,
        kind: usize,
        url_ns: Option<&str>,
        name: &str,
        mut obj: Value,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Arc<Value>> {
        let k = &KINDS[kind];
        Self::prepare(kind, &mut obj)?;
        if name_of(&obj).is_empty() {
            obj["metadata"]["name"] = json!(name);
        }
        if name_of(&obj) != name {
            return Err(Error::BadRequest(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&obj)
            )));
        }
        let key = self.key_for(kind, url_ns, &mut obj)?;
        let old = self.tables[kind]
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(k, name))?;
        if let Some(rv) = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            && !rv.is_empty()
            && Some(rv)
                != old
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
        {
            return Err(Error::Conflict {
                kind: k.qualified(),
                name: name.into(),
            });
        }
        let mut new = if status_only {
            let mut new = (*old).clone();
            match obj.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    new.as_object_mut()
                        .expect("stored objects are objects")
                        .remove("status");
                }
            }
            new
        } else {
            if k.status {
                let m = obj.as_object_mut().expect("prepared");
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            defaults::apply(k.kind, &mut obj, Some(&old), &mut self.ips);
            obj
        };
        // Server-owned metadata is never taken from the client.
        let old_meta = old["metadata"]
            .as_object()
            .expect("stored objects have metadata");
        for field in [
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
        ] {
            match old_meta.get(field) {
                Some(v) => new["metadata"][field] = v.clone(),
                None => {
                    new["metadata"]
                        .as_object_mut()
                        .expect("prepared")
                        .remove(field);
                }
            }
        }
        if new == *old {
            // A no-op write does not bump the resourceVersion, as on the real server.
            return Ok(old);
        }
        if spec_changed(&old, &new) {
            let generation = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        if dry_run {
            return Ok(Arc::new(new));
        }
        if k.kind == "Service" {
            for ip in defaults::cluster_ips(&old) {
                if !defaults::cluster_ips(&new).contains(&ip) {
                    self.ips.release(&ip);
                }
            }
        }
        self.rv += 1;
        new["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let new = Arc::new(new);
        self.tables[kind].insert(key, new.clone());
        self.emit(kind, EventType::Modified, new.clone(), Some(old));
        Ok(new)
    }

    /// Deletes an object and returns its last state; a namespace takes its objects with it.
    pub fn delete(
        &mut self,
        kind: usize,
        namespace: &str,
        name: &str,
        dry_run: bool,
    ) -> Result<Arc<Value>> {
        let k = &KINDS[kind];
        let key = (
            if k.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        );
        let old = self.tables[kind]
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(k, name))?;
        if dry_run {
            return Ok(old);
        }
        if k.kind == "Namespace" && k.group.is_empty() {
            for (other, _) in KINDS.iter().enumerate().filter(|(_, k)| k.namespaced) {
                let names: Vec<String> = self.tables[other]
                    .range((name.to_string(), String::new())..)
                    .take_while(|((ns, _), _)| ns == name)
                    .map(|((_, n), _)| n.clone())
                    .collect();
                for n in names {
                    self.delete(other, name, &n, false)?;
                }
            }
        }
        self.tables[kind].remove(&key);
        if k.kind == "Service" {
            for ip in defaults::cluster_ips(&old) {
                self.ips.release(&ip);
            }
        }
        self.rv += 1;
        let mut last = (*old).clone();
        last["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let last = Arc::new(last);
        self.emit(kind, EventType::Deleted, last.clone(), Some(old));
        Ok(last)
    }

    /// Every object of a kind (in one namespace, or all).
    pub fn objects(&self, kind: usize, namespace: Option<&str>) -> Vec<Arc<Value>> {
        match namespace {
            Some(ns) if KINDS[kind].namespaced => self.tables[kind]
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            _ => self.tables[kind].values().cloned().collect(),
        }
    }
}

/// Fixtures shared by the store's test modules.
#[cfg(test)]
mod tests_support {
    use serde_json::{Value, json};

    pub fn pod(name: &str, ns: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "spec": {"nodeName": "n1"}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::by_kind;
    use crate::store::tests_support::pod;

    #[test]
    fn create_needs_the_namespace_and_a_free_name() {
        let mut s = Store::new(100);
        let pods = by_kind("v1", "Pod").unwrap();
        assert!(matches!(
            s.create(pods, None, pod("a", "nope", "x"), false),
            Err(Error::NotFound { .. })
        ));
        s.create(pods, None, pod("a", "default", "x"), false)
            .unwrap();
        assert!(matches!(
            s.create(pods, None, pod("a", "default", "x"), false),
            Err(Error::AlreadyExists { .. })
        ));
    }

    #[test]
    fn update_conflicts_keeps_status_and_bumps_generation() {
        let mut s = Store::new(100);
        let pods = by_kind("v1", "Pod").unwrap();
        let created = s
            .create(pods, None, pod("a", "default", "x"), false)
            .unwrap();
        assert_eq!(created["status"]["phase"], "Pending");
        let mut stale = (*created).clone();
        stale["metadata"]["resourceVersion"] = json!("1");
        assert!(matches!(
            s.update(pods, None, "a", stale, false, false),
            Err(Error::Conflict { .. })
        ));
        let mut change = (*created).clone();
        change["spec"]["nodeName"] = json!("n2");
        change["status"] = json!({"phase": "Running"});
        let updated = s.update(pods, None, "a", change, false, false).unwrap();
        assert_eq!(updated["status"]["phase"], "Pending");
        assert_eq!(updated["metadata"]["generation"], 2);
        let st = s
            .update(
                pods,
                None,
                "a",
                json!({"status": {"phase": "Running"}, "spec": {"nodeName": "x"}}),
                true,
                false,
            )
            .unwrap();
        assert_eq!(st["status"]["phase"], "Running");
        assert_eq!(st["spec"]["nodeName"], "n2");
        let rv = s.rv();
        s.update(pods, None, "a", (*st).clone(), false, false)
            .unwrap();
        assert_eq!(s.rv(), rv, "a no-op update does not write");
    }

    #[test]
    fn deleting_a_namespace_deletes_its_objects() {
        let mut s = Store::new(100);
        let (pods, nss) = (
            by_kind("v1", "Pod").unwrap(),
            by_kind("v1", "Namespace").unwrap(),
        );
        s.create(nss, None, json!({"metadata": {"name": "t"}}), false)
            .unwrap();
        s.create(pods, None, pod("a", "t", "x"), false).unwrap();
        s.create(pods, None, pod("a", "default", "x"), false)
            .unwrap();
        s.delete(nss, "", "t", false).unwrap();
        assert!(s.get(pods, "t", "a").is_none());
        assert!(s.get(pods, "default", "a").is_some());
    }
}

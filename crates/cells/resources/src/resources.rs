//! The tables of the node's desired state, and applying YAML to them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use cellium_hive::{Hook, Lifecycle, Reporter};
use cellium_statedir::StateDir;

use crate::document::{self, Document, DocumentError};
use crate::error::{Error, Result};
use crate::key::{Object, ObjectKey};
use crate::kinds::{self, Parsed};
use crate::objects::{
    CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy, Namespace, NetworkPolicy, Pod,
    SYSTEM_NAMESPACES,
};
use crate::store::Store;
use crate::table::{Change, Table};
use crate::validate::FieldError;

/// What happened to one object of an apply or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// It is new.
    Created,
    /// It existed and was changed.
    Configured,
    /// It existed as given.
    Unchanged,
    /// It was deleted.
    Deleted,
    /// It was to be deleted but did not exist.
    NotFound,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Unchanged => "unchanged",
            Action::Deleted => "deleted",
            Action::NotFound => "not found",
        })
    }
}

/// One object's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Its kind.
    pub kind: &'static str,
    /// Its key.
    pub key: ObjectKey,
    /// What happened.
    pub action: Action,
}

/// The node's desired state: one table per kind.
#[derive(Debug)]
pub struct Resources {
    /// Namespaces (`default`, `kube-system` and `kube-public` always exist).
    pub namespaces: Table<Namespace>,
    /// Pods.
    pub pods: Table<Pod>,
    /// `networking.k8s.io/v1` NetworkPolicies.
    pub network_policies: Table<NetworkPolicy>,
    /// `cilium.io/v2` CiliumNetworkPolicies.
    pub cilium_network_policies: Table<CiliumNetworkPolicy>,
    /// `cilium.io/v2` CiliumClusterwideNetworkPolicies (keys without a namespace).
    pub cilium_clusterwide_network_policies: Table<CiliumClusterwideNetworkPolicy>,
    /// Applies and deletes run one at a time, so each is checked against the state it changes.
    writes: Mutex<()>,
    /// Where applied objects are recorded; `None` keeps them in memory only.
    store: Option<Store>,
}

impl Resources {
    /// Empty tables but for the system namespaces, in memory only.
    pub fn new() -> Arc<Resources> {
        Arc::new(Resources::empty(None))
    }

    /// The cell's constructor: applied objects are recorded in the state directory and
    /// applied again by the `restore-objects` start hook, before any cell that reads the
    /// tables starts.
    pub fn persistent(
        lc: Lifecycle,
        reporter: Reporter,
        state_dir: Arc<StateDir>,
    ) -> Arc<Resources> {
        let resources = Arc::new(Resources::empty(Some(Store(state_dir))));
        let this = resources.clone();
        lc.append(Hook::new("restore-objects").on_start(move |_| async move {
            reporter.ok(this.restore());
            Ok(())
        }));
        resources
    }

    fn empty(store: Option<Store>) -> Resources {
        let resources = Resources {
            namespaces: Table::default(),
            pods: Table::default(),
            network_policies: Table::default(),
            cilium_network_policies: Table::default(),
            cilium_clusterwide_network_policies: Table::default(),
            writes: Mutex::new(()),
            store,
        };
        for name in SYSTEM_NAMESPACES {
            if let Ok(ns) = Namespace::new(name, BTreeMap::new()) {
                resources.namespaces.upsert(ns);
            }
        }
        resources
    }

    /// Applies every recorded object again; a file that no longer applies (its kind
    /// unsupported by this version, say) is logged and left for a person to look at.
    fn restore(&self) -> String {
        let (mut restored, mut failed) = (0, 0);
        for (file, text) in self.store.as_ref().map(Store::load).unwrap_or_default() {
            match self.apply_recorded(&file, &text, false) {
                Ok(outcomes) => restored += outcomes.len(),
                Err(e) => {
                    failed += 1;
                    tracing::error!(file, error = %e, "a recorded object does not apply any more");
                }
            }
        }
        format!("{restored} objects restored, {failed} failed")
    }

    /// Creates or updates every object in `text` (multi-document YAML from `source`).
    ///
    /// All documents are decoded and checked first; if any fails, nothing is applied and
    /// every failure is returned. Documents are applied in order.
    pub fn apply(&self, source: &str, text: &str) -> Result<Vec<Outcome>> {
        self.apply_recorded(source, text, true)
    }

    fn apply_recorded(&self, source: &str, text: &str, record: bool) -> Result<Vec<Outcome>> {
        let _writing = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let docs = self.documents(source, text)?;
        let mut parsed = Vec::new();
        let mut errors = Vec::new();
        let mut new_namespaces = BTreeSet::new();
        for doc in &docs {
            match kinds::parse(doc).and_then(|p| self.check(&p, &new_namespaces).map(|_| p)) {
                Ok(p) => {
                    if let Parsed::Namespace(ns) = &p {
                        new_namespaces.insert(ns.name.clone());
                    }
                    parsed.push((p, &doc.value));
                }
                Err(e) => errors.push(doc_error(source, doc, e)),
            }
        }
        if !errors.is_empty() {
            return Err(Error::Invalid(errors));
        }
        let mut outcomes = Vec::new();
        for (p, value) in parsed {
            let outcome = self.write(p);
            if record && let Some(store) = &self.store {
                store.save(outcome.kind, &outcome.key, value);
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Deletes every object named in `text`. A namespace takes its pods and policies with it,
    /// as the namespace controller does; the system namespaces cannot be deleted.
    pub fn delete(&self, source: &str, text: &str) -> Result<Vec<Outcome>> {
        let _writing = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let docs = self.documents(source, text)?;
        let mut errors = Vec::new();
        let mut keys = Vec::new();
        for doc in &docs {
            match delete_key(doc) {
                Ok(key) => keys.push((doc.kind.clone(), key)),
                Err(e) => errors.push(doc_error(source, doc, e)),
            }
        }
        if !errors.is_empty() {
            return Err(Error::Invalid(errors));
        }
        Ok(keys
            .into_iter()
            .map(|(kind, key)| self.remove(&kind, key))
            .collect())
    }

    /// Deletes one object from its table and from the record.
    fn forget<T: Object>(&self, table: &Table<T>, key: &ObjectKey) -> bool {
        let found = table.delete(key).is_some();
        if found && let Some(store) = &self.store {
            store.remove(T::KIND, key);
        }
        found
    }

    fn documents(&self, source: &str, text: &str) -> Result<Vec<Document>> {
        let docs = document::split(source, text).map_err(|e| Error::Invalid(vec![e]))?;
        if docs.is_empty() {
            return Err(Error::Empty(source.to_string()));
        }
        Ok(docs)
    }

    /// Checks that depend on the state: a namespaced object's namespace must exist, as the API
    /// server requires.
    fn check(&self, parsed: &Parsed, new_namespaces: &BTreeSet<String>) -> Result<(), FieldError> {
        if let Some(namespace) = parsed.namespace() {
            let exists = new_namespaces.contains(namespace)
                || self
                    .namespaces
                    .get(&ObjectKey::cluster(namespace))
                    .is_some();
            if !exists {
                return Err(FieldError::new(
                    "metadata.namespace",
                    format!(
                        "namespace {namespace:?} not found (apply the Namespace first, or in the same file before this object)"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn write(&self, parsed: Parsed) -> Outcome {
        let (kind, key, change) = match parsed {
            Parsed::Namespace(ns) => (Namespace::KIND, ns.key(), self.namespaces.upsert(ns)),
            Parsed::Pod(pod) => (Pod::KIND, pod.key(), self.pods.upsert(pod)),
            Parsed::NetworkPolicy(p) => (
                NetworkPolicy::KIND,
                p.key(),
                self.network_policies.upsert(p),
            ),
            Parsed::CiliumNetworkPolicy(p) => (
                CiliumNetworkPolicy::KIND,
                p.key(),
                self.cilium_network_policies.upsert(p),
            ),
            Parsed::CiliumClusterwideNetworkPolicy(p) => (
                CiliumClusterwideNetworkPolicy::KIND,
                p.key(),
                self.cilium_clusterwide_network_policies.upsert(p),
            ),
        };
        let action = match change {
            Change::Created => Action::Created,
            Change::Configured => Action::Configured,
            Change::Unchanged => Action::Unchanged,
        };
        Outcome { kind, key, action }
    }

    fn remove(&self, kind: &str, key: ObjectKey) -> Outcome {
        let (kind, found) = match kind {
            "Namespace" => {
                for pod in self.pods.list_namespace(&key.name) {
                    self.forget(&self.pods, &pod.key());
                }
                for p in self.network_policies.list_namespace(&key.name) {
                    self.forget(&self.network_policies, &p.key());
                }
                for p in self.cilium_network_policies.list_namespace(&key.name) {
                    self.forget(&self.cilium_network_policies, &p.key());
                }
                (Namespace::KIND, self.forget(&self.namespaces, &key))
            }
            "NetworkPolicy" => (
                NetworkPolicy::KIND,
                self.forget(&self.network_policies, &key),
            ),
            "CiliumNetworkPolicy" => (
                CiliumNetworkPolicy::KIND,
                self.forget(&self.cilium_network_policies, &key),
            ),
            "CiliumClusterwideNetworkPolicy" => (
                CiliumClusterwideNetworkPolicy::KIND,
                self.forget(&self.cilium_clusterwide_network_policies, &key),
            ),
            _ => (Pod::KIND, self.forget(&self.pods, &key)),
        };
        let action = if found {
            Action::Deleted
        } else {
            Action::NotFound
        };
        Outcome { kind, key, action }
    }
}

fn delete_key(doc: &Document) -> Result<ObjectKey, FieldError> {
    kinds::check_kind(doc)?;
    let name = doc
        .name
        .clone()
        .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
    if !kinds::namespaced(doc) {
        if SYSTEM_NAMESPACES.contains(&name.as_str()) {
            return Err(FieldError::new(
                "metadata.name",
                format!("namespace {name:?} is a system namespace and may not be deleted"),
            ));
        }
        return Ok(ObjectKey::cluster(name));
    }
    let namespace = doc.namespace.clone().unwrap_or_else(|| "default".into());
    Ok(ObjectKey::namespaced(namespace, name))
}

fn doc_error(source: &str, doc: &Document, e: FieldError) -> DocumentError {
    DocumentError {
        source: source.to_string(),
        index: doc.index,
        object: Some(doc.describe()),
        field: e.field,
        reason: e.reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop, labels: { team: a } }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 80 } ] } ] }
"#;

    fn actions(outcomes: &[Outcome]) -> Vec<String> {
        outcomes
            .iter()
            .map(|o| format!("{} {} {}", o.kind, o.key, o.action))
            .collect()
    }

    #[test]
    fn apply_creates_then_reports_unchanged_and_configured() {
        let r = Resources::new();
        let out = r.apply("app.yaml", APP).unwrap();
        assert_eq!(
            actions(&out),
            vec!["Namespace shop created", "Pod shop/web created"]
        );
        let out = r.apply("app.yaml", APP).unwrap();
        assert_eq!(
            actions(&out),
            vec!["Namespace shop unchanged", "Pod shop/web unchanged"]
        );
        let out = r
            .apply("app.yaml", &APP.replace("team: a", "team: b"))
            .unwrap();
        assert_eq!(out[0].action, Action::Configured);
        let ns = r.namespaces.get(&ObjectKey::cluster("shop")).unwrap();
        assert_eq!(ns.labels["kubernetes.io/metadata.name"], "shop");
    }

    #[test]
    fn one_bad_document_applies_nothing_and_every_error_is_listed() {
        let r = Resources::new();
        let text = format!(
            "{APP}---\napiVersion: v1\nkind: Pod\nmetadata: {{ name: x, namespace: nowhere }}\nspec: {{ containers: [ {{ name: c }} ] }}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: s }}\n"
        );
        let err = r.apply("app.yaml", &text).unwrap_err().to_string();
        assert!(
            err.starts_with("2 invalid document(s), nothing applied"),
            "{err}"
        );
        assert!(err.contains("app.yaml: document 3 (Pod nowhere/x): metadata.namespace: namespace \"nowhere\" not found"), "{err}");
        assert!(
            err.contains("document 4 (Secret s): kind: unsupported kind v1/Secret"),
            "{err}"
        );
        assert!(r.pods.is_empty());
        assert!(r.namespaces.get(&ObjectKey::cluster("shop")).is_none());
    }

    #[test]
    fn deleting_a_namespace_takes_its_pods() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        let out = r
            .delete(
                "ns.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
            )
            .unwrap();
        assert_eq!(actions(&out), vec!["Namespace shop deleted"]);
        assert!(r.pods.is_empty());
        let out = r.delete("app.yaml", APP).unwrap();
        assert_eq!(
            actions(&out),
            vec!["Namespace shop not found", "Pod shop/web not found"]
        );
        let err = r
            .delete(
                "d.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: default}\n",
            )
            .unwrap_err();
        assert!(err.to_string().contains("may not be deleted"), "{err}");
    }

    const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  egress: [ { toEntities: [ world ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: no-telnet }
spec:
  endpointSelector: {}
  ingressDeny: [ { toPorts: [ { ports: [ { port: "23" } ] } ] } ]
"#;

    #[test]
    fn policies_apply_into_their_tables_and_delete() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        let out = r.apply("pol.yaml", POLICIES).unwrap();
        assert_eq!(
            actions(&out),
            vec![
                "NetworkPolicy shop/db created",
                "CiliumNetworkPolicy shop/web created",
                "CiliumClusterwideNetworkPolicy no-telnet created"
            ]
        );
        let np = r
            .network_policies
            .get(&ObjectKey::namespaced("shop", "db"))
            .unwrap();
        assert_eq!(np.policy_types, vec![crate::PolicyType::Ingress]);
        assert_eq!(r.cilium_clusterwide_network_policies.len(), 1);
        let out = r.delete("pol.yaml", POLICIES).unwrap();
        assert!(out.iter().all(|o| o.action == Action::Deleted), "{out:?}");
        assert!(r.network_policies.is_empty() && r.cilium_network_policies.is_empty());
        assert!(r.cilium_clusterwide_network_policies.is_empty());
    }

    #[test]
    fn a_policy_needs_its_namespace_and_goes_with_it() {
        let r = Resources::new();
        let err = r.apply("pol.yaml", POLICIES).unwrap_err().to_string();
        assert!(
            err.contains("pol.yaml: document 1 (NetworkPolicy shop/db): metadata.namespace: namespace \"shop\" not found"),
            "{err}"
        );
        assert!(
            r.cilium_clusterwide_network_policies.is_empty(),
            "all or nothing"
        );
        r.apply("app.yaml", APP).unwrap();
        r.apply("pol.yaml", POLICIES).unwrap();
        r.delete(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
        )
        .unwrap();
        assert!(r.network_policies.is_empty() && r.cilium_network_policies.is_empty());
        assert_eq!(r.cilium_clusterwide_network_policies.len(), 1);
    }

    #[test]
    fn policy_errors_name_document_field_and_reason() {
        let r = Resources::new();
        let text = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: l7}\nspec:\n  endpointSelector: {}\n  egress: [{toFQDNs: [{matchName: example.com}]}]\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]}\n";
        let err = r.apply("bad.yaml", text).unwrap_err().to_string();
        assert!(
            err.contains("bad.yaml: document 1 (CiliumNetworkPolicy l7): spec.egress[0].toFQDNs: not supported: DNS-based policy"),
            "{err}"
        );
        assert!(
            err.contains("bad.yaml: document 2 (NetworkPolicy np): spec.ingress[0].from[0].ipBlock.except[0]: 10.0.0.0/8 must be a strict subset"),
            "{err}"
        );
    }

    #[test]
    fn recorded_objects_come_back_after_a_restart_and_deleted_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let state = || Arc::new(StateDir::open_at(dir.path()).unwrap());
        let first_state = state();
        let first = Resources::empty(Some(Store(first_state.clone())));
        first.apply("app.yaml", APP).unwrap();
        let np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: deny, namespace: shop }\nspec: { podSelector: {} }\n";
        first.apply("np.yaml", np).unwrap();
        drop((first, first_state));

        let second_state = state();
        let second = Resources::empty(Some(Store(second_state.clone())));
        assert_eq!(second.restore(), "3 objects restored, 0 failed");
        assert!(
            second
                .pods
                .get(&ObjectKey::namespaced("shop", "web"))
                .is_some()
        );
        assert!(
            second
                .network_policies
                .get(&ObjectKey::namespaced("shop", "deny"))
                .is_some()
        );
        second
            .delete(
                "ns.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
            )
            .unwrap();
        drop((second, second_state));

        let third_state = state();
        let third = Resources::empty(Some(Store(third_state)));
        assert_eq!(third.restore(), "0 objects restored, 0 failed");
        assert!(third.pods.is_empty() && third.network_policies.is_empty());
    }

    #[test]
    fn empty_text_is_an_error() {
        let err = Resources::new().apply("e.yaml", "# nothing\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "e.yaml: no object found (empty text or only comments)"
        );
    }
}

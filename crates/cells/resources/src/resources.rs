//! The tables of the node's desired state, and applying YAML to them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use cellium_hive::{Config, Hook, Lifecycle, Reporter};
use cellium_statedir::StateDir;
use serde_yaml::Value;

use crate::config::ResourcesConfig;
use crate::document::{self, Document, DocumentError};
use crate::error::{Error, Result};
use crate::key::{Object, ObjectKey};
use crate::kinds::{self, Parsed};
use crate::objects::service::{RequestedIp, ServiceDraft};
use crate::objects::{
    CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy, ClusterIp, EndpointSlice, Namespace,
    NetworkPolicy, Pod, SYSTEM_NAMESPACES, Service,
};
use crate::service_ip::ServiceRange;
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
    /// `v1` Services, their cluster IPs decided (allocated from `service-cidr` when not
    /// given).
    pub services: Table<Service>,
    /// `discovery.k8s.io/v1` EndpointSlices.
    pub endpoint_slices: Table<EndpointSlice>,
    /// The range cluster IPs come from.
    service_range: ServiceRange,
    /// Applies and deletes run one at a time, so each is checked against the state it changes.
    writes: Mutex<()>,
    /// Where applied objects are recorded; `None` keeps them in memory only.
    store: Option<Store>,
}

impl Resources {
    /// Empty tables but for the system namespaces, in memory only, with the default
    /// `service-cidr`.
    pub fn new() -> Arc<Resources> {
        let range = ServiceRange::new(ResourcesConfig::default().service_cidr)
            .expect("the default service range is valid");
        Arc::new(Resources::empty(None, range))
    }

    /// Empty tables in memory only, with cluster IPs from `service_cidr`.
    pub fn with_service_cidr(service_cidr: ipnet::Ipv4Net) -> Result<Arc<Resources>> {
        let range = ServiceRange::new(service_cidr).map_err(Error::ServiceCidr)?;
        Ok(Arc::new(Resources::empty(None, range)))
    }

    /// The cell's constructor: applied objects are recorded in the state directory and
    /// applied again by the `restore-objects` start hook, before any cell that reads the
    /// tables starts. Fails when `service-cidr` is not a usable range.
    pub fn persistent(
        cfg: Config<ResourcesConfig>,
        lc: Lifecycle,
        reporter: Reporter,
        state_dir: Arc<StateDir>,
    ) -> Result<Arc<Resources>> {
        let range = ServiceRange::new(cfg.service_cidr).map_err(Error::ServiceCidr)?;
        let resources = Arc::new(Resources::empty(Some(Store(state_dir)), range));
        let this = resources.clone();
        lc.append(Hook::new("restore-objects").on_start(move |_| async move {
            reporter.ok(this.restore());
            Ok(())
        }));
        Ok(resources)
    }

    /// The range cluster IPs are allocated from.
    pub fn service_cidr(&self) -> ipnet::Ipv4Net {
        self.service_range.cidr()
    }

    fn empty(store: Option<Store>, service_range: ServiceRange) -> Resources {
        let resources = Resources {
            namespaces: Table::default(),
            pods: Table::default(),
            network_policies: Table::default(),
            cilium_network_policies: Table::default(),
            cilium_clusterwide_network_policies: Table::default(),
            services: Table::default(),
            endpoint_slices: Table::default(),
            service_range,
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
        let mut claims = BTreeMap::new();
        for doc in &docs {
            let mut value = doc.value.clone();
            let settled = kinds::parse(doc)
                .and_then(|p| self.check(&p, &new_namespaces).map(|_| p))
                .and_then(|mut p| {
                    if let Parsed::Service(draft) = &mut p {
                        self.settle_cluster_ip(draft, &mut value, &mut claims, !record)?;
                    }
                    Ok(p)
                });
            match settled {
                Ok(p) => {
                    if let Parsed::Namespace(ns) = &p {
                        new_namespaces.insert(ns.name.clone());
                    }
                    parsed.push((p, value));
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
                store.save(outcome.kind, &outcome.key, &value);
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

    /// Decides a service's cluster IP as the API server does: an update keeps the current
    /// one (a different one is refused: the field is immutable), a new service gets the one
    /// it names (which must be inside `service-cidr` and held by no other service) or one
    /// allocated from the range. The decision is written into the document, so the recorded
    /// object brings the same address back after a restart. `claims` holds the decisions for
    /// the file's earlier documents; `restoring` accepts a recorded address outside a range
    /// that has changed since, with a warning, rather than losing the service.
    fn settle_cluster_ip(
        &self,
        draft: &mut ServiceDraft,
        value: &mut Value,
        claims: &mut BTreeMap<ObjectKey, ClusterIp>,
        restoring: bool,
    ) -> Result<(), FieldError> {
        let key = draft.service.key();
        let current = claims
            .get(&key)
            .copied()
            .or_else(|| self.services.get(&key).map(|s| s.cluster_ip));
        let field = "spec.clusterIP";
        let decided = match (draft.requested, current) {
            (RequestedIp::Unset, Some(current)) => current,
            (RequestedIp::Headless, None | Some(ClusterIp::Headless)) => ClusterIp::Headless,
            (RequestedIp::Address(ip), Some(current)) if current == ClusterIp::Address(ip) => {
                current
            }
            (RequestedIp::Headless | RequestedIp::Address(_), Some(current)) => {
                return Err(FieldError::new(
                    field,
                    format!(
                        "field is immutable: the service has {current} (delete the service and create it again to change it)"
                    ),
                ));
            }
            (RequestedIp::Unset, None) => {
                let used = self.cluster_ips_in_use(&key, claims).into_keys().collect();
                let ip = self.service_range.allocate(&used).ok_or_else(|| {
                    FieldError::new(
                        field,
                        format!(
                            "no address left to allocate in the service range {}",
                            self.service_range.cidr()
                        ),
                    )
                })?;
                ClusterIp::Address(ip)
            }
            (RequestedIp::Address(ip), None) => {
                if !self.service_range.contains(ip) {
                    let range = self.service_range.cidr();
                    if !restoring {
                        return Err(FieldError::new(
                            field,
                            format!(
                                "{ip} is not in the service range {range} (service-cidr; its network and broadcast addresses excluded)"
                            ),
                        ));
                    }
                    tracing::warn!(service = %key, %ip, %range, "a recorded cluster IP is outside the service range; kept, as the API server keeps it");
                }
                if let Some(holder) = self.cluster_ips_in_use(&key, claims).get(&ip) {
                    return Err(FieldError::new(
                        field,
                        format!("{ip} is already allocated to service {holder}"),
                    ));
                }
                ClusterIp::Address(ip)
            }
        };
        draft.service.cluster_ip = decided;
        claims.insert(key, decided);
        record_cluster_ip(value, decided);
        Ok(())
    }

    /// The cluster IPs held by services other than `key`, with their holders: those in the
    /// table and those the file being applied claims.
    fn cluster_ips_in_use(
        &self,
        key: &ObjectKey,
        claims: &BTreeMap<ObjectKey, ClusterIp>,
    ) -> BTreeMap<std::net::Ipv4Addr, ObjectKey> {
        let mut used = BTreeMap::new();
        for svc in self.services.list() {
            if let ClusterIp::Address(ip) = svc.cluster_ip {
                used.insert(ip, svc.key());
            }
        }
        for (k, ip) in claims {
            if let ClusterIp::Address(ip) = ip {
                used.insert(*ip, k.clone());
            }
        }
        used.retain(|_, holder| holder != key);
        used
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
            Parsed::Service(d) => (
                Service::KIND,
                d.service.key(),
                self.services.upsert(d.service),
            ),
            Parsed::EndpointSlice(s) => {
                (EndpointSlice::KIND, s.key(), self.endpoint_slices.upsert(s))
            }
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
                for s in self.services.list_namespace(&key.name) {
                    self.forget(&self.services, &s.key());
                }
                for s in self.endpoint_slices.list_namespace(&key.name) {
                    self.forget(&self.endpoint_slices, &s.key());
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
            "Service" => (Service::KIND, self.forget(&self.services, &key)),
            "EndpointSlice" => (
                EndpointSlice::KIND,
                self.forget(&self.endpoint_slices, &key),
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

/// Writes a decided cluster IP into a service's document (`spec.clusterIP` and
/// `spec.clusterIPs`), as the API server stores it.
fn record_cluster_ip(value: &mut Value, ip: ClusterIp) {
    let Some(root) = value.as_mapping_mut() else {
        return;
    };
    let spec = root
        .entry("spec".into())
        .or_insert_with(|| Value::Mapping(Default::default()));
    if let Some(spec) = spec.as_mapping_mut() {
        let text = Value::String(ip.to_string());
        spec.insert("clusterIP".into(), text.clone());
        spec.insert("clusterIPs".into(), Value::Sequence(vec![text]));
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

    fn default_range() -> ServiceRange {
        ServiceRange::new(ResourcesConfig::default().service_cidr).unwrap()
    }

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
        let first = Resources::empty(Some(Store(first_state.clone())), default_range());
        first.apply("app.yaml", APP).unwrap();
        let np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: deny, namespace: shop }\nspec: { podSelector: {} }\n";
        first.apply("np.yaml", np).unwrap();
        drop((first, first_state));

        let second_state = state();
        let second = Resources::empty(Some(Store(second_state.clone())), default_range());
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
        let third = Resources::empty(Some(Store(third_state)), default_range());
        assert_eq!(third.restore(), "0 objects restored, 0 failed");
        assert!(third.pods.is_empty() && third.network_policies.is_empty());
    }

    const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: shop }
spec: { selector: { app: web }, ports: [ { name: http, port: 80, targetPort: http } ] }
---
apiVersion: v1
kind: Service
metadata: { name: dns, namespace: shop }
spec: { clusterIP: 10.96.0.10, ports: [ { name: dns, port: 53, protocol: UDP } ] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: dns-1, namespace: shop, labels: { kubernetes.io/service-name: dns } }
addressType: IPv4
endpoints: [ { addresses: [ 10.244.0.53 ] } ]
ports: [ { name: dns, port: 5353, protocol: UDP } ]
"#;

    fn vip(r: &Resources, name: &str) -> ClusterIp {
        r.services
            .get(&ObjectKey::namespaced("shop", name))
            .unwrap()
            .cluster_ip
    }

    fn service(name: &str, spec: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {spec}\n"
        )
    }

    #[test]
    fn services_get_cluster_ips_allocated_or_checked() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        let out = r.apply("svc.yaml", SERVICES).unwrap();
        assert_eq!(
            actions(&out),
            vec![
                "Service shop/web created",
                "Service shop/dns created",
                "EndpointSlice shop/dns-1 created"
            ]
        );
        // Allocated from the upper band of 10.96.0.0/12 (past the lower band's 256 addresses
        // 10.96.0.1 - 10.96.1.0), or given as asked.
        let web = vip(&r, "web");
        assert_eq!(web, ClusterIp::Address("10.96.1.1".parse().unwrap()));
        assert_eq!(
            vip(&r, "dns"),
            ClusterIp::Address("10.96.0.10".parse().unwrap())
        );
        // Applying the same file again changes nothing: the allocation is kept.
        let out = r.apply("svc.yaml", SERVICES).unwrap();
        assert!(out.iter().all(|o| o.action == Action::Unchanged), "{out:?}");
        assert_eq!(vip(&r, "web"), web);

        let taken = service("other", "{clusterIP: 10.96.0.10, ports: [{port: 80}]}");
        let err = r.apply("o.yaml", &taken).unwrap_err().to_string();
        assert!(
            err.contains("o.yaml: document 1 (Service shop/other): spec.clusterIP: 10.96.0.10 is already allocated to service shop/dns"),
            "{err}"
        );
        let outside = service("other", "{clusterIP: 10.200.0.1, ports: [{port: 80}]}");
        let err = r.apply("o.yaml", &outside).unwrap_err().to_string();
        assert!(
            err.contains("spec.clusterIP: 10.200.0.1 is not in the service range 10.96.0.0/12"),
            "{err}"
        );
        let network = service("other", "{clusterIP: 10.96.0.0, ports: [{port: 80}]}");
        assert!(r.apply("o.yaml", &network).is_err());
        assert!(
            r.services
                .get(&ObjectKey::namespaced("shop", "other"))
                .is_none()
        );
    }

    #[test]
    fn a_cluster_ip_is_immutable() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        r.apply("svc.yaml", SERVICES).unwrap();
        let moved = service(
            "dns",
            "{clusterIP: 10.96.0.11, ports: [{name: dns, port: 53, protocol: UDP}]}",
        );
        let err = r.apply("m.yaml", &moved).unwrap_err().to_string();
        assert!(
            err.contains("m.yaml: document 1 (Service shop/dns): spec.clusterIP: field is immutable: the service has 10.96.0.10"),
            "{err}"
        );
        let headless = service(
            "dns",
            "{clusterIP: None, ports: [{name: dns, port: 53, protocol: UDP}]}",
        );
        assert!(
            r.apply("m.yaml", &headless)
                .unwrap_err()
                .to_string()
                .contains("immutable")
        );
        // An update that leaves the address out keeps it, as the API server does.
        let update = service(
            "dns",
            "{ports: [{name: dns, port: 53, protocol: UDP}, {name: tcp, port: 53}]}",
        );
        let out = r.apply("u.yaml", &update).unwrap();
        assert_eq!(out[0].action, Action::Configured);
        assert_eq!(
            vip(&r, "dns"),
            ClusterIp::Address("10.96.0.10".parse().unwrap())
        );
        assert_eq!(
            r.services
                .get(&ObjectKey::namespaced("shop", "dns"))
                .unwrap()
                .ports
                .len(),
            2
        );
        // Once deleted, the address is free again, also for another service.
        r.delete("d.yaml", &update).unwrap();
        let other = service("other", "{clusterIP: 10.96.0.10, ports: [{port: 80}]}");
        r.apply("o.yaml", &other).unwrap();
    }

    #[test]
    fn one_file_cannot_claim_an_address_twice() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        let text = format!(
            "{}---\n{}---\n{}",
            service("a", "{ports: [{port: 80}]}"),
            service("b", "{clusterIP: 10.96.0.20, ports: [{port: 80}]}"),
            service("c", "{clusterIP: 10.96.0.20, ports: [{port: 80}]}")
        );
        let err = r.apply("f.yaml", &text).unwrap_err().to_string();
        assert!(
            err.contains("document 3 (Service shop/c): spec.clusterIP: 10.96.0.20 is already allocated to service shop/b"),
            "{err}"
        );
        assert!(r.services.is_empty(), "all or nothing");
        let text = format!(
            "{}---\n{}",
            service("a", "{ports: [{port: 80}]}"),
            service("b", "{ports: [{port: 80}]}")
        );
        r.apply("f.yaml", &text).unwrap();
        assert_ne!(vip(&r, "a"), vip(&r, "b"));
    }

    #[test]
    fn an_exhausted_range_is_an_error_naming_it() {
        let r = Resources::with_service_cidr("10.0.0.0/30".parse().unwrap()).unwrap();
        r.apply("app.yaml", APP).unwrap();
        let text = format!(
            "{}---\n{}---\n{}",
            service("a", "{ports: [{port: 80}]}"),
            service("b", "{ports: [{port: 80}]}"),
            service("c", "{ports: [{port: 80}]}")
        );
        let err = r.apply("f.yaml", &text).unwrap_err().to_string();
        assert!(
            err.contains("document 3 (Service shop/c): spec.clusterIP: no address left to allocate in the service range 10.0.0.0/30"),
            "{err}"
        );
        let err = Resources::with_service_cidr("10.0.0.0/8".parse().unwrap()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("service-cidr: 10.0.0.0/8 is not a usable service range"),
            "{err}"
        );
    }

    #[test]
    fn services_and_slices_go_with_their_namespace() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        r.apply("svc.yaml", SERVICES).unwrap();
        assert_eq!((r.services.len(), r.endpoint_slices.len()), (2, 1));
        r.delete(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
        )
        .unwrap();
        assert!(r.services.is_empty() && r.endpoint_slices.is_empty());
    }

    #[test]
    fn allocated_cluster_ips_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let state = || Arc::new(StateDir::open_at(dir.path()).unwrap());
        let first_state = state();
        let first = Resources::empty(Some(Store(first_state.clone())), default_range());
        first.apply("app.yaml", APP).unwrap();
        first.apply("svc.yaml", SERVICES).unwrap();
        let web = vip(&first, "web");
        drop((first, first_state));

        // The next agent allocates from the start of the range again: only the recorded
        // address keeps the service where it was.
        let second_state = state();
        let second = Resources::empty(Some(Store(second_state.clone())), default_range());
        assert_eq!(second.restore(), "5 objects restored, 0 failed");
        assert_eq!(vip(&second, "web"), web);
        let slice = second
            .endpoint_slices
            .get(&ObjectKey::namespaced("shop", "dns-1"))
            .unwrap();
        assert_eq!(slice.service.as_deref(), Some("dns"));
        second
            .apply("n.yaml", &service("next", "{ports: [{port: 80}]}"))
            .unwrap();
        assert_ne!(vip(&second, "next"), web);
        drop((second, second_state));

        // A range changed since keeps what was recorded rather than losing the service.
        let third_state = state();
        let narrow = ServiceRange::new("10.100.0.0/16".parse().unwrap()).unwrap();
        let third = Resources::empty(Some(Store(third_state)), narrow);
        assert_eq!(third.restore(), "6 objects restored, 0 failed");
        assert_eq!(vip(&third, "web"), web);
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

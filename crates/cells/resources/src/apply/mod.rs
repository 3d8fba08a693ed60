//! The apply path: a text decoded and checked on its own (no lock held), then, under the apply
//! lock, checked against the state it changes, recorded, and made.

pub(crate) mod cluster_ips;
pub(crate) mod node_ports;
pub(crate) mod policy_dir;
pub(crate) mod record;

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;
use tokio_util::sync::CancellationToken;

use crate::apply::record::{Record, Transaction, error_chain};
use crate::error::{Error, Result};
use crate::feed::API_KINDS;
use crate::resources::{Action, Outcome, Resources, State, Store};
use crate::writers::NAMESPACED;
use cellium_k8s_objects::document::{self, Document, DocumentError};
use cellium_k8s_objects::kinds::{self, Parsed};
use cellium_k8s_objects::validate::FieldError;
use cellium_k8s_objects::{Namespace, SYSTEM_NAMESPACES};
use cellium_k8s_objects::{Object, ObjectKey};

/// A document with its decoding: the object, or why it is invalid on its own.
pub(crate) type Prepared = Vec<(Document, Result<Parsed, FieldError>)>;

impl Resources {
    /// Checks `text` against the limits, splits it and decodes and checks every document on
    /// its own. Needs no lock; stops with [`Error::Cancelled`] between documents once `cancel`
    /// is cancelled.
    pub(crate) fn prepare(
        &self,
        source: &str,
        text: &str,
        cancel: &CancellationToken,
    ) -> Result<Prepared> {
        let docs = self.documents(source, text, cancel)?;
        let mut prepared = Vec::with_capacity(docs.len());
        for doc in docs {
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            let parsed = kinds::parse(&doc);
            prepared.push((doc, parsed));
        }
        Ok(prepared)
    }

    /// The keys a delete names, every document checked.
    pub(crate) fn delete_keys(
        &self,
        source: &str,
        text: &str,
        cancel: &CancellationToken,
    ) -> Result<Vec<(&'static str, ObjectKey)>> {
        let docs = self.documents(source, text, cancel)?;
        let mut errors = Vec::new();
        let mut keys = Vec::new();
        for doc in &docs {
            match delete_key(doc) {
                Ok(key) => keys.push(key),
                Err(e) => errors.push(doc_error(source, doc, e)),
            }
        }
        if !errors.is_empty() {
            return Err(Error::Invalid(errors));
        }
        Ok(keys)
    }

    fn documents(
        &self,
        source: &str,
        text: &str,
        cancel: &CancellationToken,
    ) -> Result<Vec<Document>> {
        self.limits.check(source, text, cancel)?;
        let docs = document::split(source, text).map_err(|e| Error::Invalid(vec![e]))?;
        if docs.is_empty() {
            return Err(Error::Empty(source.to_string()));
        }
        self.refuse_api_owned(source, &docs)?;
        Ok(docs)
    }

    /// In Kubernetes mode the API server owns every kind the tables hold: a change made here
    /// would be overwritten by the next watch event, or would quietly diverge from the cluster.
    fn refuse_api_owned(&self, source: &str, docs: &[Document]) -> Result<()> {
        let Some(server) = self.api_server() else {
            return Ok(());
        };
        let owned: Vec<String> = docs
            .iter()
            .filter(|d| {
                API_KINDS
                    .iter()
                    .any(|(v, k)| *v == d.api_version && *k == d.kind)
            })
            .map(Document::describe)
            .collect();
        if owned.is_empty() {
            return Ok(());
        }
        Err(Error::OwnedByApiServer {
            origin: source.to_string(),
            server,
            objects: owned,
        })
    }

    /// Checks the prepared documents against the state, records them, then writes them into
    /// the tables. Runs under the apply lock (`state`).
    pub(crate) fn commit_apply(
        &self,
        state: &mut State,
        source: &str,
        prepared: Prepared,
    ) -> Result<Vec<Outcome>> {
        let settled = self.settle(source, prepared, false)?;
        let files: Vec<String> = settled
            .iter()
            .map(|(parsed, _)| Record::file_name(parsed.kind(), &parsed.key()))
            .collect();
        let mut tx = Transaction::new(source);
        if let Store::Record(record) = &state.store {
            for ((_, value), file) in settled.iter().zip(&files) {
                // Serializing a value that was parsed from YAML cannot fail.
                let text = serde_yaml::to_string(value).unwrap_or_default();
                if !record.holds_text(file, &text) {
                    tx.put.insert(file.clone(), text);
                }
            }
        }
        state.commit(source, tx)?;
        for file in &files {
            // In force now, whether its record was rewritten or already said the same.
            state.stranded.remove(&Record::path_of(file));
        }
        let outcomes = settled
            .into_iter()
            .map(|(parsed, _)| state.writers.upsert(parsed))
            .collect();
        state.writers.publish();
        Ok(outcomes)
    }

    /// Loads one recorded object at start, as an apply of its document that is not recorded
    /// again; the reason when it does not load.
    pub(crate) fn load_record(
        &self,
        state: &mut State,
        file: &str,
        text: &str,
    ) -> Result<(), String> {
        let (kind, key) = Record::parse_file_name(file)
            .ok_or("not the name of a record (<Kind>~<namespace>~<name>.yaml)")?;
        let path = Record::path_of(file);
        let prepared = self
            .prepare(&path, text, &CancellationToken::new())
            .map_err(|e| e.to_string())?;
        if let [(doc, Ok(parsed))] = prepared.as_slice()
            && (parsed.kind(), parsed.key()) != (kind, key.clone())
        {
            return Err(format!(
                "holds {}, not the {kind} {key} its name says",
                doc.describe()
            ));
        }
        if prepared.len() != 1 {
            return Err(format!(
                "holds {} objects; a record holds one",
                prepared.len()
            ));
        }
        let settled = self
            .settle(&path, prepared, true)
            .map_err(|e| e.to_string())?;
        for (parsed, _) in settled {
            state.writers.upsert(parsed);
        }
        Ok(())
    }

    /// Checks every document against the state (namespaces exist, cluster IPs are free) and
    /// decides cluster IPs; returns each object with the document to record, or every error
    /// of the text (its own and the state's) in document order. `restoring` accepts a
    /// recorded cluster IP outside a range that has changed since.
    fn settle(
        &self,
        source: &str,
        prepared: Prepared,
        restoring: bool,
    ) -> Result<Vec<(Parsed, Value)>> {
        let mut settled = Vec::new();
        let mut errors = Vec::new();
        let mut new_namespaces = BTreeSet::new();
        let mut claims = BTreeMap::new();
        // Built once for the whole text: per document it would cost the square of the number
        // of services, under the apply lock.
        let mut used = self.cluster_ips_in_use();
        let mut node_ports = self.node_ports_in_use();
        for (doc, parsed) in prepared {
            let mut value = doc.value.clone();
            let checked = parsed
                .and_then(|p| self.check(&p, &new_namespaces).map(|_| p))
                .and_then(|mut p| {
                    if let Parsed::Service(draft) = &mut p {
                        self.settle_cluster_ips(
                            draft,
                            &mut value,
                            &mut claims,
                            &mut used,
                            restoring,
                        )?;
                        self.settle_node_ports(draft, &mut value, &mut node_ports, restoring)?;
                    }
                    Ok(p)
                });
            match checked {
                Ok(p) => {
                    if let Parsed::Namespace(ns) = &p {
                        new_namespaces.insert(ns.name.clone());
                    }
                    settled.push((p, value));
                }
                Err(e) => errors.push(doc_error(source, &doc, e)),
            }
        }
        if !errors.is_empty() {
            return Err(Error::Invalid(errors));
        }
        Ok(settled)
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
}

impl State {
    /// Records `tx` (nothing, in memory): when this fails, nothing changed.
    pub(crate) fn commit(&mut self, source: &str, tx: Transaction) -> Result<()> {
        let Store::Record(record) = &mut self.store else {
            return Ok(());
        };
        let files: Vec<String> = tx.put.keys().chain(&tx.remove).cloned().collect();
        if let Err(e) = record.commit(tx) {
            let e = Error::Record {
                origin: source.to_string(),
                source: e,
            };
            // Reported until a change is recorded again: the disk needs a person.
            self.record_error = Some(format!("last change refused: {}", error_chain(&e)));
            self.report();
            return Err(e);
        }
        self.record_error = None;
        for file in files {
            self.stranded.remove(&Record::path_of(&file));
        }
        Ok(())
    }

    /// Deletes the objects `keys` names (a namespace with its contents): records the removal
    /// of their files, then removes them from the tables.
    pub(crate) fn commit_delete(
        &mut self,
        source: &str,
        keys: Vec<(&'static str, ObjectKey)>,
    ) -> Result<Vec<Outcome>> {
        let mut targets = Vec::new();
        for (kind, key) in &keys {
            if *kind == Namespace::KIND {
                for member in NAMESPACED {
                    for k in self.writers.keys_in_namespace(member, &key.name) {
                        targets.push((member, k));
                    }
                }
            }
            targets.push((*kind, key.clone()));
        }
        let mut tx = Transaction::new(source);
        let mut recorded = BTreeSet::new();
        if let Store::Record(record) = &self.store {
            for (kind, key) in &keys {
                if *kind == Namespace::KIND {
                    // Records of the namespace that are not in force go with it too.
                    tx.remove.extend(record.files_in_namespace(&key.name));
                }
            }
            for (kind, key) in &targets {
                let file = Record::file_name(kind, key);
                if record.holds(&file) {
                    recorded.insert((*kind, key.clone()));
                    tx.remove.insert(file);
                }
            }
        }
        self.commit(source, tx)?;
        let mut found = BTreeSet::new();
        for (kind, key) in targets {
            if self.writers.delete(kind, &key) || recorded.contains(&(kind, key.clone())) {
                found.insert((kind, key));
            }
        }
        self.writers.publish();
        Ok(keys
            .into_iter()
            .map(|(kind, key)| {
                let action = if found.contains(&(kind, key.clone())) {
                    Action::Deleted
                } else {
                    Action::NotFound
                };
                Outcome { kind, key, action }
            })
            .collect())
    }
}

/// Writes a decided cluster IP into a service's document (`spec.clusterIP` and
/// `spec.clusterIPs`), as the API server stores it.
fn delete_key(doc: &Document) -> Result<(&'static str, ObjectKey), FieldError> {
    let kind = kinds::check_kind(doc)?;
    let name = doc
        .name
        .clone()
        .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
    if kind == Namespace::KIND && SYSTEM_NAMESPACES.contains(&name.as_str()) {
        return Err(FieldError::new(
            "metadata.name",
            format!("namespace {name:?} is a system namespace and may not be deleted"),
        ));
    }
    if !kinds::namespaced(doc) {
        return Ok((kind, ObjectKey::cluster(name)));
    }
    let namespace = doc.namespace.clone().unwrap_or_else(|| "default".into());
    Ok((kind, ObjectKey::namespaced(namespace, name)))
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
    use std::sync::Arc;

    use cellium_statedir::StateDir;

    use super::*;
    use crate::resources::tests::{APP, actions, default_range, persisted};
    use crate::service_ip::ServiceRanges;
    use cellium_k8s_objects::ClusterIp;

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
            err.contains(
                "spec.clusterIP: 10.200.0.1 is not in the service range of its family (10.96.0.0/12;"
            ),
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
        let r = Resources::with_service_cidr(&["10.0.0.0/30".parse().unwrap()]).unwrap();
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
        let err = Resources::with_service_cidr(&["10.0.0.0/8".parse().unwrap()]).unwrap_err();
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
        let first = persisted(&first_state, default_range());
        first.apply("app.yaml", APP).unwrap();
        first.apply("svc.yaml", SERVICES).unwrap();
        let web = vip(&first, "web");
        drop((first, first_state));

        // The next agent allocates from the start of the range again: only the recorded
        // address keeps the service where it was.
        let second_state = state();
        let second = persisted(&second_state, default_range());
        assert_eq!(second.restore(), (5, 0));
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
        let narrow = ServiceRanges::new(&["10.100.0.0/16".parse().unwrap()]).unwrap();
        let third = persisted(&third_state, narrow);
        assert_eq!(third.restore(), (6, 0));
        assert_eq!(vip(&third, "web"), web);
    }

    #[test]
    fn a_dual_stack_service_survives_a_restart_and_the_loss_of_its_second_range() {
        let dir = tempfile::tempdir().unwrap();
        let state = || Arc::new(StateDir::open_at(dir.path()).unwrap());
        let dual = || {
            ServiceRanges::new(&[
                "10.96.0.0/16".parse().unwrap(),
                "fd00:96::/108".parse().unwrap(),
            ])
            .unwrap()
        };
        let first_state = state();
        let first = persisted(&first_state, dual());
        first.apply("app.yaml", APP).unwrap();
        first
            .apply(
                "svc.yaml",
                "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ipFamilyPolicy: RequireDualStack, ports: [{port: 80}]}\n",
            )
            .unwrap();
        let key = ObjectKey::namespaced("shop", "web");
        let before = first.services.get(&key).unwrap();
        assert_eq!(before.cluster_ips.len(), 2);
        drop((first, first_state));

        for ranges in [dual(), default_range()] {
            let next_state = state();
            let next = persisted(&next_state, ranges);
            assert_eq!(next.restore(), (3, 0));
            let after = next.services.get(&key).unwrap();
            assert_eq!(after.cluster_ips, before.cluster_ips);
            assert_eq!(after.ip_families, before.ip_families);
            assert_eq!(after.ip_family_policy, before.ip_family_policy);
            drop((next, next_state));
        }
    }

    fn node_ports(r: &Resources, name: &str) -> (Vec<Option<u16>>, Option<u16>) {
        let svc = r
            .services
            .get(&ObjectKey::namespaced("shop", name))
            .unwrap();
        (
            svc.ports.iter().map(|p| p.node_port).collect(),
            svc.exposure.health_check_node_port,
        )
    }

    #[test]
    fn node_ports_are_allocated_or_checked_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let state = || Arc::new(StateDir::open_at(dir.path()).unwrap());
        let first_state = state();
        let first = persisted(&first_state, default_range());
        first.apply("app.yaml", APP).unwrap();
        let web = service(
            "web",
            "{type: LoadBalancer, externalTrafficPolicy: Local, ports: [{name: http, port: 80}, {name: given, port: 81, nodePort: 30081}]}",
        );
        first.apply("web.yaml", &web).unwrap();
        let (ports, health) = node_ports(&first, "web");
        assert_eq!(ports[1], Some(30081));
        let allocated = ports[0].unwrap();
        assert!((30000..=32767).contains(&allocated) && allocated != 30081);
        let health = health.unwrap();
        assert!((30000..=32767).contains(&health) && health != allocated);
        // Applying the same text again keeps them.
        first.apply("web.yaml", &web).unwrap();
        assert_eq!(node_ports(&first, "web"), (ports.clone(), Some(health)));

        // Taken by web, or out of range: refused naming the field, nothing changed.
        let taken = service(
            "db",
            &format!("{{type: NodePort, ports: [{{port: 5432, nodePort: {allocated}}}]}}"),
        );
        let err = first.apply("db.yaml", &taken).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "spec.ports[0].nodePort: {allocated}: provided port is already allocated (to service shop/web)"
            )),
            "{err}"
        );
        let outside = service(
            "db",
            "{type: NodePort, ports: [{port: 5432, nodePort: 8080}]}",
        );
        let err = first.apply("db.yaml", &outside).unwrap_err().to_string();
        assert!(
            err.contains("spec.ports[0].nodePort: 8080: provided port is not in the valid range; the range of valid ports is 30000-32767"),
            "{err}"
        );
        assert!(
            first
                .services
                .get(&ObjectKey::namespaced("shop", "db"))
                .is_none()
        );
        drop((first, first_state));

        // The next agent finds them recorded.
        let second_state = state();
        let second = persisted(&second_state, default_range());
        second.restore();
        assert_eq!(node_ports(&second, "web"), (ports, Some(health)));
    }

    #[test]
    fn node_ports_of_one_text_and_one_service_never_collide() {
        let r = Resources::new();
        r.apply("app.yaml", APP).unwrap();
        // Two services of one text, each with several ports, on a range of four ports.
        let mut r = Arc::try_unwrap(r).unwrap_or_else(|_| panic!("one owner"));
        r.node_port_range = crate::apply::node_ports::NodePortRange {
            first: 30000,
            last: 30003,
        };
        let text = [
            service(
                "a",
                "{type: NodePort, ports: [{name: x, port: 80}, {name: y, port: 81, nodePort: 30001}]}",
            ),
            "---\n".to_string(),
            service("b", "{type: NodePort, ports: [{name: x, port: 80}, {name: y, port: 81}]}"),
        ]
        .concat();
        r.apply("two.yaml", &text).unwrap();
        let mut all: Vec<u16> = ["a", "b"]
            .iter()
            .flat_map(|n| node_ports(&r, n).0.into_iter().flatten())
            .collect();
        assert_eq!(node_ports(&r, "a").0[1], Some(30001));
        all.sort_unstable();
        assert_eq!(all, [30000, 30001, 30002, 30003]);
        // The range is full: the next one names the field.
        let err = r
            .apply(
                "c.yaml",
                &service("c", "{type: NodePort, ports: [{port: 80}]}"),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "spec.ports[0].nodePort: no node port left in node-port-range 30000-30003"
            ),
            "{err}"
        );
        // Applying a again keeps its ports; giving b's to a is refused.
        r.apply("two.yaml", &text).unwrap();
        let b_port = node_ports(&r, "b").0[0].unwrap();
        let steal = service(
            "a",
            &format!(
                "{{type: NodePort, ports: [{{name: x, port: 80, nodePort: {b_port}}}, {{name: y, port: 81, nodePort: 30001}}]}}"
            ),
        );
        assert!(r.apply("a.yaml", &steal).is_err());
    }
}

//! Kubernetes mode: the API server's objects fed into the tables.
//!
//! In Kubernetes mode the API server owns every kind the tables hold. An [`ApiSource`] (the
//! `k8s-watchers` cell contributes one) lists and watches them and writes through a [`Feed`],
//! which holds the tables' writers as the apply path does in standalone mode; `cellium apply`
//! refuses those kinds, so each table keeps exactly one source of changes.
//!
//! The feed converts each object as apply does (the same slim types, the same checks) but
//! takes what the API server decided (a service's cluster IPs) as given. An object the agent
//! cannot put in force (a CiliumNetworkPolicy using a feature this version does not enforce,
//! say) is *rejected*: its previous version leaves the table, the module's health names it
//! (still OK: it is the object's problem, not the node's, and Degraded would stop every new pod
//! of the node through CNI STATUS), and, for the kinds policy depends on, the policy repository locks down the endpoints it
//! could have selected (`crate::gap`) until it is changed or deleted, as for a record that does
//! not load ([`Resources::policy_gaps`]): a policy that is not enforced must not leave pods open.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::decoded::{BuiltIn, Decoded, path_error};
use crate::listing::Listing;
use crate::resources::Resources;
use cellium_k8s_objects::cilium_decode::CiliumPolicyDoc;
use cellium_k8s_objects::document::decode;
use cellium_k8s_objects::gap;
use cellium_k8s_objects::kinds::Parsed;
use cellium_k8s_objects::service::{RequestedIp, ServiceDraft};
use cellium_k8s_objects::validate::FieldError;
use cellium_k8s_objects::{
    CiliumCidrGroup, CiliumClusterwideNetworkPolicy, CiliumEndpoint, CiliumIdentity,
    CiliumNetworkPolicy, CiliumNode, ClusterIp, EndpointSlice, IpFamily, IpFamilyPolicy, Namespace,
    NetworkPolicy, Node, Pod, Service,
};
use cellium_k8s_objects::{Object, ObjectKey};

/// The kinds the API server feeds, as `(apiVersion, kind)`.
pub const API_KINDS: [(&str, &str); 12] = [
    ("v1", Namespace::KIND),
    ("v1", Pod::KIND),
    ("v1", Node::KIND),
    ("v1", Service::KIND),
    ("discovery.k8s.io/v1", EndpointSlice::KIND),
    ("networking.k8s.io/v1", NetworkPolicy::KIND),
    ("cilium.io/v2", CiliumNetworkPolicy::KIND),
    ("cilium.io/v2", CiliumClusterwideNetworkPolicy::KIND),
    // The version Cilium 1.17 and 1.18 both serve.
    ("cilium.io/v2alpha1", CiliumCidrGroup::KIND),
    ("cilium.io/v2", CiliumNode::KIND),
    ("cilium.io/v2", CiliumIdentity::KIND),
    ("cilium.io/v2", CiliumEndpoint::KIND),
];

/// Where the tables' objects come from in Kubernetes mode.
///
/// The resources cell runs the source from its start hook and waits until every kind of
/// [`API_KINDS`] is synced before any cell that reads the tables starts: none of them acts on
/// half a list (an endpoint whose policies have not arrived yet would run open; a service
/// whose EndpointSlices have not would lose its backends).
pub trait ApiSource: Send + Sync + 'static {
    /// The API server, as logs and status name it; `None` when none is configured, and the
    /// agent runs standalone.
    fn server(&self) -> Option<String>;

    /// This node's name, as the API server knows it.
    fn node_name(&self) -> String;

    /// Lists and watches every kind of [`API_KINDS`] until `cancel` is cancelled, writing
    /// through `feed`: each object of a list pushed to a [`Feed::listing`] as it arrives,
    /// [`Feed::resync`] with it once the list is complete (the first, and every relist
    /// after an expired or dropped watch), [`Feed::apply`] and [`Feed::delete`] for watch
    /// events. Retries with backoff on its own; never returns before `cancel`.
    fn run(self: Arc<Self>, feed: Feed, cancel: CancellationToken) -> BoxFuture<'static, ()>;

    /// Reads one pod from the API server (a CNI ADD may come before the watch delivers it):
    /// the object, `None` when it does not exist, or why it could not be read.
    fn get_pod(
        self: Arc<Self>,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<Option<Value>, String>>;
}

impl fmt::Debug for dyn ApiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiSource")
            .field("server", &self.server())
            .finish()
    }
}

/// The writer side of the tables for an [`ApiSource`].
#[derive(Debug, Clone)]
pub struct Feed {
    resources: Arc<Resources>,
}

impl Feed {
    pub(crate) fn new(resources: Arc<Resources>) -> Feed {
        Feed { resources }
    }

    /// The tables, to read what the API server said so far.
    pub fn tables(&self) -> &Resources {
        &self.resources
    }

    /// Creates or updates the object `value` of `kind` (as the API server sent it), or rejects
    /// it when it cannot be put in force.
    pub fn apply(&self, kind: &str, value: Value) {
        let Some(key) = key_of(kind, &value) else {
            tracing::warn!(
                kind,
                "an object without a name from the API server; ignored"
            );
            return;
        };
        self.put(kind, key, from_api(kind, value));
    }

    /// [`apply`](Feed::apply) for an object of a built-in kind, decoded once.
    pub fn apply_decoded<K: BuiltIn>(&self, object: Decoded<K>) {
        let kind = object.kind();
        let Some(key) = object.key() else {
            tracing::warn!(
                kind,
                "an object without a name from the API server; ignored"
            );
            return;
        };
        self.put(kind, key, object.parse());
    }

    fn put(&self, kind: &str, key: ObjectKey, taken: Result<Taken, FieldError>) {
        let mut state = self.resources.lock();
        let id = (kind.to_string(), key);
        state.unknown.remove(&id);
        match taken {
            Ok(taken) => {
                state.rejected.remove(&id);
                note_unknown(&mut state.unknown, id, taken.unknown);
                state.writers.upsert(taken.parsed);
            }
            Err(e) => {
                state.writers.delete(kind, &id.1);
                reject(&mut state.rejected, kind, id.1, e);
            }
        }
        state.writers.publish();
        state.report();
    }

    /// Deletes the object of `kind` named in `value`.
    pub fn delete(&self, kind: &str, value: &Value) {
        if let Some(key) = key_of(kind, value) {
            self.remove(kind, key);
        }
    }

    /// [`delete`](Feed::delete) for an object of a built-in kind, decoded once.
    pub fn delete_decoded<K: BuiltIn>(&self, object: &Decoded<K>) {
        if let Some(key) = object.key() {
            self.remove(object.kind(), key);
        }
    }

    fn remove(&self, kind: &str, key: ObjectKey) {
        let mut state = self.resources.lock();
        state.rejected.remove(&(kind.to_string(), key.clone()));
        state.unknown.remove(&(kind.to_string(), key.clone()));
        state.writers.delete(kind, &key);
        state.writers.publish();
        state.report();
    }

    /// Replaces every object of the listing's kind with the listing, a complete list: objects
    /// missing from it are deleted (their Delete events go out, which a relist after an outage
    /// needs), its rejected objects replace the kind's rejections, the whole change is
    /// announced at once, and the table is marked synced.
    pub fn resync(&self, listing: Listing) {
        let (kind, items) = listing.into_parts();
        let kind = kind.as_str();
        let mut state = self.resources.lock();
        // Hashed, not ordered: a sync looks every object of the kind up here twice.
        let mut keep = HashSet::with_capacity(items.len());
        state.rejected.retain(|(k, _), _| k != kind);
        state.unknown.retain(|(k, _), _| k != kind);
        for (key, item) in items {
            match item {
                Ok(taken) => {
                    keep.insert(key.clone());
                    note_unknown(&mut state.unknown, (kind.to_string(), key), taken.unknown);
                    state.writers.upsert(taken.parsed);
                }
                Err(e) => reject(&mut state.rejected, kind, key, e),
            }
        }
        let gone: Vec<ObjectKey> = state
            .writers
            .keys(kind)
            .into_iter()
            .filter(|k| !keep.contains(k))
            .collect();
        for key in &gone {
            state.writers.delete(kind, key);
        }
        state.writers.publish();
        state.writers.mark_synced(kind);
        tracing::info!(
            kind,
            objects = keep.len(),
            deleted = gone.len(),
            "synced from the API server"
        );
        state.report();
    }
}

/// An object the tables take: its slim form, and the fields of it this version does not know
/// that are reported ([`crate::unknown`]).
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) parsed: Parsed,
    pub(crate) unknown: Vec<String>,
}

impl Taken {
    /// An object with nothing unknown to report.
    pub(crate) fn whole(parsed: Parsed) -> Taken {
        Taken {
            parsed,
            unknown: Vec::new(),
        }
    }
}

/// Records the unknown fields of an object in force (logged once as they arrive).
fn note_unknown(
    noted: &mut std::collections::BTreeMap<(String, ObjectKey), Vec<String>>,
    id: (String, ObjectKey),
    unknown: Vec<String>,
) {
    if unknown.is_empty() {
        return;
    }
    tracing::warn!(kind = id.0, object = %id.1, fields = ?unknown, "an object from the API server is in force without the fields this version does not know");
    noted.insert(id, unknown);
}

fn reject(
    rejected: &mut std::collections::BTreeMap<(String, ObjectKey), Rejection>,
    kind: &str,
    key: ObjectKey,
    e: FieldError,
) {
    let reason = if e.field.is_empty() {
        e.reason
    } else {
        format!("{}: {}", e.field, e.reason)
    };
    tracing::error!(kind, object = %key, %reason, "an object from the API server cannot be put in force");
    let scope = e.scope.unwrap_or_else(|| gap::scope_of_key(kind, &key));
    rejected.insert((kind.to_string(), key), Rejection { reason, scope });
}

/// Why an object from the API server is not in force, and what it could have restricted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) reason: String,
    pub(crate) scope: gap::GapScope,
}

/// The key of an object of `kind` as the API server sent it.
pub(crate) fn key_of(kind: &str, value: &Value) -> Option<ObjectKey> {
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    key_from(kind, name, meta.get("namespace").and_then(Value::as_str))
}

/// The key of an object of `kind` named `name` in `namespace`; `None` for an object of a
/// namespaced kind without a namespace.
pub(crate) fn key_from(kind: &str, name: &str, namespace: Option<&str>) -> Option<ObjectKey> {
    let clusterwide = matches!(
        kind,
        "Namespace"
            | "Node"
            | "CiliumClusterwideNetworkPolicy"
            | "CiliumCIDRGroup"
            | "CiliumNode"
            | "CiliumIdentity"
    );
    Some(if clusterwide {
        ObjectKey::cluster(name)
    } else {
        ObjectKey::namespaced(namespace?, name)
    })
}

/// Converts an object of `kind` from the API server. Built-in kinds are decoded as the API
/// server's clients do (fields this version does not know are skipped: the server validated
/// them); Cilium's policies strictly, since a field of Cilium's policy language this agent does
/// not know must not be silently dropped from what a policy means.
pub(crate) fn from_api(kind: &str, value: Value) -> Result<Taken, FieldError> {
    match kind {
        "NetworkPolicy" => {
            let (policy, unknown) = noting(kind, value)?;
            let parsed = NetworkPolicy::from_k8s(policy).map(Parsed::NetworkPolicy)?;
            Ok(Taken { parsed, unknown })
        }
        "EndpointSlice" => {
            let (slice, unknown) = noting(kind, value)?;
            let parsed = EndpointSlice::from_k8s(slice).map(Parsed::EndpointSlice)?;
            Ok(Taken { parsed, unknown })
        }
        "Service" => {
            let (service, unknown) = noting(kind, value)?;
            let mut draft = Service::from_k8s(service)?;
            as_decided(&mut draft)?;
            Ok(Taken {
                parsed: Parsed::Service(Box::new(draft)),
                unknown,
            })
        }
        _ => parse_api(kind, value).map(Taken::whole),
    }
}

/// Decodes a typed object of `kind`, its unknown fields judged ([`crate::unknown`]).
fn noting<T: serde::de::DeserializeOwned>(
    kind: &str,
    value: Value,
) -> Result<(T, Vec<String>), FieldError> {
    let (object, unknown) = cellium_k8s_objects::document::decode_noting(value)?;
    Ok((object, crate::unknown::judge(kind, unknown)?))
}

/// [`from_api`] for the kinds whose unknown fields are skipped, or checked by their decoder.
fn parse_api(kind: &str, mut value: Value) -> Result<Parsed, FieldError> {
    match kind {
        "Namespace" => Namespace::from_k8s(lenient(value)?).map(Parsed::Namespace),
        "Pod" => Pod::from_k8s(lenient(value)?).map(Parsed::Pod),
        "Node" => Node::from_k8s(lenient(value)?).map(Parsed::Node),
        "CiliumNode" => CiliumNode::from_api(&value).map(Parsed::CiliumNode),
        "CiliumIdentity" => CiliumIdentity::from_api(&value).map(Parsed::CiliumIdentity),
        "CiliumEndpoint" => CiliumEndpoint::from_api(&value).map(Parsed::CiliumEndpoint),
        "CiliumCIDRGroup" => {
            // Strictly, as the policies that name it: list items come without their type.
            if let Some(obj) = value.as_object_mut() {
                obj.insert("apiVersion".into(), "cilium.io/v2alpha1".into());
                obj.insert("kind".into(), kind.into());
            }
            let yaml = serde_yaml::to_value(&value)
                .map_err(|e| FieldError::new("", format!("not a valid object: {e}")))?;
            CiliumCidrGroup::from_doc(yaml).map(Parsed::CiliumCidrGroup)
        }
        "CiliumNetworkPolicy" | "CiliumClusterwideNetworkPolicy" => {
            // List items come without their type; the decoder wants it.
            if let Some(obj) = value.as_object_mut() {
                obj.insert("apiVersion".into(), "cilium.io/v2".into());
                obj.insert("kind".into(), kind.into());
            }
            let yaml = serde_yaml::to_value(&value)
                .map_err(|e| FieldError::new("", format!("not a valid object: {e}")))?;
            let clusterwide = kind == "CiliumClusterwideNetworkPolicy";
            let policy = decode::<CiliumPolicyDoc>(yaml)
                .and_then(|doc| doc.into_policy(clusterwide))
                .map_err(|e| {
                    // Read only now, for a policy that is not put in force: its lockdown covers
                    // what it selects, as far as that reads.
                    let namespace = value.pointer("/metadata/namespace").and_then(Value::as_str);
                    e.scoped(gap::cilium_scope(&value, namespace))
                })?;
            Ok(if clusterwide {
                Parsed::CiliumClusterwideNetworkPolicy(CiliumClusterwideNetworkPolicy(policy))
            } else {
                Parsed::CiliumNetworkPolicy(CiliumNetworkPolicy(policy))
            })
        }
        other => Err(FieldError::new(
            "kind",
            format!("{other} is not a kind the tables hold"),
        )),
    }
}

fn lenient<T: DeserializeOwned>(value: Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(path_error)
}

/// A service's addresses and families as the API server decided them.
pub(crate) fn as_decided(draft: &mut ServiceDraft) -> Result<(), FieldError> {
    let service = &mut draft.service;
    match &draft.requested {
        RequestedIp::Headless => {
            service.cluster_ip = ClusterIp::Headless;
            service.cluster_ips = Vec::new();
        }
        RequestedIp::Addresses(ips) => {
            service.cluster_ip = ClusterIp::Address(ips[0]);
            service.cluster_ips = ips.clone();
        }
        RequestedIp::Unset => {
            return Err(FieldError::new(
                "spec.clusterIP",
                "the API server assigned no cluster IP",
            ));
        }
    }
    service.ip_families = if draft.families.is_empty() {
        service
            .cluster_ips
            .iter()
            .map(|ip| IpFamily::of(*ip))
            .collect()
    } else {
        draft.families.clone()
    };
    service.ip_family_policy = draft.policy.unwrap_or(if service.cluster_ips.len() > 1 {
        IpFamilyPolicy::PreferDualStack
    } else {
        IpFamilyPolicy::SingleStack
    });
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cellium_k8s_objects::gap::GapScope;
    use serde_json::json;

    /// A complete list of `kind`, as a watcher fills it.
    pub(crate) fn list(feed: &Feed, kind: &str, values: Vec<Value>) -> Listing {
        let mut listing = feed.listing(kind);
        for value in values {
            listing.push(value);
        }
        listing
    }

    fn pod(name: &str, app: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "shop", "labels": {"app": app},
               "managedFields": [{"manager": "kubectl"}], "resourceVersion": "7"},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x",
                        "ports": [{"name": "http", "containerPort": 80}]}]},
               "status": {"phase": "Running", "someFutureField": 1}})
    }

    #[test]
    fn a_resync_deletes_what_vanished_and_marks_the_table_synced() {
        let r = Resources::new();
        let feed = Feed::new(r.clone());
        feed.resync(list(
            &feed,
            "Namespace",
            vec![json!({"metadata": {"name": "shop"}})],
        ));
        let mut events = r.pods.subscribe();
        feed.resync(list(&feed, "Pod", vec![pod("a", "web"), pod("b", "db")]));
        assert!(r.pods.is_synced());
        assert_eq!(r.pods.len(), 2);
        assert_eq!(
            r.pods
                .get(&ObjectKey::namespaced("shop", "a"))
                .unwrap()
                .ports[0]
                .name,
            "http"
        );
        feed.resync(list(&feed, "Pod", vec![pod("b", "db")]));
        let names: Vec<_> = r.pods.list().iter().map(|p| p.key()).collect();
        assert_eq!(names, vec![ObjectKey::namespaced("shop", "b")]);
        let mut deleted = Vec::new();
        while let Ok(e) = events.try_recv() {
            if let crate::Event::Delete(p) = e {
                deleted.push(p.name.clone());
            }
        }
        assert_eq!(deleted, vec!["a"]);
    }

    #[test]
    fn a_policy_that_cannot_be_enforced_is_rejected_and_locks_endpoints_down() {
        let r = Resources::new();
        let feed = Feed::new(r.clone());
        let good = json!({"metadata": {"name": "p", "namespace": "default"},
                          "spec": {"endpointSelector": {}, "ingress": [{"fromEndpoints": [{}]}]}});
        feed.apply("CiliumNetworkPolicy", good.clone());
        assert_eq!(r.cilium_network_policies.len(), 1);
        assert!(r.policy_gaps().borrow().is_empty());
        let unknown = json!({"metadata": {"name": "p", "namespace": "default"},
                             "spec": {"endpointSelector": {}, "egress": [{"toFQDNs": [{"matchName": "x.com"}]}]}});
        feed.apply("CiliumNetworkPolicy", unknown);
        assert_eq!(r.cilium_network_policies.len(), 0, "the old version left");
        let gaps = r.policy_gaps().borrow().clone();
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert!(
            gaps[0].text.contains("CiliumNetworkPolicy default/p"),
            "{gaps:?}"
        );
        // What it locks down is what it selects in its namespace, read from the object.
        assert!(
            matches!(&gaps[0].scope, GapScope::Selected { namespace: Some(ns), selectors }
                if ns == "default" && selectors.len() == 1),
            "{gaps:?}"
        );
        feed.delete("CiliumNetworkPolicy", &good);
        assert!(r.policy_gaps().borrow().is_empty());
    }

    #[test]
    fn fields_this_version_does_not_know_are_reported_or_refuse_a_policy() {
        let r = Resources::new();
        let feed = Feed::new(r.clone());
        let svc = json!({"metadata": {"name": "web", "namespace": "shop"},
                         "spec": {"clusterIP": "172.20.0.10", "clusterIPs": ["172.20.0.10"],
                                  "futureField": true,
                                  "ports": [{"port": 80, "protocol": "TCP", "futurePortField": 1}]}});
        feed.apply("Service", svc.clone());
        assert_eq!(r.services.len(), 1, "in force for what is known");
        let id = ("Service".to_string(), ObjectKey::namespaced("shop", "web"));
        assert_eq!(
            r.lock().unknown.get(&id),
            Some(&vec![
                "spec.futureField".to_string(),
                "spec.ports[0].futurePortField".to_string()
            ])
        );
        feed.delete("Service", &svc);
        assert!(r.lock().unknown.is_empty());

        let policy = json!({"metadata": {"name": "np", "namespace": "shop"},
                            "spec": {"podSelector": {}, "ingress": [{"futureAction": "Deny"}]}});
        feed.apply("NetworkPolicy", policy.clone());
        assert_eq!(r.network_policies.len(), 0, "not in force");
        let gaps = r.policy_gaps().borrow().clone();
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert!(
            gaps[0].text.contains("spec.ingress[0].futureAction"),
            "{gaps:?}"
        );
        assert_eq!(gaps[0].scope, GapScope::Namespace("shop".into()));
        feed.delete("NetworkPolicy", &policy);
        assert!(r.policy_gaps().borrow().is_empty());
    }

    #[test]
    fn services_keep_the_addresses_the_api_server_gave() {
        let svc = json!({"metadata": {"name": "web", "namespace": "default", "uid": "5d1c"},
                         "spec": {"clusterIP": "172.20.0.10", "clusterIPs": ["172.20.0.10"],
                                  "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}});
        let Parsed::Service(d) = from_api("Service", svc).unwrap().parsed else {
            panic!("not a service")
        };
        assert_eq!(d.service.vip(), Some("172.20.0.10".parse().unwrap()));
        assert_eq!(d.service.ip_families, vec![IpFamily::Ipv4]);
        // Its EndpointSlices name it by its uid.
        assert_eq!(d.service.uid.as_deref(), Some("5d1c"));
        let unset = json!({"metadata": {"name": "web", "namespace": "default"},
                           "spec": {"ports": [{"port": 80}]}});
        assert_eq!(
            from_api("Service", unset).unwrap_err().field,
            "spec.clusterIP"
        );
    }
}

//! The writes of a pass: list the node's CiliumEndpoints, then create, replace and delete
//! what the plan says, each object on its own so that one failure stops no other.

use std::collections::BTreeMap;
use std::fmt;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions, TypeMeta,
};
use serde_json::Value;

use super::NODE_LABEL;
use super::plan::{self, Key, Observed};
use crate::error::{Error, Result};
use crate::watchers::chain;

/// How many times one object is written when it keeps changing between read and write.
const WRITE_ATTEMPTS: usize = 3;

/// What a successful pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub(crate) in_line: usize,
    pub(crate) created: usize,
    pub(crate) updated: usize,
    pub(crate) deleted: usize,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} CiliumEndpoints in line (last pass: {} created, {} updated, {} deleted)",
            self.in_line + self.created + self.updated,
            self.created,
            self.updated,
            self.deleted
        )
    }
}

/// One pass: brings the CiliumEndpoints labelled [`NODE_LABEL`]`=<owner>` in line with
/// `desired` (from the node's endpoints, [`plan::desired`]). Every write is tried; the first
/// failure is returned with the count.
pub(crate) async fn reconcile(
    client: &kube::Client,
    owner: &str,
    desired: plan::Desired,
) -> Result<Done> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource());
    let listed = all
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={owner}")))
        .await
        .map_err(Error::ListEndpoints)?;
    let mut objects: BTreeMap<Key, DynamicObject> = BTreeMap::new();
    for obj in listed.items {
        if let (Some(ns), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) {
            objects.insert((ns.clone(), name.clone()), obj);
        }
    }
    let observed: BTreeMap<Key, Observed> = objects
        .iter()
        .map(|(key, obj)| {
            let seen = Observed {
                uid: obj.metadata.uid.clone(),
                status: obj.data.get("status").cloned().unwrap_or(Value::Null),
            };
            (key.clone(), seen)
        })
        .collect();
    let plan = plan::plan(&desired, &observed);
    let mut failed = Vec::new();
    for key in &plan.create {
        let write = Write::new(client, owner, key);
        if let Err(e) = write.put(&desired.write[key], None).await {
            failed.push(e);
        }
    }
    for key in &plan.update {
        let write = Write::new(client, owner, key);
        if let Err(e) = write.put(&desired.write[key], objects.remove(key)).await {
            failed.push(e);
        }
    }
    for (key, uid) in &plan.delete {
        if let Err(e) = Write::new(client, owner, key).delete(uid.clone()).await {
            failed.push(e);
        }
    }
    let writes = plan.writes();
    for e in &failed {
        tracing::warn!(error = %chain(e), "CiliumEndpoint write failed");
    }
    if failed.is_empty() {
        return Ok(Done {
            in_line: plan.in_line,
            created: plan.create.len(),
            updated: plan.update.len(),
            deleted: plan.delete.len(),
        });
    }
    Err(Error::EndpointWrites {
        failed: failed.len(),
        writes,
        first: Box::new(failed.swap_remove(0)),
    })
}

/// The writes of one CiliumEndpoint.
pub(crate) struct Write<'a> {
    api: Api<DynamicObject>,
    /// The value of its [`NODE_LABEL`].
    owner: &'a str,
    key: &'a Key,
}

impl<'a> Write<'a> {
    pub(crate) fn new(client: &kube::Client, owner: &'a str, key: &'a Key) -> Write<'a> {
        Write {
            api: Api::namespaced_with(client.clone(), &key.0, &resource()),
            owner,
            key,
        }
    }

    /// Creates the object with `status`, or replaces `current` (as listed) with it.
    pub(crate) async fn put(
        &self,
        status: &Value,
        mut current: Option<DynamicObject>,
    ) -> Result<()> {
        for _ in 0..WRITE_ATTEMPTS {
            let creating = current.is_none();
            let obj = self.object(status, current.take());
            let params = PostParams::default();
            let written = if creating {
                self.api.create(&params, &obj).await
            } else {
                self.api.replace(&self.key.1, &params, &obj).await
            };
            match written {
                Ok(_) => return Ok(()),
                // AlreadyExists: written since the list, or by someone else without this
                // node's label (a pod of that name that ran elsewhere before): the pod's
                // endpoint is here now, so the object is taken over. Conflict: changed
                // since it was read. Either way, read it again and replace that.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    current = (self.api.get_opt(&self.key.1).await)
                        .map_err(|source| self.error("read", source))?;
                }
                Err(source) => {
                    return Err(self.error(if creating { "create" } else { "update" }, source));
                }
            }
        }
        Err(Error::EndpointConflicts {
            namespace: self.key.0.clone(),
            name: self.key.1.clone(),
            attempts: WRITE_ATTEMPTS,
        })
    }

    /// Deletes the object if it still has `uid` (the one it was listed with): one written
    /// since then, for a new pod of the same name, is the next pass's to judge.
    pub(crate) async fn delete(&self, uid: Option<String>) -> Result<()> {
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&self.key.1, &params).await {
            Ok(_) => Ok(()),
            // Gone already, or replaced since the list (the precondition failed).
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(source) => Err(self.error("delete", source)),
        }
    }

    /// The object to write: `current` (keeping its metadata, resourceVersion included, so a
    /// replace of a changed object fails with a conflict) or a new one, with this node's
    /// label and `status`.
    fn object(&self, status: &Value, current: Option<DynamicObject>) -> DynamicObject {
        let mut obj = current
            .unwrap_or_else(|| DynamicObject::new(&self.key.1, &resource()).within(&self.key.0));
        // The items of a list carry no apiVersion and kind, and a PUT without them is
        // refused by a real API server.
        obj.types = Some(TypeMeta {
            api_version: "cilium.io/v2".into(),
            kind: "CiliumEndpoint".into(),
        });
        obj.metadata.managed_fields = None;
        obj.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(NODE_LABEL.to_string(), self.owner.to_string());
        obj.data["status"] = status.clone();
        obj
    }

    fn error(&self, verb: &'static str, source: kube::Error) -> Error {
        Error::WriteEndpoint {
            verb,
            namespace: self.key.0.clone(),
            name: self.key.1.clone(),
            source: Box::new(source),
        }
    }
}

/// `cilium.io/v2` CiliumEndpoints.
pub(crate) fn resource() -> ApiResource {
    ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumEndpoint".into(),
        plural: "ciliumendpoints".into(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::IpAddr;

    use cellium_test_apiserver::ApiServer;
    use serde_json::json;

    use super::*;
    use crate::endpoints::plan::tests::ep;

    /// A test API server with namespace `shop`, and a client of it.
    pub(crate) fn server() -> (ApiServer, kube::Client) {
        let (server, client, _) = server_at();
        (server, client)
    }

    /// The same, and its URL.
    pub(crate) fn server_at() -> (ApiServer, kube::Client, String) {
        let server = ApiServer::new();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        server.serve(listener).unwrap();
        server
            .apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n")
            .unwrap();
        let config = kube::Config::new(url.parse().unwrap());
        (server, kube::Client::try_from(config).unwrap(), url)
    }

    pub(crate) fn cep(server: &ApiServer, name: &str) -> Option<Value> {
        server.get("cilium.io/v2", "CiliumEndpoint", Some("shop"), name)
    }

    pub(crate) fn put(server: &ApiServer, name: &str, node: Option<&str>, status: Value) {
        let labels = node.map_or(json!({}), |n| json!({ NODE_LABEL: n }));
        server
            .create(json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumEndpoint",
                "metadata": {"name": name, "namespace": "shop", "labels": labels},
                "status": status,
            }))
            .unwrap();
    }

    #[tokio::test]
    async fn a_pass_writes_the_nodes_objects_and_only_those() {
        let (server, client) = server();
        let node_ip: IpAddr = "192.168.5.1".parse().unwrap();
        let eps = [
            ep(1, Some(("shop", "web")), &["10.0.0.1"]),
            ep(2, Some(("shop", "moved")), &["10.0.0.2"]),
            ep(3, Some(("shop", "taken")), &["10.0.0.3"]),
        ];
        // Left by this node's agent before a restart, for pods that have gone since.
        put(&server, "stale", Some("n1"), json!({"id": 9}));
        // Of the pod that moved: its old status.
        put(
            &server,
            "moved",
            Some("n1"),
            json!({"id": 2, "state": "ready"}),
        );
        // Another node's object, and one of this pod's name that nobody labelled (written
        // for a pod of that name elsewhere, say).
        put(&server, "elsewhere", Some("n2"), json!({"id": 7}));
        put(&server, "taken", None, json!({"id": 70}));

        let done = reconcile(
            &client,
            "n1",
            plan::desired(&eps, Some(node_ip), &|_| Vec::new()),
        )
        .await
        .unwrap();
        assert_eq!(
            done,
            Done {
                in_line: 0,
                created: 2,
                updated: 1,
                deleted: 1
            }
        );
        assert!(cep(&server, "stale").is_none());
        assert_eq!(cep(&server, "elsewhere").unwrap()["status"]["id"], 7);
        for (name, e) in [("web", &eps[0]), ("moved", &eps[1]), ("taken", &eps[2])] {
            let obj = cep(&server, name).unwrap();
            assert_eq!(obj["metadata"]["labels"][NODE_LABEL], "n1", "{name}");
            let want = serde_json::to_value(plan::status(e, Some(node_ip), &[])).unwrap();
            assert_eq!(obj["status"], want, "{name}");
        }
        assert_eq!(
            cep(&server, "web").unwrap()["status"]["networking"]["node"],
            "192.168.5.1"
        );

        // In line: one LIST, no write.
        let before = server.requests();
        let done = reconcile(
            &client,
            "n1",
            plan::desired(&eps, Some(node_ip), &|_| Vec::new()),
        )
        .await
        .unwrap();
        assert_eq!((done.in_line, done.created + done.updated), (3, 0));
        assert_eq!(server.requests() - before, 1);

        // Deleted by someone else: written again. Its pod's endpoint gone: deleted.
        server
            .delete("cilium.io/v2", "CiliumEndpoint", Some("shop"), "web")
            .unwrap();
        let done = reconcile(
            &client,
            "n1",
            plan::desired(&eps[..2], Some(node_ip), &|_| Vec::new()),
        )
        .await
        .unwrap();
        assert_eq!((done.created, done.deleted), (1, 1));
        assert!(cep(&server, "web").is_some() && cep(&server, "taken").is_none());
    }

    #[tokio::test]
    async fn failures_are_counted_and_the_other_writes_made() {
        let (server, client) = server();
        let eps = [
            ep(1, Some(("shop", "web")), &["10.0.0.1"]),
            ep(2, Some(("no-such-ns", "db")), &["10.0.0.2"]),
        ];
        let err = reconcile(&client, "n1", plan::desired(&eps, None, &|_| Vec::new()))
            .await
            .unwrap_err();
        let msg = chain(&err);
        assert!(
            msg.starts_with(
                "1 of 2 CiliumEndpoint writes failed, the first: cannot create CiliumEndpoint no-such-ns/db"
            ),
            "{msg}"
        );
        assert!(cep(&server, "web").is_some(), "the other write was made");

        // A 500 (kube's client retries 429, 503 and 504 itself): the pass fails at its list.
        server.fail_requests(1, 500);
        let err = reconcile(
            &client,
            "n1",
            plan::desired(&eps[..1], None, &|_| Vec::new()),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::ListEndpoints(_)), "{}", chain(&err));
        reconcile(
            &client,
            "n1",
            plan::desired(&eps[..1], None, &|_| Vec::new()),
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_listed_object_is_written_back_whole_with_its_kind_and_this_nodes_label() {
        let (_server, client) = server();
        let key = ("shop".to_string(), "web".to_string());
        let write = Write::new(&client, "n1", &key);
        // As a list's item: no apiVersion nor kind, someone's label, a resourceVersion.
        let mut listed = DynamicObject::new("web", &resource()).within("shop");
        listed.types = None;
        listed.metadata.resource_version = Some("42".into());
        listed.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        listed.data = json!({"status": {"id": 1}});
        let obj = write.object(&json!({"id": 2}), Some(listed));
        let types = obj.types.as_ref().unwrap();
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("cilium.io/v2", "CiliumEndpoint")
        );
        assert_eq!(obj.metadata.resource_version.as_deref(), Some("42"));
        let labels = obj.metadata.labels.as_ref().unwrap();
        assert_eq!(
            (labels["team"].as_str(), labels[NODE_LABEL].as_str()),
            ("a", "n1")
        );
        assert_eq!(obj.data["status"], json!({"id": 2}));
    }

    #[tokio::test]
    async fn a_write_that_conflicts_reads_the_object_again() {
        let (server, client) = server();
        let key = ("shop".to_string(), "web".to_string());
        let write = Write::new(&client, "n1", &key);
        write.put(&json!({"id": 1}), None).await.unwrap();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "shop", &resource());
        let listed = api.get("web").await.unwrap();
        // Changed by someone else after it was read: the replace of the stale copy gets a
        // 409, and the write is made on the object as it is now.
        let mut theirs = listed.clone();
        theirs.data["status"] = json!({"id": 50});
        api.replace("web", &PostParams::default(), &theirs)
            .await
            .unwrap();
        write.put(&json!({"id": 2}), Some(listed)).await.unwrap();
        assert_eq!(cep(&server, "web").unwrap()["status"], json!({"id": 2}));

        // Deleted since it was listed: the delete by the listed uid is a no-op, and so is
        // one whose object was replaced by a new one (another uid).
        let uid = cep(&server, "web").unwrap()["metadata"]["uid"]
            .as_str()
            .map(String::from);
        server
            .delete("cilium.io/v2", "CiliumEndpoint", Some("shop"), "web")
            .unwrap();
        write.delete(uid.clone()).await.unwrap();
        write.put(&json!({"id": 3}), None).await.unwrap();
        write.delete(uid).await.unwrap();
        assert_eq!(
            cep(&server, "web").unwrap()["status"]["id"],
            3,
            "a new object of the name is not deleted by the old uid"
        );
    }
}

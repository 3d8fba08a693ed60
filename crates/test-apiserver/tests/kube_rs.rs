//! kube-rs 5.0 against the test API server: CRUD, patches, pagination and the runtime
//! watcher through expiry, dropped connections and selectors.

use cellium_test_apiserver::ApiServer;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;

async fn start() -> (ApiServer, Client) {
    let server = ApiServer::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    server.serve(listener).unwrap();
    let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    (server, client)
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx:1", "ports": [{"containerPort": 80}]}]}
    }))
    .unwrap()
}

fn direct_pod(name: &str, node: &str) -> serde_json::Value {
    let mut p = serde_json::to_value(pod(name, node)).unwrap();
    p["metadata"]["namespace"] = json!("default");
    p
}

/// The next watcher event that is not an error (errors are retried by the next poll),
/// as a short string: "Init", "InitApply p1", "InitDone", "Apply p2", "Delete p2".
async fn next<S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin>(
    stream: &mut S,
) -> String {
    loop {
        let item = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a watcher event within 10 s")
            .expect("the watcher stream does not end");
        match item {
            Ok(Event::Init) => return "Init".into(),
            Ok(Event::InitApply(p)) => return format!("InitApply {}", p.name_any()),
            Ok(Event::InitDone) => return "InitDone".into(),
            Ok(Event::Apply(p)) => return format!("Apply {}", p.name_any()),
            Ok(Event::Delete(p)) => return format!("Delete {}", p.name_any()),
            Err(_) => continue,
        }
    }
}

#[tokio::test]
async fn list_pages_carry_the_list_resource_version() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for i in 0..5 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), "n1"))
            .await
            .unwrap();
    }
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut versions = Vec::new();
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = pods.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 2);
        names.extend(page.items.iter().map(|p| p.name_any()));
        versions.push(
            page.metadata
                .resource_version
                .clone()
                .expect("every page has a resourceVersion"),
        );
        if pages == 1 {
            // Written between pages: not part of this list.
            server.create(direct_pod("p9", "n1")).unwrap();
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    assert!(versions.iter().all(|v| *v == versions[0]));
    // A label selector and all namespaces.
    let all: Api<Pod> = Api::all(pods.into_client());
    assert_eq!(
        all.list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .len(),
        6
    );
    assert_eq!(
        all.list(&ListParams::default().labels("app!=web"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
}

#[tokio::test]
async fn crud_conflicts_and_patches() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("web", "n1"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    let err = pods
        .create(&PostParams::default(), &pod("web", "n1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_already_exists()),
        "{err}"
    );
    let err = pods.get("nope").await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_not_found() && s.code == 404),
        "{err}"
    );
    let missing_ns: Api<Pod> = Api::namespaced(client.clone(), "nope");
    let err = missing_ns
        .create(&PostParams::default(), &pod("web", "n1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_not_found()),
        "{err}"
    );

    // Replace: the fresh version wins, the stale one conflicts.
    let mut fresh = created.clone();
    fresh.labels_mut().insert("v".into(), "2".into());
    let replaced = pods
        .replace("web", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(replaced.labels()["v"], "2");
    let err = pods
        .replace("web", &PostParams::default(), &created)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_conflict() && s.code == 409),
        "{err}"
    );

    let pp = PatchParams::default();
    let merged = pods
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"m": "1", "v": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels().get("m").map(String::as_str), Some("1"));
    assert!(!merged.labels().contains_key("v"));

    // Strategic: the container named c is merged, not replaced, and a new one appended.
    let patch = json!({"spec": {"containers": [{"name": "c", "image": "nginx:2"}, {"name": "d", "image": "busybox"}]}});
    let strategic = pods
        .patch("web", &pp, &Patch::Strategic(patch))
        .await
        .unwrap();
    let containers = strategic.spec.as_ref().unwrap().containers.clone();
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0].image.as_deref(), Some("nginx:2"));
    assert_eq!(
        containers[0].ports.as_ref().unwrap()[0].protocol.as_deref(),
        Some("TCP")
    );

    // Server-side apply creates, then merges.
    let ssa = PatchParams::apply("test").force();
    let applied = pods
        .patch("ssa", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ssa"}, "spec": {"containers": [{"name": "c", "image": "a"}]}})))
        .await
        .unwrap();
    assert_eq!(applied.name_any(), "ssa");
    let applied = pods
        .patch("ssa", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ssa", "labels": {"x": "y"}}})))
        .await
        .unwrap();
    assert_eq!(applied.labels()["x"], "y");
    assert_eq!(
        applied.spec.unwrap().containers[0].image.as_deref(),
        Some("a")
    );

    // Status subresource: patch_status changes only status, a main patch keeps status.
    let st = pods
        .patch_status("web", &pp, &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.0.0.5"}, "metadata": {"labels": {"ignored": "yes"}}})))
        .await
        .unwrap();
    assert_eq!(
        st.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.0.0.5")
    );
    assert!(!st.labels().contains_key("ignored"));
    let main = pods
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(main.status.unwrap().phase.as_deref(), Some("Running"));

    // Preconditions: a wrong uid conflicts, the right one deletes.
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let err = pods.delete("web", &wrong).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_conflict()),
        "{err}"
    );
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let deleted = pods.delete("web", &right).await.unwrap();
    assert!(deleted.left().is_some_and(|p| p.name_any() == "web"));
    assert!(server.get("v1", "Pod", Some("default"), "web").is_none());
    assert!(server.requests() > 10);
}

#[tokio::test]
async fn watcher_follows_expiry_drops_and_selectors() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    server.create(direct_pod("p1", "n1")).unwrap();
    let mut stream = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    assert_eq!(next(&mut stream).await, "Init");
    assert_eq!(next(&mut stream).await, "InitApply p1");
    assert_eq!(next(&mut stream).await, "InitDone");
    pods.create(&PostParams::default(), &pod("p2", "n1"))
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await, "Apply p2");
    pods.delete("p2", &DeleteParams::default()).await.unwrap();
    assert_eq!(next(&mut stream).await, "Delete p2");
    server.create(direct_pod("p3", "n2")).unwrap();
    assert_eq!(next(&mut stream).await, "Apply p3");

    // Expired: the watcher relists; p1, deleted meanwhile, is not in the new init set.
    server.expire_watches();
    server.delete("v1", "Pod", Some("default"), "p1").unwrap();
    assert_eq!(next(&mut stream).await, "Init");
    assert_eq!(next(&mut stream).await, "InitApply p3");
    assert_eq!(next(&mut stream).await, "InitDone");

    // Dropped: the watcher resumes from its resourceVersion without relisting.
    server.drop_watches();
    server.create(direct_pod("p4", "n1")).unwrap();
    assert_eq!(next(&mut stream).await, "Apply p4");

    // A field selector filters, both on the list and the watch.
    let mut n1 = watcher::watcher(
        pods.clone(),
        watcher::Config::default().fields("spec.nodeName=n1"),
    )
    .boxed();
    assert_eq!(next(&mut n1).await, "Init");
    assert_eq!(next(&mut n1).await, "InitApply p4");
    assert_eq!(next(&mut n1).await, "InitDone");
    server.create(direct_pod("p5", "n2")).unwrap();
    server.create(direct_pod("p6", "n1")).unwrap();
    assert_eq!(next(&mut n1).await, "Apply p6");
}

#[tokio::test]
async fn watcher_survives_a_restart_of_the_server() {
    let server = ApiServer::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    server.serve(listener).unwrap();
    let client =
        Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
    assert_eq!(next(&mut stream).await, "Init");
    assert_eq!(next(&mut stream).await, "InitDone");
    server.stop();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener is closed at once"
    );
    server.create(direct_pod("while-down", "n1")).unwrap();
    // The address is free again at once, as after a killed process.
    server
        .serve(std::net::TcpListener::bind(addr).unwrap())
        .unwrap();
    assert_eq!(next(&mut stream).await, "Apply while-down");
}

#[tokio::test]
async fn bookmarks_arrive() {
    let (server, client) = start().await;
    server.set_bookmark_interval(Duration::from_millis(100));
    let pods: Api<Pod> = Api::namespaced(client, "default");
    server.create(direct_pod("p1", "n1")).unwrap();
    let mut stream = pods
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            }
            .timeout(10),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        match event.unwrap() {
            WatchEvent::Added(p) => seen.push(format!("ADDED {}", p.name_any())),
            WatchEvent::Bookmark(b) => {
                seen.push(format!("BOOKMARK {}", b.metadata.resource_version));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], "ADDED p1");
    assert!(seen[1].starts_with("BOOKMARK "));
}

#[tokio::test]
async fn failures_and_latency_are_injected() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    server.fail_requests(1, 500);
    let err = pods.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 500 && s.reason == "InternalError"),
        "{err}"
    );
    assert!(pods.list(&ListParams::default()).await.is_ok());
    // kube-client retries 503 by itself: the failure costs one more request, not an error.
    let before = server.requests();
    server.fail_requests(1, 503);
    assert!(pods.list(&ListParams::default()).await.is_ok());
    assert_eq!(server.requests() - before, 2);
    server.set_latency(Duration::from_millis(200));
    let started = std::time::Instant::now();
    pods.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn label_selector_watch_sees_objects_enter_and_leave() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut web =
        watcher::watcher(pods.clone(), watcher::Config::default().labels("app=web")).boxed();
    assert_eq!(next(&mut web).await, "Init");
    assert_eq!(next(&mut web).await, "InitDone");
    server.create(direct_pod("p1", "n1")).unwrap();
    assert_eq!(next(&mut web).await, "Apply p1");
    // Relabelled away: DELETED for this watch; back again: ADDED.
    let pp = PatchParams::default();
    pods.patch(
        "p1",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .unwrap();
    assert_eq!(next(&mut web).await, "Delete p1");
    pods.patch(
        "p1",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    assert_eq!(next(&mut web).await, "Apply p1");
}

#[tokio::test]
async fn streaming_lists_and_delete_collection() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    server.create(direct_pod("p1", "n1")).unwrap();
    server.create(direct_pod("p2", "n2")).unwrap();
    // sendInitialEvents: the initial ADDED events end with an annotated BOOKMARK.
    let mut stream =
        watcher::watcher(pods.clone(), watcher::Config::default().streaming_lists()).boxed();
    assert_eq!(next(&mut stream).await, "Init");
    assert_eq!(next(&mut stream).await, "InitApply p1");
    assert_eq!(next(&mut stream).await, "InitApply p2");
    assert_eq!(next(&mut stream).await, "InitDone");
    server.create(direct_pod("p3", "n1")).unwrap();
    assert_eq!(next(&mut stream).await, "Apply p3");

    let deleted = pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields("spec.nodeName=n1"),
        )
        .await
        .unwrap();
    let names: Vec<String> = deleted
        .left()
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["p1", "p3"]);
    assert_eq!(server.list("v1", "Pod").len(), 1);
    let mut seen = [next(&mut stream).await, next(&mut stream).await];
    seen.sort();
    assert_eq!(seen, ["Delete p1", "Delete p3"]);
}

#[tokio::test]
async fn metadata_watcher_gets_partial_objects() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    server.create(direct_pod("p1", "n1")).unwrap();
    let listed = pods.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].labels()["app"], "web");
    let got = pods.get_metadata("p1").await.unwrap();
    assert_eq!(got.types.unwrap().kind, "PartialObjectMetadata");
    // Api<PartialObjectMeta<K>> asks for metadata only.
    let metas: Api<PartialObjectMeta<Pod>> = Api::namespaced(pods.into_client(), "default");
    let mut stream = watcher::watcher(metas, watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap();
        match event {
            Ok(Event::InitApply(m)) | Ok(Event::Apply(m)) => seen.push(m.name_any()),
            Ok(Event::InitDone) => {
                seen.push("InitDone".into());
                server.create(direct_pod("p2", "n1")).unwrap();
            }
            Ok(Event::Init) => seen.push("Init".into()),
            Ok(Event::Delete(_)) | Err(_) => {}
        }
    }
    assert_eq!(seen, ["Init", "p1", "InitDone", "p2"]);
}

#[tokio::test]
async fn too_old_versions_expire_in_stream_and_timeouts_end_watches() {
    let server = ApiServer::with_history(5);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    server.serve(listener).unwrap();
    let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for i in 0..10 {
        server.create(direct_pod(&format!("p{i}"), "n1")).unwrap();
    }
    // Version 1 is no longer in the 5 events kept: an in-stream ERROR 410, then the end.
    let events: Vec<_> = pods
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    match &events[0] {
        Ok(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected an ERROR 410, got {other:?}"),
    }
    // A recent version replays what followed it.
    let rv = server.get("v1", "Pod", None, "p7").unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    let started = std::time::Instant::now();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
    {
        match event.unwrap() {
            WatchEvent::Added(p) => names.push(p.name_any()),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // timeoutSeconds=1 ended the stream.
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(names, ["p8", "p9"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_and_watches_lose_nothing() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let rv = server.list("v1", "Namespace")[2]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watches = Vec::new();
    for _ in 0..10 {
        let stream = pods
            .watch(&WatchParams::default().timeout(30), &rv)
            .await
            .unwrap()
            .boxed();
        watches.push(tokio::spawn(async move {
            let mut stream = stream;
            let mut versions = Vec::new();
            while versions.len() < 200 {
                match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(p)))) => {
                        versions.push(p.resource_version().unwrap().parse::<u64>().unwrap())
                    }
                    Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
                    other => panic!("unexpected {other:?} after {} events", versions.len()),
                }
            }
            versions
        }));
    }
    let mut writers = Vec::new();
    for w in 0..4 {
        let pods = pods.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..50 {
                pods.create(&PostParams::default(), &pod(&format!("w{w}-{i}"), "n1"))
                    .await
                    .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    for watch in watches {
        let versions = watch.await.unwrap();
        assert_eq!(versions.len(), 200);
        assert!(
            versions.windows(2).all(|v| v[0] < v[1]),
            "in order, no duplicates"
        );
    }
}

/// A client holding a ServiceAccount's token is authorized by the ClusterRole bound to it: a
/// granted verb works, another is `403 Forbidden` with the real server's message, the status
/// subresource needs its own rule, and a token the server never issued is `401`.
#[tokio::test]
async fn tokens_are_authorized_by_rbac() {
    let server = ApiServer::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    server.serve(listener).unwrap();
    server
        .apply_yaml(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: pods}\n\
             rules: [{apiGroups: [''], resources: [pods], verbs: [get, list, create]}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: pods}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pods}\n\
             subjects: [{kind: ServiceAccount, name: agent, namespace: kube-system}]\n",
        )
        .unwrap();
    server.enable_rbac();
    let client_with = |token: &str| {
        let mut config = kube::Config::new(url.parse().unwrap());
        config.auth_info.token = Some(token.to_string().into());
        Client::try_from(config).unwrap()
    };
    let token = server.service_account_token("kube-system", "agent");
    let pods: Api<Pod> = Api::default_namespaced(client_with(&token));
    pods.create(&PostParams::default(), &pod("p1", "n1"))
        .await
        .unwrap();
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let forbidden = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("{other}"),
    };
    let (code, message) = forbidden(
        pods.delete("p1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "pods \"p1\" is forbidden: User \"system:serviceaccount:kube-system:agent\" cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let status = Patch::Merge(json!({"status": {"phase": "Running"}}));
    let (code, _) = forbidden(
        pods.patch_status("p1", &PatchParams::default(), &status)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    let forged: Api<Pod> = Api::default_namespaced(client_with("forged"));
    let (code, _) = forbidden(forged.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 401);
    let audit = server.audit();
    assert_eq!(
        audit
            .iter()
            .map(|e| (e.attributes.verb, e.attributes.resource_path(), e.allowed))
            .collect::<Vec<_>>(),
        [
            ("create", "pods".to_string(), true),
            ("list", "pods".to_string(), true),
            ("delete", "pods".to_string(), false),
            ("patch", "pods/status".to_string(), false),
        ]
    );
}

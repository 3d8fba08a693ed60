//! 10,000 pods: creating them directly and listing them over HTTP in pages of 500 stays
//! fast (a generous bound in debug builds, well under two seconds in release).

use cellium_test_apiserver::ApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_in_pages_of_500() {
    let server = ApiServer::new();
    let started = Instant::now();
    for i in 0..10_000 {
        server
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("pod-{i:05}"), "namespace": "default", "labels": {"app": format!("a{}", i % 10)}},
                "spec": {"nodeName": format!("n{}", i % 50), "containers": [{"name": "c", "image": "nginx"}]}
            }))
            .unwrap();
    }
    let created = started.elapsed();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    server.serve(listener).unwrap();
    let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::all(client);

    let started = Instant::now();
    let (mut names, mut token, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = pods.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.iter().map(|p| p.name_any()));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    let listed = started.elapsed();
    assert_eq!(pages, 20);
    assert_eq!(names.len(), 10_000);
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "pages are ordered and do not overlap"
    );

    let selected = pods
        .list(
            &ListParams::default()
                .labels("app=a3")
                .fields("spec.nodeName=n3"),
        )
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 200);

    println!("created 10,000 pods in {created:?}, listed them in 20 pages in {listed:?}");
    let bound = if cfg!(debug_assertions) {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(2)
    };
    assert!(
        created + listed < bound,
        "created in {created:?}, listed in {listed:?}"
    );
}

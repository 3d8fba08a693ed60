//! The `cellium-test-apiserver` binary: `--listen` and `--load` work.

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::Client;
use kube::api::Api;
use std::time::Duration;

#[tokio::test]
async fn binary_serves_preloaded_objects() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("load.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: team}\nspec: {ports: [{port: 80}]}\n",
    )
    .unwrap();
    // A free port: bind, read it, release it for the child.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cellium-test-apiserver"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--load",
            file.to_str().unwrap(),
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = Client::try_from(kube::Config::new(
        format!("http://127.0.0.1:{port}").parse().unwrap(),
    ))
    .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "team");
    let mut svc = None;
    for _ in 0..100 {
        if let Ok(s) = services.get("web").await {
            svc = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let svc = svc.expect("the binary serves the loaded Service within 5 s");
    assert!(svc.spec.unwrap().cluster_ip.unwrap().starts_with("10.9"));
    let ns: Api<Namespace> = Api::all(client);
    assert!(ns.get("team").await.is_ok());
    child.kill().await.unwrap();
}

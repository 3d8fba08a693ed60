//! Garbage collection against the test API server: unused identities in two rounds (a used
//! one kept, one used again between the rounds kept), CiliumEndpoints without their Pod,
//! CiliumNodes without their Node (their CIDRs reused).

mod common;

use std::time::Duration;

use common::{Cluster, always, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

fn identity(cluster: &Cluster, id: u32, app: &str) {
    cluster
        .server
        .create(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
            "metadata": {"name": id.to_string()},
            "security-labels": {"k8s:app": app, "k8s:io.kubernetes.pod.namespace": "default"},
        }))
        .unwrap();
}

fn cep(cluster: &Cluster, name: &str, identity: u32) {
    cluster
        .server
        .create(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumEndpoint",
            "metadata": {"name": name, "namespace": "default"},
            "status": {"id": 7, "identity": {"id": identity, "labels": []}},
        }))
        .unwrap();
}

fn pod(cluster: &Cluster, name: &str) {
    cluster
        .server
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx:1"}]},
        }))
        .unwrap();
}

fn exists(cluster: &Cluster, kind: &str, namespace: Option<&str>, name: &str) -> bool {
    let api_version = if kind == "Node" || kind == "Pod" {
        "v1"
    } else {
        "cilium.io/v2"
    };
    cluster
        .server
        .get(api_version, kind, namespace, name)
        .is_some()
}

fn message(op: &common::Operator, job: &str) -> String {
    op.hive
        .health()
        .node(job)
        .map(|n| n.status.message)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_identities_go_in_the_second_round_and_used_ones_stay() {
    let cluster = Cluster::new();
    identity(&cluster, 1000, "web");
    identity(&cluster, 1001, "gone");
    identity(&cluster, 1002, "late");
    cep(&cluster, "web", 1000);
    let gc: Vec<(&str, Value)> = vec![("identity-gc-interval", json!("2s"))];
    let op = cluster.operator("op-a", &gc).await;
    eventually("op-a leads", WAIT, || op.leading()).await;
    // The first round that leads only marks.
    eventually("a round marks the two unused identities", WAIT, || {
        message(&op, "gc.identities") == "leading: last round: 1 in use, 2 marked, 0 deleted"
    })
    .await;
    assert!(exists(&cluster, "CiliumIdentity", None, "1001"));
    // Used again before the next round: kept.
    cep(&cluster, "late", 1002);
    eventually("the second round deletes 1001", WAIT, || {
        !exists(&cluster, "CiliumIdentity", None, "1001")
    })
    .await;
    always(
        "1000 and 1002, in use, stay",
        Duration::from_secs(3),
        || {
            exists(&cluster, "CiliumIdentity", None, "1000")
                && exists(&cluster, "CiliumIdentity", None, "1002")
        },
    )
    .await;
    assert_eq!(
        message(&op, "gc.identities"),
        "leading: last round: 2 in use, 0 marked, 0 deleted"
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_deletes_nothing() {
    let cluster = Cluster::new();
    identity(&cluster, 1001, "gone");
    let fast: Vec<(&str, Value)> = vec![
        ("identity-gc-interval", json!("300ms")),
        ("endpoint-gc-interval", json!("300ms")),
    ];
    // Another operator holds the Lease and renews it.
    let a = cluster.operator("op-a", &[]).await;
    eventually("op-a leads", WAIT, || a.leading()).await;
    cep(&cluster, "orphan", 1000);
    let b = cluster.operator("op-b", &fast).await;
    always(
        "op-b, following, deletes nothing",
        Duration::from_secs(2),
        || {
            exists(&cluster, "CiliumIdentity", None, "1001")
                && exists(&cluster, "CiliumEndpoint", Some("default"), "orphan")
        },
    )
    .await;
    assert_eq!(message(&b, "gc.identities"), "not leading");
    // The leader goes: op-b takes over and collects.
    a.stop().await;
    eventually("op-b deletes the orphan endpoint", WAIT, || {
        !exists(&cluster, "CiliumEndpoint", Some("default"), "orphan")
    })
    .await;
    eventually("op-b deletes the unused identity", WAIT, || {
        !exists(&cluster, "CiliumIdentity", None, "1001")
    })
    .await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_whose_pod_is_gone_are_deleted() {
    let cluster = Cluster::new();
    pod(&cluster, "web");
    cep(&cluster, "web", 1000);
    cep(&cluster, "gone", 1000);
    let gc: Vec<(&str, Value)> = vec![("endpoint-gc-interval", json!("500ms"))];
    let op = cluster.operator("op-a", &gc).await;
    eventually("the endpoint without a pod is deleted", WAIT, || {
        !exists(&cluster, "CiliumEndpoint", Some("default"), "gone")
    })
    .await;
    always("the pod's endpoint stays", Duration::from_secs(1), || {
        exists(&cluster, "CiliumEndpoint", Some("default"), "web")
    })
    .await;
    cluster
        .server
        .delete("v1", "Pod", Some("default"), "web")
        .unwrap();
    eventually("its pod deleted, the endpoint goes too", WAIT, || {
        !exists(&cluster, "CiliumEndpoint", Some("default"), "web")
    })
    .await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cilium_nodes_whose_node_is_gone_are_deleted_and_their_cidrs_reused() {
    let cluster = Cluster::new();
    for node in ["n1", "n2"] {
        cluster
            .server
            .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
            .unwrap();
        cluster.create_cilium_node(node, &[]);
    }
    let config: Vec<(&str, Value)> = vec![
        ("nodes-gc-interval", json!("1s")),
        ("cluster-pool-ipv4-cidr", json!(["10.0.0.0/23"])),
    ];
    let op = cluster.operator("op-a", &config).await;
    eventually("both nodes get CIDRs", WAIT, || {
        cluster.pod_cidrs("n1").len() == 1 && cluster.pod_cidrs("n2").len() == 1
    })
    .await;
    let n2_cidrs = cluster.pod_cidrs("n2");
    always(
        "CiliumNodes with a Node stay",
        Duration::from_millis(2500),
        || exists(&cluster, "CiliumNode", None, "n1") && exists(&cluster, "CiliumNode", None, "n2"),
    )
    .await;
    cluster.server.delete("v1", "Node", None, "n2").unwrap();
    eventually("n2's CiliumNode is deleted", WAIT, || {
        !exists(&cluster, "CiliumNode", None, "n2")
    })
    .await;
    assert!(exists(&cluster, "CiliumNode", None, "n1"));
    cluster
        .server
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3"}}))
        .unwrap();
    cluster.create_cilium_node("n3", &[]);
    eventually("n3 gets n2's CIDR", WAIT, || {
        cluster.pod_cidrs("n3") == n2_cidrs
    })
    .await;
    op.stop().await;
}

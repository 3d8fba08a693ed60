//! cluster-pool IPAM against the test API server: CIDRs handed out, re-occupied after a
//! restart, conflicts and exhaustion reported on the node, deleted nodes' CIDRs reused.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Cluster, always, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

fn pools(v4: &[&str], v6: &[&str]) -> Vec<(&'static str, Value)> {
    vec![
        ("cluster-pool-ipv4-cidr", json!(v4)),
        ("cluster-pool-ipv6-cidr", json!(v6)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_gets_a_cidr_per_family_and_a_restart_reoccupies_them() {
    let cluster = Cluster::new();
    // Assigned before this operator ever ran: occupied, not handed out again.
    cluster.create_cilium_node("a", &["10.0.1.0/24"]);
    cluster.create_cilium_node("b", &[]);
    let config = pools(&["10.0.0.0/22"], &["fd00::/104"]);
    let op = cluster.operator("op-a", &config).await;
    eventually("b gets a CIDR per family", WAIT, || {
        cluster.pod_cidrs("b").len() == 2
    })
    .await;
    assert_eq!(cluster.pod_cidrs("b"), ["10.0.0.0/24", "fd00::1:0/112"]);
    eventually("a gets an IPv6 CIDR besides its own", WAIT, || {
        cluster.pod_cidrs("a").len() == 2
    })
    .await;
    assert_eq!(cluster.pod_cidrs("a"), ["10.0.1.0/24", "fd00::/112"]);
    cluster.create_cilium_node("c", &[]);
    eventually("c, added later, gets its CIDRs", WAIT, || {
        cluster.pod_cidrs("c").len() == 2
    })
    .await;
    assert_eq!(cluster.pod_cidrs("c"), ["10.0.2.0/24", "fd00::2:0/112"]);
    op.stop().await;

    // Restarted: what is written is occupied before anything is handed out.
    cluster.create_cilium_node("d", &[]);
    let op = cluster.operator("op-a2", &config).await;
    eventually("d gets its CIDRs", WAIT, || {
        cluster.pod_cidrs("d").len() == 2
    })
    .await;
    assert_eq!(cluster.pod_cidrs("d"), ["10.0.3.0/24", "fd00::3:0/112"]);
    let mut all = BTreeSet::new();
    for node in ["a", "b", "c", "d"] {
        for cidr in cluster.pod_cidrs(node) {
            assert!(all.insert(cidr.clone()), "{cidr} handed out twice");
        }
        assert_eq!(cluster.operator_error(node), None, "{node}");
    }
    let status = op
        .hive
        .health()
        .node("cluster-pool.ciliumnodes")
        .unwrap()
        .status;
    assert!(
        status.message.contains("8 pod CIDRs allocated"),
        "{status:?}"
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_claim_on_a_cidr_is_reported_on_the_later_node() {
    let cluster = Cluster::new();
    cluster.create_cilium_node("x", &["10.0.0.0/24"]);
    cluster.create_cilium_node("y", &["10.0.0.0/24"]);
    let op = cluster
        .operator("op-a", &pools(&["10.0.0.0/16"], &[]))
        .await;
    eventually("the conflict is on y", WAIT, || {
        cluster.operator_error("y").is_some()
    })
    .await;
    assert_eq!(
        cluster.operator_error("y").unwrap(),
        "pod CIDR 10.0.0.0/24 is already allocated to node x"
    );
    assert_eq!(cluster.operator_error("x"), None);
    // y's spec is its agent's claim: left as it is.
    assert_eq!(cluster.pod_cidrs("y"), ["10.0.0.0/24"]);

    // x goes: y's claim is now the only one, and the error is cleared.
    cluster
        .server
        .delete("cilium.io/v2", "CiliumNode", None, "x")
        .unwrap();
    eventually("y's error is cleared", WAIT, || {
        cluster.operator_error("y").is_none()
    })
    .await;
    cluster.create_cilium_node("z", &[]);
    eventually("z gets a CIDR", WAIT, || !cluster.pod_cidrs("z").is_empty()).await;
    assert_eq!(cluster.pod_cidrs("z"), ["10.0.1.0/24"]);
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_is_written_to_the_node_and_a_deleted_nodes_cidr_is_reused() {
    let cluster = Cluster::new();
    let op = cluster
        .operator("op-a", &pools(&["10.0.0.0/23"], &[]))
        .await;
    for node in ["a", "b"] {
        cluster.create_cilium_node(node, &[]);
    }
    eventually("a and b get the pool's two CIDRs", WAIT, || {
        cluster.pod_cidrs("a").len() == 1 && cluster.pod_cidrs("b").len() == 1
    })
    .await;
    let a_cidr = cluster.pod_cidrs("a");
    cluster.create_cilium_node("c", &[]);
    eventually("c is told the pool is exhausted", WAIT, || {
        cluster.operator_error("c").is_some()
    })
    .await;
    assert_eq!(
        cluster.operator_error("c").unwrap(),
        "IPv4 pool exhausted: no free pod CIDR left in 10.0.0.0/23 (cluster-pool-ipv4-cidr)"
    );
    assert!(cluster.pod_cidrs("c").is_empty());

    // a goes: its CIDR goes back to the pool, and to c, which was waiting for one.
    cluster
        .server
        .delete("cilium.io/v2", "CiliumNode", None, "a")
        .unwrap();
    eventually("c gets a's CIDR", WAIT, || cluster.pod_cidrs("c") == a_cidr).await;
    eventually("c's error is cleared", WAIT, || {
        cluster.operator_error("c").is_none()
    })
    .await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_hands_out_cidrs_and_the_next_one_hands_out_none_twice() {
    let cluster = Cluster::new();
    let config = pools(&["10.0.0.0/16"], &[]);
    let a = cluster.operator("op-a", &config).await;
    eventually("op-a leads", WAIT, || a.leading()).await;
    let b = cluster.operator("op-b", &config).await;
    for i in 0..5 {
        cluster.create_cilium_node(&format!("n{i}"), &[]);
    }
    eventually("five nodes get CIDRs", WAIT, || {
        (0..5).all(|i| !cluster.pod_cidrs(&format!("n{i}")).is_empty())
    })
    .await;
    always("op-b follows", Duration::from_millis(500), || !b.leading()).await;
    let b_status = b
        .hive
        .health()
        .node("cluster-pool.ciliumnodes")
        .unwrap()
        .status;
    assert!(b_status.message.contains("not leading"), "{b_status:?}");
    a.stop().await;
    eventually("op-b leads", WAIT, || b.leading()).await;
    for i in 5..10 {
        cluster.create_cilium_node(&format!("n{i}"), &[]);
    }
    eventually("five more nodes get CIDRs", WAIT, || {
        (5..10).all(|i| !cluster.pod_cidrs(&format!("n{i}")).is_empty())
    })
    .await;
    let mut all = BTreeSet::new();
    for i in 0..10 {
        let cidrs = cluster.pod_cidrs(&format!("n{i}"));
        assert_eq!(cidrs.len(), 1);
        assert!(
            all.insert(cidrs[0].clone()),
            "{} handed out twice",
            cidrs[0]
        );
    }
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_away_and_back_the_leader_goes_on_without_handing_out_twice() {
    let cluster = Cluster::new();
    let op = cluster
        .operator("op-a", &pools(&["10.0.0.0/16"], &[]))
        .await;
    for i in 0..3 {
        cluster.create_cilium_node(&format!("n{i}"), &[]);
    }
    eventually("three nodes get CIDRs", WAIT, || {
        (0..3).all(|i| !cluster.pod_cidrs(&format!("n{i}")).is_empty())
    })
    .await;
    let addr: std::net::SocketAddr = cluster.url.trim_start_matches("http://").parse().unwrap();
    cluster.server.stop();
    eventually("the leader stops leading", WAIT, || !op.leading()).await;
    let status = op
        .hive
        .health()
        .node("cluster-pool.ciliumnodes")
        .unwrap()
        .status;
    assert!(status.message.contains("not leading"), "{status:?}");
    // Created while the API server is away from the operator.
    for i in 3..6 {
        cluster.create_cilium_node(&format!("n{i}"), &[]);
    }
    // Back on the same address.
    cluster
        .server
        .serve(std::net::TcpListener::bind(addr).unwrap())
        .unwrap();
    eventually("it leads again", WAIT, || op.leading()).await;
    eventually("the three new nodes get CIDRs", WAIT, || {
        (3..6).all(|i| !cluster.pod_cidrs(&format!("n{i}")).is_empty())
    })
    .await;
    let mut all = BTreeSet::new();
    for i in 0..6 {
        let cidrs = cluster.pod_cidrs(&format!("n{i}"));
        assert!(
            all.insert(cidrs[0].clone()),
            "{} handed out twice",
            cidrs[0]
        );
    }
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_dropped_watches_relist_without_handing_out_twice() {
    let cluster = Cluster::new();
    let op = cluster
        .operator("op-a", &pools(&["10.0.0.0/16"], &[]))
        .await;
    for i in 0..8 {
        cluster.create_cilium_node(&format!("n{i}"), &[]);
        if i % 3 == 1 {
            cluster.server.expire_watches();
        } else if i % 3 == 2 {
            cluster.server.drop_watches();
        }
    }
    eventually("eight nodes get CIDRs", WAIT, || {
        (0..8).all(|i| !cluster.pod_cidrs(&format!("n{i}")).is_empty())
    })
    .await;
    let mut all = BTreeSet::new();
    for i in 0..8 {
        let cidrs = cluster.pod_cidrs(&format!("n{i}"));
        assert_eq!(cidrs.len(), 1, "n{i}: {cidrs:?}");
        assert!(
            all.insert(cidrs[0].clone()),
            "{} handed out twice",
            cidrs[0]
        );
        assert_eq!(cluster.operator_error(&format!("n{i}")), None);
    }
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_stops_handing_out_at_once() {
    let cluster = Cluster::new();
    let op = cluster
        .operator("op-a", &pools(&["10.0.0.0/16"], &[]))
        .await;
    cluster.create_cilium_node("n0", &[]);
    eventually("n0 gets a CIDR", WAIT, || {
        !cluster.pod_cidrs("n0").is_empty()
    })
    .await;
    // Another holder, for an hour: op-a sees it at its next renewal.
    cluster
        .server
        .apply_yaml(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: cellium-operator, namespace: kube-system}\nspec: {holderIdentity: elsewhere, leaseDurationSeconds: 3600}\n",
        )
        .unwrap();
    eventually("op-a stops leading", WAIT, || !op.leading()).await;
    cluster.create_cilium_node("n1", &[]);
    always(
        "n1 gets nothing from a follower",
        Duration::from_secs(2),
        || cluster.pod_cidrs("n1").is_empty() && cluster.holder().as_deref() == Some("elsewhere"),
    )
    .await;
    let status = op
        .hive
        .health()
        .node("cluster-pool.ciliumnodes")
        .unwrap()
        .status;
    assert!(status.message.contains("not leading"), "{status:?}");
    op.stop().await;
}

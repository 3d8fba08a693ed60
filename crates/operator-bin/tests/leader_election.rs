//! Two operators against one API server: one leads, and the other takes over when the
//! first stops, or when it dies and its Lease expires.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, always, eventually, on_own_runtime};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_leads_and_the_other_takes_over_when_it_stops() {
    let cluster = Cluster::new();
    let a = cluster.operator("op-a", &[]).await;
    eventually("op-a holds the Lease", Duration::from_secs(5), || {
        cluster.holder().as_deref() == Some("op-a")
    })
    .await;
    let b = cluster.operator("op-b", &[]).await;
    // Renewed all along: op-b follows for longer than a lease duration.
    always("op-a leads, op-b follows", Duration::from_secs(4), || {
        cluster.holder().as_deref() == Some("op-a") && a.leading() && !b.leading()
    })
    .await;
    let lease = cluster
        .server
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "cellium-operator",
        )
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], json!(0), "{lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], json!(3), "{lease}");

    // A stopping leader hands the Lease over: the other takes it at its next try, well
    // before a lease duration.
    let stopped = Instant::now();
    a.stop().await;
    eventually(
        "op-b takes the released Lease",
        Duration::from_secs(2),
        || cluster.holder().as_deref() == Some("op-b") && b.leading(),
    )
    .await;
    println!("takeover after a stop: {:?}", stopped.elapsed());
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leaders_lease_is_taken_over_once_it_expires() {
    let cluster = Cluster::new();
    let sources = cluster.sources("op-a", &[]);
    // op-a on a runtime of its own, so that it can die without a word.
    let (rt, a) = on_own_runtime(move || async move { common::Operator::start(sources).await });
    eventually("op-a holds the Lease", Duration::from_secs(5), || {
        cluster.holder().as_deref() == Some("op-a")
    })
    .await;
    let b = cluster.operator("op-b", &[]).await;
    always("op-b follows", Duration::from_secs(1), || !b.leading()).await;

    let died = Instant::now();
    rt.shutdown_background();
    drop(a);
    // The record op-b saw last stays unchanged; op-b waits the lease's 3 s on its own clock.
    always(
        "op-b waits for the Lease to expire",
        Duration::from_secs(2),
        || cluster.holder().as_deref() == Some("op-a") && !b.leading(),
    )
    .await;
    eventually(
        "op-b takes the expired Lease",
        Duration::from_secs(4),
        || cluster.holder().as_deref() == Some("op-b") && b.leading(),
    )
    .await;
    let took = died.elapsed();
    println!("takeover after a death: {took:?}");
    assert!(took >= Duration::from_secs(2), "{took:?}");
    let lease = cluster
        .server
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "cellium-operator",
        )
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], json!(1), "{lease}");
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_leading_before_the_lease_expires() {
    let cluster = Cluster::new();
    let a = cluster.operator("op-a", &[]).await;
    eventually("op-a leads", Duration::from_secs(5), || a.leading()).await;
    // The API server away: the renew deadline (2 s) passes before the lease (3 s) would.
    cluster.server.stop();
    let gone = Instant::now();
    eventually("op-a stops leading", Duration::from_secs(4), || {
        !a.leading()
    })
    .await;
    let lost = gone.elapsed();
    println!("leadership dropped after {lost:?} without renewals");
    assert!(lost < Duration::from_secs(3), "{lost:?}");
    let status = a
        .hive
        .health()
        .node("leader-election.lease")
        .unwrap()
        .status;
    assert_eq!(status.level, cellium_hive::Level::Degraded, "{status:?}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_operators_started_at_once_elect_exactly_one() {
    let cluster = Cluster::new();
    let (a, b, c) = tokio::join!(
        cluster.operator("op-a", &[]),
        cluster.operator("op-b", &[]),
        cluster.operator("op-c", &[]),
    );
    let ops = [&a, &b, &c];
    eventually("one leads", Duration::from_secs(5), || {
        ops.iter().any(|o| o.leading())
    })
    .await;
    let holder = cluster.holder().unwrap();
    always(
        "exactly one leads, the Lease's holder",
        Duration::from_secs(4),
        || {
            let leaders: Vec<&str> = ops
                .iter()
                .filter(|o| o.leading())
                .map(|o| o.leadership.id())
                .collect();
            leaders == [holder.as_str()] && cluster.holder().as_deref() == Some(holder.as_str())
        },
    )
    .await;
    for op in [a, b, c] {
        op.stop().await;
    }
}

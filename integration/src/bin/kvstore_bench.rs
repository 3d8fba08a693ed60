//! `cellium-kvstore-bench`: the kvstore's allocation and propagation against a real etcd,
//! with the floor measured in the same run on the same etcd (see `integration/bench/kvstore.sh`).
//!
//! - floor: SETS create-if-absent transactions (`id/<N>` put only when its create revision
//!   is 0), all at once from one client;
//! - alloc: SETS new label sets numbered by three nodes' kvstore cells at once (each asks for
//!   every set; each set gets one number), under the cell's lock and transaction;
//! - propagation: PODS times, an ip entry kept by node 1 until both other nodes' mirrors
//!   have it as a remote endpoint (their ipcache's input), p50 and p99.
//!
//! etcd runs in a network namespace of its own on its loopback; everything is removed at the
//! end. Root.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellium_integration::{Etcd, NetNs};
use cellium_kvstore::{Kvstore, KvstoreConfig, KvstoreKind, keys};
use cellium_labels::Labels;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use futures::future::join_all;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let sets = env("SETS", 1000);
    let pods = env("PODS", 100);
    let ns = NetNs::new()?;
    let etcd = Arc::new(Etcd::start(&ns, "127.0.0.1".parse()?)?);
    let url = etcd.url();
    let outcome = ns.run(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(bench(url, sets, pods))
    })?;
    etcd.kill();
    outcome
}

fn node(url: &str, name: &str) -> anyhow::Result<Arc<Kvstore>> {
    let cfg = KvstoreConfig {
        kvstore: KvstoreKind::Etcd,
        kvstore_endpoints: url.into(),
        kvstore_lease_ttl: Duration::from_secs(60),
        kvstore_allocation_timeout: Duration::from_secs(120),
        ..KvstoreConfig::default()
    };
    let kv = Kvstore::new(cfg, Some(name.into())).map_err(anyhow::Error::msg)?;
    // Each node's address, the last part of its identity references (`n3`: 192.0.2.3).
    let n: u8 = name.trim_start_matches('n').parse()?;
    kv.set_node_ip(&[std::net::Ipv4Addr::new(192, 0, 2, n).into()]);
    tokio::spawn(kv.clone().run());
    Ok(kv)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn bench(url: String, sets: usize, pods: usize) -> anyhow::Result<()> {
    // The floor: the same transaction shape, from one client, all at once.
    let client = Client::connect([url.as_str()], None).await?;
    let floor_began = Instant::now();
    let results = join_all((0..sets).map(|i| {
        let mut c = client.clone();
        async move {
            let key = format!("bench/floor/{i}");
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), "k8s:app=x;", None)]);
            c.txn(txn).await.map(|r| r.succeeded())
        }
    }))
    .await;
    let floor_ms = floor_began.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(
        results.iter().all(|r| matches!(r, Ok(true))),
        "the floor's transactions failed"
    );

    let nodes = [node(&url, "n1")?, node(&url, "n2")?, node(&url, "n3")?];
    for kv in &nodes {
        while kv.lease_id().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let labels: Vec<Labels> = (0..sets)
        .map(|i| {
            format!(
                "k8s:app=bench-{i},k8s:io.kubernetes.pod.namespace=b{}",
                i % 10
            )
            .parse()
        })
        .collect::<Result<_, _>>()?;
    let alloc_began = Instant::now();
    let numbered = join_all(nodes.iter().map(|kv| {
        let labels = labels.clone();
        async move {
            join_all(labels.iter().map(|l| kv.number(l)))
                .await
                .into_iter()
                .collect::<Result<Vec<u32>, String>>()
        }
    }))
    .await;
    let alloc_ms = alloc_began.elapsed().as_secs_f64() * 1e3;
    let numbered: Vec<Vec<u32>> = numbered
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        numbered[0] == numbered[1] && numbered[1] == numbered[2],
        "the nodes disagree"
    );
    let distinct: BTreeSet<u32> = numbered[0].iter().copied().collect();
    anyhow::ensure!(distinct.len() == sets, "a number was given twice");

    // Propagation: node 1 keeps one more ip entry each round; timed until nodes 2 and 3
    // have it as a remote endpoint.
    let mut entries = BTreeMap::new();
    let mut times = Vec::with_capacity(pods);
    for i in 0..pods {
        let ip = format!("10.200.{}.{}", i / 250, i % 250 + 1).parse()?;
        entries.insert(
            keys::ip_key(ip),
            keys::IpEntry {
                ip,
                mask: None,
                host_ip: Some("192.0.2.1".parse()?),
                id: numbered[0][i % sets],
                key: 0,
                metadata: format!("cilium-global:default:n1:{i}"),
                namespace: "bench".into(),
                pod_name: format!("pod-{i}"),
                named_ports: vec![],
            },
        );
        let mut watches = [nodes[1].ips.changes(), nodes[2].ips.changes()];
        let began = Instant::now();
        nodes[0].keep_ips(&entries);
        for (kv, w) in nodes[1..].iter().zip(watches.iter_mut()) {
            while !kv
                .remote_endpoints(&BTreeSet::new())
                .iter()
                .any(|e| e.addresses.contains(&ip))
            {
                tokio::time::timeout(Duration::from_secs(30), w.changed()).await??;
            }
        }
        times.push(began.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    let ratio = alloc_ms / floor_ms;
    println!("floor: {sets} create-if-absent transactions from one client: {floor_ms:.0} ms");
    println!("alloc: {sets} new label sets from three nodes at once: {alloc_ms:.0} ms");
    println!("propagation over {pods} ip entries: p50 {p50:.1} ms, p99 {p99:.1} ms");
    println!(
        "RESULT kvstore alloc_{sets}_ms={alloc_ms:.0} alloc_ratio_vs_txn={ratio:.2} propagate_p99_ms={p99:.1}"
    );
    Ok(())
}

//! kvstore mode against a real etcd (Debian's `etcd-server`, started per test in its own
//! network namespace with its own data directory): identities allocated from several nodes
//! at once, the session lease, and the faults (etcd killed and restarted, a node's keys
//! deleted by someone else, a node that dies).
//!
//! Needs root (network namespaces). Run with
//! `cargo test -p cellium-integration --test kvstore -- --test-threads=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use cellium_integration::{Etcd, NetNs};
use cellium_kvstore::{Kvstore, KvstoreConfig, KvstoreKind, keys};
use cellium_labels::Labels;
use futures::future::join_all;
use tokio::task::JoinHandle;

/// A node's kvstore with its loops running; the loops stop on drop (as a killed agent's).
struct Node {
    kv: Arc<Kvstore>,
    task: JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn node(etcd: &Etcd, name: &str, ttl: Duration, alloc_timeout: Duration) -> Node {
    let cfg = KvstoreConfig {
        kvstore: KvstoreKind::Etcd,
        kvstore_endpoints: etcd.url(),
        kvstore_lease_ttl: ttl,
        kvstore_allocation_timeout: alloc_timeout,
        ..KvstoreConfig::default()
    };
    let kv = Kvstore::new(cfg, Some(name.into())).expect("valid configuration");
    kv.set_node_ip(&[address(name)]);
    let task = tokio::spawn(kv.clone().run());
    Node { kv, task }
}

/// Node `nK`'s address, 192.0.2.K: the last part of its identity references.
fn address(name: &str) -> IpAddr {
    let k: u8 = name
        .trim_start_matches('n')
        .parse()
        .expect("a node named nK");
    Ipv4Addr::new(192, 0, 2, k).into()
}

fn label_set(i: usize) -> Labels {
    format!(
        "k8s:app=app-{i},k8s:io.kubernetes.pod.namespace=ns-{}",
        i % 7
    )
    .parse()
    .expect("labels")
}

/// Polls `f` until it holds, for at most about a minute: convergence is awaited, never timed.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

/// Runs `test` on a runtime inside a new namespace that has an etcd on its loopback.
fn with_etcd<F, Fut>(test: F)
where
    F: FnOnce(Arc<Etcd>) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let ns = NetNs::new().expect("a network namespace");
    let etcd = Arc::new(Etcd::start(&ns, "127.0.0.1".parse().unwrap()).expect("etcd starts"));
    let inner = etcd.clone();
    let outcome = ns.run(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(test(inner))));
        rt.shutdown_background();
        result
    });
    etcd.kill();
    drop(ns);
    if let Err(panic) = outcome.expect("ran in the namespace") {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn the_same_200_label_sets_from_three_nodes_get_one_number_each_everywhere() {
    with_etcd(|etcd| async move {
        let long = Duration::from_secs(60);
        let nodes: Vec<Node> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| node(&etcd, n, long, long))
            .collect();
        let sets: Vec<Labels> = (0..200).map(label_set).collect();
        // The first number of 20 of them is held by other labels: those go the locked way.
        let mut squatted = BTreeSet::new();
        for labels in &sets[..20] {
            let first = keys::probe_sequence(&keys::labels_key(labels))
                .next()
                .unwrap();
            if squatted.insert(first) {
                etcd.etcdctl(&[
                    "put",
                    &keys::id_key(first),
                    &format!("k8s:app=squatter-{first};"),
                ])
                .unwrap();
            }
        }
        // All three at once, each in its own order, every allocation concurrent.
        let results = join_all(nodes.iter().enumerate().map(|(k, n)| {
            let kv = n.kv.clone();
            let mut order: Vec<usize> = (0..sets.len()).collect();
            order.rotate_left(k * 67);
            let sets = sets.clone();
            async move {
                let numbered = join_all(order.iter().map(|&i| {
                    let (kv, labels) = (kv.clone(), sets[i].clone());
                    async move { (i, kv.number(&labels).await.expect("numbered")) }
                }))
                .await;
                numbered.into_iter().collect::<BTreeMap<usize, u32>>()
            }
        }))
        .await;
        assert_eq!(results[0], results[1]);
        assert_eq!(results[1], results[2]);
        let distinct: BTreeSet<u32> = results[0].values().copied().collect();
        assert_eq!(distinct.len(), 200, "one number per label set");

        // etcd holds one id key per label set, each naming its labels; every node refers
        // to every number, on its lease.
        assert!(
            distinct.is_disjoint(&squatted),
            "a held number was given to other labels"
        );
        let ids = etcd.keys(keys::ID_PREFIX).unwrap();
        assert_eq!(ids.len(), 200 + squatted.len());
        for (i, id) in &results[0] {
            let out = etcd
                .etcdctl(&["get", "--print-value-only", &keys::id_key(*id)])
                .unwrap();
            assert_eq!(out.trim(), keys::labels_key(&sets[*i]));
        }
        let etcd2 = etcd.clone();
        eventually("600 value keys", move || {
            etcd2.keys(keys::VALUE_PREFIX).map(|k| k.len()).unwrap_or(0) == 600
        })
        .await;
        assert!(
            etcd.keys(keys::LOCK_PREFIX).unwrap().is_empty(),
            "every lock released"
        );
        // Every node learnt every number by the watch, so asking again takes no request.
        for n in &nodes {
            for (i, id) in &results[0] {
                let kv = n.kv.clone();
                let key = keys::labels_key(&sets[*i]);
                eventually("the number learnt", move || kv.known_number(&key).is_some()).await;
                assert_eq!(n.kv.known_number(&keys::labels_key(&sets[*i])), Some(*id));
            }
        }
    });
}

fn ip_entry(ip: &str, host: &str, id: u32, pod: &str) -> (String, keys::IpEntry) {
    let ip = ip.parse().unwrap();
    (
        keys::ip_key(ip),
        keys::IpEntry {
            ip,
            mask: None,
            host_ip: Some(host.parse().unwrap()),
            id,
            key: 0,
            metadata: "cilium-global:default:n1:7".into(),
            namespace: "demo".into(),
            pod_name: pod.into(),
            named_ports: vec![],
        },
    )
}

#[test]
fn faults_etcd_killed_and_restarted_keys_deleted_by_someone_else_a_node_that_dies() {
    with_etcd(|etcd| async move {
        let ttl = Duration::from_secs(3);
        let alloc_timeout = Duration::from_secs(2);
        let n1 = node(&etcd, "n1", ttl, alloc_timeout);
        let n2 = node(&etcd, "n2", ttl, alloc_timeout);
        let web: Labels = "k8s:app=web,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let web_key = keys::labels_key(&web);
        let id = n1.kv.number(&web).await.expect("numbered");
        // The session keeps one lease while etcd answers: still the same after two TTLs.
        let lease = n1.kv.lease_id();
        assert!(lease.is_some());
        tokio::time::sleep(ttl * 2).await;
        assert_eq!(
            n1.kv.lease_id(),
            lease,
            "the lease was kept alive, not granted anew"
        );
        let kv2 = n2.kv.clone();
        let k = web_key.clone();
        eventually("n2 learns web's number", move || {
            kv2.known_number(&k) == Some(id)
        })
        .await;

        // n1's pods, as ip entries; n2 reads them as remote endpoints, and leaves out n1's
        // entry for its own address with the host identity; n1 skips its own.
        let entries: BTreeMap<String, keys::IpEntry> = [
            ip_entry("10.1.0.5", "192.0.2.1", id, "web-1"),
            ip_entry("192.0.2.1", "192.0.2.1", 1, "host"),
        ]
        .into_iter()
        .collect();
        n1.kv.keep_ips(&entries);
        let kv2 = n2.kv.clone();
        eventually("n2 sees n1's entries", move || kv2.ips.lock().len() == 2).await;
        let remote = n2.kv.remote_endpoints(&BTreeSet::new());
        let web1 = remote.iter().find(|e| e.name == "web-1").unwrap();
        assert_eq!(web1.identity, id);
        assert_eq!(web1.node_ip, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(web1.id, 7);
        assert_eq!(remote.len(), 1, "the host entry is the node's: left out");
        let kv1 = n1.kv.clone();
        eventually("n1's entries in its mirror", move || {
            kv1.ips.lock().len() == 2
        })
        .await;
        assert!(
            n1.kv.remote_endpoints(&BTreeSet::new()).is_empty(),
            "its own are skipped"
        );
        // Hostile input: garbage under the prefix is skipped, not fatal.
        etcd.etcdctl(&["put", &format!("{}10.9.9.9", keys::IP_PREFIX), "{not json"])
            .unwrap();
        let kv2 = n2.kv.clone();
        eventually("garbage seen", move || kv2.ips.lock().len() == 3).await;
        assert_eq!(n2.kv.remote_endpoints(&BTreeSet::new()).len(), 1);

        // Someone deletes n1's keys: n1 writes them again.
        let ip_key = keys::ip_key("10.1.0.5".parse().unwrap());
        let value_key = keys::value_key(&web_key, "192.0.2.1");
        etcd.etcdctl(&["del", &ip_key]).unwrap();
        etcd.etcdctl(&["del", &value_key]).unwrap();
        etcd.etcdctl(&["put", &keys::ip_key("192.0.2.1".parse().unwrap()), "{}"])
            .unwrap();
        let e = etcd.clone();
        let (ik, vk) = (ip_key.clone(), value_key.clone());
        eventually("n1's keys written again", move || {
            e.keys(&ik).map(|k| k.len()).unwrap_or(0) == 1
                && e.keys(&vk).map(|k| k.len()).unwrap_or(0) == 1
                && e.etcdctl(&[
                    "get",
                    "--print-value-only",
                    &keys::ip_key("192.0.2.1".parse().unwrap()),
                ])
                .is_ok_and(|v| v.contains("\"ID\":1"))
        })
        .await;

        // etcd killed: what is known keeps working, a new label set fails within the
        // allocation timeout, naming etcd; the status says so.
        etcd.kill();
        assert_eq!(n2.kv.number(&web).await, Ok(id));
        let db: Labels = "k8s:app=db,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let err = n2.kv.number(&db).await.expect_err("etcd is away");
        assert!(
            err.contains("kvstore-allocation-timeout") && err.contains(&etcd.url()),
            "{err}"
        );
        let kv2 = n2.kv.clone();
        eventually("status says unreachable", move || {
            kv2.note()
                .is_some_and(|n| n.contains("unreachable") && n.contains("last error"))
        })
        .await;
        assert_eq!(
            n2.kv.remote_endpoints(&BTreeSet::new()).len(),
            1,
            "cached entries stay"
        );

        // etcd back: allocation works again, everything converges.
        etcd.restart().unwrap();
        let db_id = n2
            .kv
            .number(&db)
            .await
            .expect("numbered after etcd is back");
        assert_ne!(db_id, id);
        let kv1 = n1.kv.clone();
        let db_key = keys::labels_key(&db);
        eventually("n1 learns db", move || {
            kv1.known_number(&db_key) == Some(db_id)
        })
        .await;
        let kv1 = n1.kv.clone();
        eventually("n1 connected again", move || {
            kv1.note().is_some_and(|n| n.contains("connected"))
        })
        .await;

        // n1 dies (its loops stop, its lease is no longer kept alive): when the lease
        // expires, its ip entries and identity references are gone for the others.
        drop(n1);
        let kv2 = n2.kv.clone();
        eventually("n1's entries expire with its lease", move || {
            kv2.remote_endpoints(&BTreeSet::new()).is_empty()
        })
        .await;
        assert!(etcd.keys(&value_key).unwrap().is_empty());
        // The number itself stays (no lease), for the operator's GC to judge.
        assert_eq!(etcd.keys(&keys::id_key(id)).unwrap().len(), 1);
    });
}

#[test]
fn the_gc_deletes_identities_no_node_uses_after_two_rounds() {
    with_etcd(|etcd| async move {
        let long = Duration::from_secs(60);
        let n1 = node(&etcd, "n1", long, long);
        let mut client = etcd_client::Client::connect([etcd.url()], None)
            .await
            .unwrap();
        let mut gc = cellium_kvstore::IdentityGc::new();
        let web: Labels = "k8s:app=web,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let id = n1.kv.number(&web).await.unwrap();
        // Two numbers nobody uses, written by hand; one of them gets a user between rounds.
        etcd.etcdctl(&["put", &keys::id_key(40000), "k8s:app=stray;"])
            .unwrap();
        etcd.etcdctl(&["put", &keys::id_key(40001), "k8s:app=late;"])
            .unwrap();
        let first = gc.round(&mut client).await.unwrap();
        assert_eq!((first.in_use, first.marked), (1, 2), "{first:?}");
        assert!(
            first.deleted.is_empty(),
            "nothing deleted in the first round"
        );
        etcd.etcdctl(&[
            "put",
            &keys::value_key("k8s:app=late;", "192.0.2.9"),
            "40001",
        ])
        .unwrap();
        let second = gc.round(&mut client).await.unwrap();
        assert_eq!(second.deleted, [40000]);
        assert_eq!(second.in_use, 2);
        assert_eq!(
            etcd.keys(&keys::id_key(40001)).unwrap().len(),
            1,
            "used again: kept"
        );

        // The node stops using web: gone after two more rounds; the node numbering it again
        // writes it again.
        let numbering = cellium_kvstore::KvNumbering::provide(n1.kv.clone());
        numbering.release(&web, id);
        let e = etcd.clone();
        let vk = keys::value_key(&keys::labels_key(&web), "192.0.2.1");
        eventually("the reference deleted", move || {
            e.keys(&vk).map(|k| k.is_empty()).unwrap_or(false)
        })
        .await;
        assert!(gc.round(&mut client).await.unwrap().deleted.is_empty());
        assert_eq!(gc.round(&mut client).await.unwrap().deleted, [id]);
        let again = n1.kv.number(&web).await.unwrap();
        let e = etcd.clone();
        eventually("the number exists again", move || {
            e.keys(&keys::id_key(again))
                .map(|k| k.len() == 1)
                .unwrap_or(false)
        })
        .await;
    });
}

/// An `id/` key of a number a node holds, rewritten with other labels (a forgery: the node's
/// `value/` key for the number is on its lease, so no GC freed it): the node puts its labels
/// back, keeps its numbering, gives the forged labels nothing, and counts it.
#[test]
fn a_forged_id_key_of_a_number_a_node_holds_is_put_back_and_not_believed() {
    with_etcd(|etcd| async move {
        let n1 = node(&etcd, "n1", Duration::from_secs(15), Duration::from_secs(2));
        let web: Labels = "k8s:app=web,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let evil: Labels = "k8s:app=evil,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let (web_key, evil_key) = (keys::labels_key(&web), keys::labels_key(&evil));
        let id = n1.kv.number(&web).await.expect("numbered");
        let id_key = keys::id_key(id);
        etcd.etcdctl(&["put", &id_key, &evil_key]).unwrap();
        let (e, k, w) = (etcd.clone(), id_key.clone(), web_key.clone());
        let kv1 = n1.kv.clone();
        eventually("n1 puts web's labels back", move || {
            e.etcdctl(&["get", "--print-value-only", &k])
                .is_ok_and(|v| v.trim() == w)
                && kv1
                    .note()
                    .is_some_and(|n| n.contains(", 1 forged identity keys put back"))
        })
        .await;
        assert_eq!(n1.kv.known_number(&web_key), Some(id));
        assert_ne!(n1.kv.known_number(&evil_key), Some(id));
        assert_eq!(n1.kv.number(&evil).await.map(|n| n != id), Ok(true));
    });
}

/// Labels whose first probe number is `n`: the labels another node would number `n` once it
/// is free.
fn labels_first_probing(n: u32) -> Labels {
    (0..10_000_000)
        .map(|i| {
            format!("k8s:app=taker-{i},k8s:io.kubernetes.pod.namespace=demo")
                .parse::<Labels>()
                .expect("labels")
        })
        .find(|l| keys::probe_sequence(&keys::labels_key(l)).next() == Some(n))
        .expect("some labels probe it first")
}

/// Cuts `node` off (its loops stopped, its state kept) and revokes its lease, as etcd does
/// when a partition outlasts it: its `value/` references go.
async fn partition(etcd: &Etcd, node: &mut Node) {
    node.task.abort();
    let lease = node.kv.lease_id().expect("a lease");
    etcd.etcdctl(&["lease", "revoke", &format!("{lease:x}")])
        .expect("revoked");
}

/// The value of `key`, empty when absent.
fn value_of(etcd: &Etcd, key: &str) -> String {
    etcd.etcdctl(&["get", "--print-value-only", key])
        .expect("get")
        .trim()
        .to_string()
}

/// A partition longer than the lease: the node's references went with it. A number another
/// node took meanwhile (freed by the GC, then allocated for other labels) is given up: its
/// labels are numbered again, the number is told to be retired, and the other node's keys are
/// left alone. A number whose `id/` key was rewritten meanwhile with labels no node uses is a
/// forgery: put back with the node's reference.
#[test]
fn numbers_taken_during_a_partition_are_given_up_and_forged_ones_put_back() {
    with_etcd(|etcd| async move {
        let ttl = Duration::from_secs(15);
        let mut n1 = node(&etcd, "n1", ttl, Duration::from_secs(5));
        let n2 = node(&etcd, "n2", ttl, Duration::from_secs(5));
        let web: Labels = "k8s:app=web,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let db: Labels = "k8s:app=db,k8s:io.kubernetes.pod.namespace=demo"
            .parse()
            .unwrap();
        let (web_key, db_key) = (keys::labels_key(&web), keys::labels_key(&db));
        let web_id = n1.kv.number(&web).await.expect("web numbered");
        let db_id = n1.kv.number(&db).await.expect("db numbered");
        let (web_ref, db_ref) = (
            keys::value_key(&web_key, "192.0.2.1"),
            keys::value_key(&db_key, "192.0.2.1"),
        );
        let e = etcd.clone();
        let refs = [web_ref.clone(), db_ref.clone()];
        eventually("n1's references written", move || {
            refs.iter().all(|r| e.keys(r).is_ok_and(|k| k.len() == 1))
        })
        .await;

        partition(&etcd, &mut n1).await;
        assert!(
            etcd.keys(&web_ref).unwrap().is_empty(),
            "gone with the lease"
        );
        // No node uses web's number now: the GC deletes it, and n2 takes it for its labels.
        etcd.etcdctl(&["del", &keys::id_key(web_id)]).unwrap();
        let taker = labels_first_probing(web_id);
        let taker_key = keys::labels_key(&taker);
        assert_eq!(
            n2.kv.number(&taker).await,
            Ok(web_id),
            "n2 takes the number"
        );
        // db's number rewritten with labels nobody uses.
        let forged = "k8s:app=forged;";
        etcd.etcdctl(&["put", &keys::id_key(db_id), forged])
            .unwrap();

        // The partition heals.
        n1.task = tokio::spawn(n1.kv.clone().run());
        let kv1 = n1.kv.clone();
        eventually("n1 finds web's number taken", move || {
            kv1.taken_changes().borrow().to_owned() == 1
        })
        .await;
        assert_eq!(n1.kv.take_retired(), [(web_key.clone(), web_id)]);
        assert_eq!(n1.kv.known_number(&taker_key), Some(web_id));
        assert_eq!(n1.kv.known_number(&web_key), None);
        let e = etcd.clone();
        let (db_ref2, db_key2) = (db_ref.clone(), db_key.clone());
        eventually("n1 puts db's labels back, with its reference", move || {
            value_of(&e, &keys::id_key(db_id)) == db_key2
                && value_of(&e, &db_ref2) == db_id.to_string()
        })
        .await;
        assert!(
            etcd.keys(&web_ref).unwrap().is_empty(),
            "not written for a taken number"
        );

        // web gets a new number; n2's keys are untouched.
        let again = n1.kv.number(&web).await.expect("web numbered again");
        assert_ne!(again, web_id);
        assert_eq!(value_of(&etcd, &keys::id_key(again)), web_key);
        assert_eq!(value_of(&etcd, &keys::id_key(web_id)), taker_key);
        assert_eq!(
            value_of(&etcd, &keys::value_key(&taker_key, "192.0.2.2")),
            web_id.to_string()
        );
        let note = n1.kv.note().unwrap_or_default();
        assert!(
            note.contains(", 1 forged identity keys put back, 1 identities re-allocated"),
            "{note}"
        );
        // The old number's last holder lets go: web's new reference stays.
        let numbering = cellium_kvstore::KvNumbering::provide(n1.kv.clone());
        numbering.release(&web, web_id);
        assert!(n1.kv.keeps(&web_ref));
        let e = etcd.clone();
        eventually("web's new reference written", move || {
            value_of(&e, &web_ref) == again.to_string()
        })
        .await;
    });
}

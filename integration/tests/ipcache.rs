//! Privileged tests of the ipcache's mirror into the datapath's `cel_ipcache`, with the
//! cells run as the agent runs them: a hive of `loader` and `ipcache`, in a network
//! namespace of its own, on a private bpffs. Run as root:
//! `cargo test -p cellium-integration --test ipcache`.
//!
//! What a user would see: claims reach the map as they are made (the one of highest
//! precedence), the node's addresses are host entries, a restarted agent keeps the previous
//! run's entries until `prune_stale`, which removes exactly those nobody claimed again.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellium_datapath_bpf::IpNet;
use cellium_hive::{ConfigSources, Hive, Module};
use cellium_integration::{BpffsMount, NetNs, serial};
use cellium_ipcache::{Ipcache, Source};
use cellium_loader::Loader;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// A node namespace whose `cellium_host` device (a veth pair within the namespace, as
/// Cilium's `cilium_host`/`cilium_net`) holds the router addresses.
fn node() -> NetNs {
    let ns = NetNs::new().expect("netns");
    ns.ip(&[
        "link",
        "add",
        "cellium_host",
        "type",
        "veth",
        "peer",
        "name",
        "cellium_net",
    ])
    .expect("host device");
    ns.ip(&["addr", "add", "10.200.0.1/24", "dev", "cellium_host"])
        .expect("ipv4 address");
    ns.ip(&[
        "addr",
        "add",
        "fd00:200::1/64",
        "dev",
        "cellium_host",
        "nodad",
    ])
    .expect("ipv6 address");
    ns.ip(&["link", "set", "cellium_host", "up"])
        .expect("link up");
    ns
}

/// An agent made of the cells under test, started.
struct Agent {
    hive: Hive,
    ipcache: Arc<Ipcache>,
    loader: Arc<Loader>,
}

impl Agent {
    async fn start(bpf: &BpffsMount, sync_interval: &str) -> Agent {
        type Slot = Arc<Mutex<Option<(Arc<Ipcache>, Arc<Loader>)>>>;
        let slot: Slot = Arc::default();
        let s = slot.clone();
        let mut hive = Hive::new([
            cellium_loader::cell().into(),
            cellium_ipcache::cell().into(),
            Module::new("probe", "Takes the cells under test")
                .invoke(move |ipc: Arc<Ipcache>, loader: Arc<Loader>| {
                    *s.lock().unwrap() = Some((ipc, loader))
                })
                .into(),
        ])
        .with_config(
            ConfigSources::new()
                .flag("bpf-root", bpf.path())
                .flag("ipcache-sync-interval", sync_interval),
        );
        hive.start().await.expect("agent start");
        let (ipcache, loader) = slot.lock().unwrap().take().expect("cells built");
        Agent {
            hive,
            ipcache,
            loader,
        }
    }

    /// The map's entries.
    fn map(&self) -> BTreeMap<IpNet, u32> {
        let dp = self.loader.datapath().expect("datapath");
        dp.ipcache()
            .entries()
            .expect("map entries")
            .into_iter()
            .map(|(net, info)| (net, info.identity))
            .collect()
    }

    /// What the ipcache wants the map to hold.
    fn desired(&self) -> BTreeMap<IpNet, u32> {
        self.ipcache
            .list()
            .into_iter()
            .map(|e| (e.prefix, e.identity))
            .collect()
    }

    fn resolve(&self, ip: &str) -> Option<u32> {
        let ip: IpAddr = ip.parse().unwrap();
        let dp = self.loader.datapath().expect("datapath");
        dp.ipcache().resolve(ip).expect("map lookup")
    }

    async fn wait_for(&self, what: &str, f: impl Fn(&Agent) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f(self) {
            assert!(Instant::now() < deadline, "never happened: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        self.hive.stop().await.expect("agent stop");
    }
}

/// Runs `scenario` on a multi-threaded runtime whose threads all live in `ns`: threads
/// inherit the namespace of the thread that creates them.
fn in_netns<F>(ns: &NetNs, scenario: F)
where
    F: FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> + Send + 'static,
{
    ns.run(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(scenario());
    })
    .expect("the scenario failed (its panic is printed above)");
}

#[test]
fn claims_reach_the_map_and_a_restart_prunes_only_what_nobody_claimed() {
    let _serial = serial();
    let ns = node();
    let bpf = Arc::new(BpffsMount::new().expect("bpffs"));
    let b = bpf.clone();
    in_netns(&ns, move || {
        Box::pin(async move {
            let bpf = b;
            let agent = Agent::start(&bpf, "1h").await;
            // The node's addresses are host entries, read at start.
            agent
                .wait_for("the node's addresses in the map", |a| {
                    a.map().get(&net("10.200.0.1/32")) == Some(&1)
                        && a.map().get(&net("fd00:200::1/128")) == Some(&1)
                })
                .await;
            assert!(!agent.map().contains_key(&net("127.0.0.1/32")));

            let ipc = &agent.ipcache;
            let pod = net("10.200.0.5/32");
            ipc.upsert(net("192.168.0.0/16"), 16_777_216, Source::Policy)
                .unwrap();
            ipc.upsert(pod, 16_777_217, Source::Policy).unwrap();
            ipc.upsert(pod, 300, Source::Endpoint).unwrap();
            // Written before upsert returned: no waiting.
            assert_eq!(agent.map().get(&pod), Some(&300));
            assert_eq!(agent.resolve("10.200.0.5"), Some(300));
            assert_eq!(agent.resolve("192.168.3.4"), Some(16_777_216));
            assert_eq!(agent.resolve("172.16.0.1"), None);
            // Deleting the endpoint's claim reveals the policy's, in the map too.
            assert!(ipc.delete(pod, Source::Endpoint).unwrap());
            assert_eq!(agent.map().get(&pod), Some(&16_777_217));
            ipc.upsert(pod, 300, Source::Endpoint).unwrap();
            assert_eq!(agent.map(), agent.desired());

            // Something a previous run left behind, which this run never claims.
            let dp = agent.loader.datapath().unwrap();
            dp.ipcache().put(net("10.99.0.0/16"), 4242).unwrap();
            agent.stop().await;

            // The next run: the map is not flushed, and before prune_stale even a fast
            // sync job leaves the old entries alone.
            let agent = Agent::start(&bpf, "100ms").await;
            let ipc = &agent.ipcache;
            assert_eq!(agent.map().get(&pod), Some(&300));
            assert_eq!(agent.map().get(&net("10.99.0.0/16")), Some(&4242));
            agent
                .wait_for("the node's addresses claimed again", |a| {
                    a.desired().get(&net("10.200.0.1/32")) == Some(&1)
                })
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(agent.map().get(&net("10.99.0.0/16")), Some(&4242));
            assert_eq!(agent.resolve("10.200.0.5"), Some(300));

            // The policy repository claims its prefix again; the pod was deleted meanwhile.
            ipc.upsert(net("192.168.0.0/16"), 16_777_216, Source::Policy)
                .unwrap();
            let stats = tokio::task::spawn_blocking({
                let ipc = ipc.clone();
                move || ipc.prune_stale()
            })
            .await
            .unwrap()
            .unwrap();
            assert_eq!(stats.removed, 2, "{stats:?}");
            assert_eq!(agent.map(), agent.desired());
            assert_eq!(
                agent.resolve("10.200.0.5"),
                None,
                "the deleted pod is world now"
            );
            assert_eq!(agent.resolve("10.200.0.1"), Some(1));
            assert_eq!(agent.resolve("10.99.1.1"), None);

            // Once pruned, the sync job repairs drift both ways.
            dp_of(&agent)
                .ipcache()
                .put(net("10.98.0.0/16"), 4343)
                .unwrap();
            dp_of(&agent)
                .ipcache()
                .delete(net("192.168.0.0/16"))
                .unwrap();
            agent
                .wait_for("the sync job repairs the map", |a| a.map() == a.desired())
                .await;
            agent.stop().await;
        })
    });
}

fn dp_of(agent: &Agent) -> Arc<cellium_datapath_bpf::Datapath> {
    agent.loader.datapath().expect("datapath")
}

#[test]
fn node_addresses_follow_the_namespace() {
    let _serial = serial();
    let ns = Arc::new(node());
    let bpf = Arc::new(BpffsMount::new().expect("bpffs"));
    let (n, b) = (ns.clone(), bpf.clone());
    in_netns(&ns, move || {
        Box::pin(async move {
            let (ns, bpf) = (n, b);
            let agent = Agent::start(&bpf, "1h").await;
            agent
                .wait_for("the first read", |a| {
                    a.map().get(&net("10.200.0.1/32")) == Some(&1)
                })
                .await;
            // An address added later arrives with the refresh the endpoint manager asks for.
            ns.ip(&["addr", "add", "10.201.0.1/32", "dev", "cellium_host"])
                .unwrap();
            agent.ipcache.refresh_host_addresses();
            agent
                .wait_for("the new address", |a| {
                    a.map().get(&net("10.201.0.1/32")) == Some(&1)
                })
                .await;
            // A pod's claim on the same address wins; a removed address leaves the map.
            agent
                .ipcache
                .upsert(net("10.201.0.1/32"), 300, Source::Endpoint)
                .unwrap();
            assert_eq!(agent.resolve("10.201.0.1"), Some(300));
            agent
                .ipcache
                .delete(net("10.201.0.1/32"), Source::Endpoint)
                .unwrap();
            ns.ip(&["addr", "del", "10.201.0.1/32", "dev", "cellium_host"])
                .unwrap();
            let n = agent.ipcache.sync_host_addresses().await.unwrap();
            assert_eq!(n, 2, "10.200.0.1 and fd00:200::1");
            assert_eq!(agent.resolve("10.201.0.1"), None);
            assert_eq!(agent.map(), agent.desired());
            agent.stop().await;
        })
    });
}

//! A mini agent built from a few cells: the shape of `cellium-agent`, without
//! networking.
//!
//! ```text
//! cargo run -p cellium-hive --example mini_agent                 # run 3 seconds
//! cargo run -p cellium-hive --example mini_agent -- --describe   # modules, config, order
//! cargo run -p cellium-hive --example mini_agent -- --dot | dot -Tsvg > hive.svg
//! MINI_POD_CIDR=10.9.0.0/30 cargo run -p cellium-hive --example mini_agent -- --max-pods=3
//! cargo run -p cellium-hive --example mini_agent -- --forever    # until Ctrl-C
//! ```
//!
//! The cells, in the order a reader meets them:
//! - `resources`: a table of pods with change notifications, fed by a timer job
//!   that invents a pod every 300ms (standing in for the Kubernetes watchers).
//! - `ipam`: owns the `pod-cidr` and `max-pods` keys; allocates addresses. It
//!   only provides: nothing is built unless someone needs it.
//! - `endpoint-manager`: observes pod events, allocates an address per pod and
//!   reports its health per endpoint count; Degraded when the pool is empty.
//! - `api`: the driving cell: its invoke needs the endpoint manager, which
//!   pulls in everything else, and a value group of status sources.
//!
//! With a tiny pool (`MINI_POD_CIDR=10.9.0.0/30`) the endpoint manager turns
//! Degraded, which the health tree printed at the end shows.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_hive::{
    Config, ConfigSources, Health, Hive, Hook, Jobs, Lifecycle, Module, Reporter, Trigger,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

// ---------------------------------------------------------------- resources

/// The desired state: pod name -> labels.
struct PodStore {
    pods: Mutex<BTreeMap<String, String>>,
    events: broadcast::Sender<String>,
}

impl PodStore {
    fn new(jobs: Jobs) -> Arc<PodStore> {
        let store = Arc::new(PodStore {
            pods: Mutex::default(),
            events: broadcast::channel(64).0,
        });
        let feed = store.clone();
        let mut n = 0;
        jobs.timer("feed", Duration::from_millis(300), move |_ctx| {
            n += 1;
            feed.apply(format!("pod-{n}"));
            async { Ok(()) }
        })
        .add();
        store
    }

    fn apply(&self, name: String) {
        self.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), "app=demo".into());
        // No subscriber yet is fine: they read the table when they start.
        let _ = self.events.send(name);
    }
}

fn resources() -> Module {
    Module::new(
        "resources",
        "Holds the node's desired state (pods) and announces changes",
    )
    .provide(PodStore::new)
}

// --------------------------------------------------------------------- ipam

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct IpamConfig {
    /// The pools to allocate from (`MINI_POD_CIDR=a,b` in the environment).
    pod_cidr: Vec<String>,
    /// At most this many allocations.
    max_pods: u32,
}

impl Default for IpamConfig {
    fn default() -> Self {
        IpamConfig {
            pod_cidr: vec!["10.0.0.0/24".into()],
            max_pods: 110,
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum IpamError {
    #[error("invalid pod CIDR `{0}`: expected a.b.c.d/len")]
    BadCidr(String),
}

struct Ipam {
    free: Mutex<Vec<Ipv4Addr>>,
    allocated: Mutex<BTreeMap<String, Ipv4Addr>>,
}

impl Ipam {
    /// Validates and allocates only: no work before start.
    fn new(cfg: Config<IpamConfig>, lc: Lifecycle) -> Result<Arc<Ipam>, IpamError> {
        let mut free = Vec::new();
        for cidr in &cfg.pod_cidr {
            let (addr, len) = cidr
                .split_once('/')
                .and_then(|(a, l)| Some((a.parse::<Ipv4Addr>().ok()?, l.parse::<u32>().ok()?)))
                .filter(|(_, l)| (16..=32).contains(l))
                .ok_or_else(|| IpamError::BadCidr(cidr.clone()))?;
            let base = u32::from(addr);
            // Skip the network and broadcast addresses.
            for host in 1..(1u32 << (32 - len)).saturating_sub(1) {
                free.push(Ipv4Addr::from(base + host));
            }
        }
        free.truncate(cfg.max_pods as usize);
        free.reverse();
        let ipam = Arc::new(Ipam {
            free: Mutex::new(free),
            allocated: Mutex::default(),
        });
        lc.append(Hook::new("restore").on_start(|_ctx| async {
            // A real IPAM re-reserves the addresses of restored endpoints here,
            // before the endpoint manager serves any request.
            Ok(())
        }));
        Ok(ipam)
    }

    fn allocate(&self, owner: &str) -> Option<Ipv4Addr> {
        let ip = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        self.allocated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(owner.into(), ip);
        Some(ip)
    }
}

fn ipam() -> Module {
    Module::new("ipam", "Allocates pod IPs from the node's pod CIDRs")
        .config::<IpamConfig>()
        .provide(Ipam::new)
        .contribute(|ipam: Arc<Ipam>| Arc::new(IpamStatus(ipam)) as Arc<dyn StatusSource>)
}

// --------------------------------------------------------- endpoint-manager

struct EndpointManager {
    endpoints: Mutex<BTreeMap<String, Ipv4Addr>>,
}

impl EndpointManager {
    fn new(
        store: Arc<PodStore>,
        ipam: Arc<Ipam>,
        jobs: Jobs,
        health: Reporter,
    ) -> Arc<EndpointManager> {
        let em = Arc::new(EndpointManager {
            endpoints: Mutex::default(),
        });
        let rx = store.events.subscribe();
        let events = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(name) => return Some((name, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        let m = em.clone();
        jobs.observer("pods", events, move |pod: String, _ctx| {
            let result = match ipam.allocate(&pod) {
                Some(ip) => {
                    let mut eps = m.endpoints.lock().unwrap_or_else(|p| p.into_inner());
                    eps.insert(pod, ip);
                    health.ok(format!("{} endpoints", eps.len()));
                    Ok(())
                }
                None => {
                    health.degraded(format!("no address left for {pod}"));
                    Err(format!("pool exhausted at {pod}").into())
                }
            };
            async move { result }
        })
        .add();
        em
    }
}

fn endpoint_manager() -> Module {
    Module::new(
        "endpoint-manager",
        "Creates an endpoint with an address for each pod",
    )
    .provide(EndpointManager::new)
}

// ---------------------------------------------------------------------- api

/// Something that can say how it is doing; cells contribute them.
trait StatusSource: Send + Sync {
    fn status(&self) -> String;
}

struct IpamStatus(Arc<Ipam>);

impl StatusSource for IpamStatus {
    fn status(&self) -> String {
        let used = self.0.allocated.lock().map(|a| a.len()).unwrap_or(0);
        let free = self.0.free.lock().map(|f| f.len()).unwrap_or(0);
        format!("ipam: {used} allocated, {free} free")
    }
}

fn api() -> Module {
    Module::new("api", "Reports the agent's status, as the gRPC API would").invoke(
        |em: Arc<EndpointManager>,
         sources: Vec<Arc<dyn StatusSource>>,
         jobs: Jobs,
         health: Health| {
            let resync = Trigger::new();
            jobs.timer("report", Duration::from_secs(1), move |_ctx| {
                let n = em.endpoints.lock().map(|e| e.len()).unwrap_or(0);
                let lines: Vec<String> = sources.iter().map(|s| s.status()).collect();
                println!(
                    "[api] {n} endpoints; {}; agent {}",
                    lines.join("; "),
                    health.level()
                );
                async { Ok(()) }
            })
            .trigger(resync.clone())
            .add();
            // Report once at start too, not only after the first interval.
            resync.trigger();
        },
    )
}

// --------------------------------------------------------------------- main

fn cells() -> Vec<cellium_hive::Cell> {
    vec![
        Module::new(
            "agent",
            "A mini agent: the cells of cellium-agent, minus networking",
        )
        .cell(resources())
        .cell(
            Module::new("controlplane", "Turns the desired state into endpoints")
                .cell(ipam())
                .cell(endpoint_manager()),
        )
        .cell(api())
        .into(),
    ]
}

enum Mode {
    Run(Option<Duration>),
    Describe,
    Dot,
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut sources = ConfigSources::new().env("MINI_");
    let mut mode = Mode::Run(Some(Duration::from_secs(3)));
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--describe" => mode = Mode::Describe,
            "--dot" => mode = Mode::Dot,
            "--forever" => mode = Mode::Run(None),
            flag => match flag.strip_prefix("--").and_then(|f| f.split_once('=')) {
                // Every config key is a flag: `--max-pods=3`; lists take commas.
                Some((key, value)) => sources = sources.flag(key, value),
                None => {
                    eprintln!(
                        "usage: mini_agent [--describe | --dot | --forever] [--KEY=VALUE]..."
                    );
                    return ExitCode::FAILURE;
                }
            },
        }
    }

    let mut hive = Hive::new(cells()).with_config(sources);
    if let Err(e) = hive.validate() {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    match mode {
        Mode::Describe => {
            if let Err(e) = hive.populate() {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            print!("{}", hive.describe());
            ExitCode::SUCCESS
        }
        Mode::Dot => {
            print!("{}", hive.dot());
            ExitCode::SUCCESS
        }
        Mode::Run(duration) => {
            let health = hive.health();
            let shutdown = async move {
                match duration {
                    Some(d) => tokio::time::sleep(d).await,
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            };
            let printer = health.clone();
            let mut changes = health.subscribe();
            let watcher = tokio::spawn(async move {
                // Print the tree whenever a module's level changes.
                let mut last = None;
                while changes.changed().await.is_ok() {
                    let levels: Vec<_> = printer.tree().iter().map(|n| n.status.level).collect();
                    if last.as_ref() != Some(&levels) {
                        print!("[health]\n{}", printer.render());
                        last = Some(levels);
                    }
                }
            });
            let result = hive.run(shutdown).await;
            watcher.abort();
            println!("[health at exit]\n{}", health.render());
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    let mut msg = e.to_string();
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        msg.push_str(&format!(": {s}"));
                        source = s.source();
                    }
                    eprintln!("{msg}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

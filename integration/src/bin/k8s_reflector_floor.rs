//! `cellium-k8s-reflector-floor`: the floor the Kubernetes benchmark measures the agent
//! against (see `integration/bench/k8s.sh` and docs/performance.md, "Kubernetes mode").
//!
//! A bare kube-runtime program: one `reflector` over one `watcher` per kind the agent watches
//! (Namespaces, this node's Pods by `spec.nodeName`, Nodes, Services, EndpointSlices,
//! NetworkPolicies, CiliumNetworkPolicies, CiliumClusterwideNetworkPolicies), with the
//! watcher's default configuration as the agent's, and nothing else: it exits as soon as every
//! store is ready (`wait_until_ready`, the first complete list of each kind). The built-in
//! kinds are k8s-openapi's types; the two Cilium kinds, which have none there, are dynamic
//! objects.
//!
//! With `--dynamic`, every kind is listed as dynamic objects and each object is also converted
//! into a `serde_json::Value`, as the agent's watchers do for Cilium's kinds before their feed
//! parses them (the built-in kinds are decoded once, into their k8s-openapi types): the floor
//! with dynamic decoding, to tell what decoding once saves.
//!
//! Prints one line, `objects <kind>=<count> ... rss_kib=<VmRSS> elapsed_ms=<from main>`.

use std::fmt::Debug;
use std::hash::Hash;

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Lists every kind the agent watches into kube-runtime stores, and exits once all are ready.
#[derive(Debug, Parser)]
#[command(name = "cellium-k8s-reflector-floor")]
struct Cli {
    /// The API server (`http://host:port`).
    #[arg(long)]
    server: String,
    /// The node whose pods are listed (`spec.nodeName`).
    #[arg(long)]
    node: String,
    /// Every kind as dynamic objects, each also converted into JSON (the agent's decoding of
    /// Cilium's kinds).
    #[arg(long)]
    dynamic: bool,
}

/// What is left once a store is ready: how many objects it holds.
type Count = BoxFuture<'static, Result<(&'static str, usize)>>;

fn main() -> Result<()> {
    let began = std::time::Instant::now();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let counts = runtime.block_on(run(&cli))?;
    let rss = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_default();
    let listed: Vec<String> = counts.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!(
        "objects {} rss_kib={rss} elapsed_ms={:.1}",
        listed.join(" "),
        began.elapsed().as_secs_f64() * 1e3
    );
    // The reflectors' tasks are not waited for: the floor ends at the lists.
    runtime.shutdown_background();
    Ok(())
}

async fn run(cli: &Cli) -> Result<Vec<(&'static str, usize)>> {
    let uri: http::Uri = cli.server.parse().context("--server")?;
    let client = Client::try_from(kube::Config::new(uri))?;
    let pods = watcher::Config::default().fields(&format!("spec.nodeName={}", cli.node));
    let all = watcher::Config::default;
    let dynamic = |api_version: &str, kind: &str, plural: &str| {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    };
    let stores: Vec<Count> = if cli.dynamic {
        let kinds = [
            ("v1", "Namespace", "namespaces"),
            ("v1", "Pod", "pods"),
            ("v1", "Node", "nodes"),
            ("v1", "Service", "services"),
            ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
            ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
            (
                "cilium.io/v2",
                "CiliumNetworkPolicy",
                "ciliumnetworkpolicies",
            ),
            (
                "cilium.io/v2",
                "CiliumClusterwideNetworkPolicy",
                "ciliumclusterwidenetworkpolicies",
            ),
        ];
        kinds
            .into_iter()
            .map(|(api_version, kind, plural)| {
                let ar = dynamic(api_version, kind, plural);
                let api = Api::all_with(client.clone(), &ar);
                let config = if kind == "Pod" { pods.clone() } else { all() };
                reflect::<DynamicObject>(kind, api, ar, config, true)
            })
            .collect()
    } else {
        vec![
            reflect::<Namespace>("Namespace", Api::all(client.clone()), (), all(), false),
            reflect::<Pod>("Pod", Api::all(client.clone()), (), pods, false),
            reflect::<Node>("Node", Api::all(client.clone()), (), all(), false),
            reflect::<Service>("Service", Api::all(client.clone()), (), all(), false),
            reflect::<EndpointSlice>("EndpointSlice", Api::all(client.clone()), (), all(), false),
            reflect::<NetworkPolicy>("NetworkPolicy", Api::all(client.clone()), (), all(), false),
            {
                let ar = dynamic(
                    "cilium.io/v2",
                    "CiliumNetworkPolicy",
                    "ciliumnetworkpolicies",
                );
                let api = Api::all_with(client.clone(), &ar);
                reflect::<DynamicObject>("CiliumNetworkPolicy", api, ar, all(), false)
            },
            {
                let ar = dynamic(
                    "cilium.io/v2",
                    "CiliumClusterwideNetworkPolicy",
                    "ciliumclusterwidenetworkpolicies",
                );
                let api = Api::all_with(client.clone(), &ar);
                reflect::<DynamicObject>("CiliumClusterwideNetworkPolicy", api, ar, all(), false)
            },
        ]
    };
    futures::future::try_join_all(stores).await
}

/// Starts a reflector of `api` on its own task (each object also converted into JSON when
/// `convert`); the future ends once its store is ready.
fn reflect<K>(
    kind: &'static str,
    api: Api<K>,
    dyntype: K::DynamicType,
    config: watcher::Config,
    convert: bool,
) -> Count
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype);
    let store: Store<K> = writer.as_reader();
    let events = watcher::watcher(api, config)
        .default_backoff()
        .inspect_ok(move |event| {
            if let (true, Event::InitApply(obj) | Event::Apply(obj)) = (convert, event) {
                std::hint::black_box(serde_json::to_value(obj).ok());
            }
        });
    let stream = reflector::reflector(writer, events);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                eprintln!("{kind}: {e}");
            }
        }
    });
    Box::pin(async move {
        if store.wait_until_ready().await.is_err() {
            bail!("the {kind} reflector ended before its first list");
        }
        Ok((kind, store.state().len()))
    })
}

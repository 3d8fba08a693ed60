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
//! Prints one line, `objects <kind>=<count> ... rss_kib=<VmRSS> elapsed_ms=<from main>`.

use std::fmt::Debug;
use std::hash::Hash;

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
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
    let cilium = |kind: &str, plural: &str| ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let stores: Vec<Count> = vec![
        reflect::<Namespace>("Namespace", Api::all(client.clone()), (), all()),
        reflect::<Pod>("Pod", Api::all(client.clone()), (), pods),
        reflect::<Node>("Node", Api::all(client.clone()), (), all()),
        reflect::<Service>("Service", Api::all(client.clone()), (), all()),
        reflect::<EndpointSlice>("EndpointSlice", Api::all(client.clone()), (), all()),
        reflect::<NetworkPolicy>("NetworkPolicy", Api::all(client.clone()), (), all()),
        {
            let ar = cilium("CiliumNetworkPolicy", "ciliumnetworkpolicies");
            let api = Api::all_with(client.clone(), &ar);
            reflect::<DynamicObject>("CiliumNetworkPolicy", api, ar, all())
        },
        {
            let ar = cilium(
                "CiliumClusterwideNetworkPolicy",
                "ciliumclusterwidenetworkpolicies",
            );
            let api = Api::all_with(client.clone(), &ar);
            reflect::<DynamicObject>("CiliumClusterwideNetworkPolicy", api, ar, all())
        },
    ];
    futures::future::try_join_all(stores).await
}

/// Starts a reflector of `api` on its own task; the future ends once its store is ready.
fn reflect<K>(
    kind: &'static str,
    api: Api<K>,
    dyntype: K::DynamicType,
    config: watcher::Config,
) -> Count
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype);
    let store: Store<K> = writer.as_reader();
    let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
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

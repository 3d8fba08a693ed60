//! `cellium-cluster-demo`: the cluster demo that `scripts/demo-cluster.sh` runs (root). Three
//! node namespaces on an underlay bridge, the test API server, `cellium-operator` giving each
//! node its pod CIDR from a cluster pool, one `cellium-agent` per node in `routing-mode`
//! `tunnel` (or `native` with `--routing-mode native`), pods on every node through
//! `cellium-cni`, and then, printed as it goes: traffic across nodes, a NetworkPolicy applied
//! with kubectl that one pod's traffic meets and another's does not, and a ClusterIP service
//! balancing over backends on two other nodes. Everything it made is removed when it ends, on
//! failure too (the testbed's guards).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cellium_integration::cluster::{Cluster, ClusterOptions, Ipam, RoutingMode};
use cellium_integration::probe::{TcpServer, tcp_request};
use cellium_integration::reach::Probe;
use cellium_integration::shop::WEB_FROM_CLIENT;
use clap::Parser;

const PORT: u16 = 8080;

/// A ClusterIP over the web pods, with the EndpointSlice the endpointslice controller of a
/// real control plane would write (the test API server runs no controllers).
fn web_service(backends: &[(IpAddr, String)]) -> String {
    let endpoints: String = backends
        .iter()
        .map(|(ip, node)| {
            format!(
                "- {{ addresses: [ \"{ip}\" ], conditions: {{ ready: true }}, nodeName: {node} }}\n"
            )
        })
        .collect();
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: shop }}
spec: {{ selector: {{ app: web }}, ports: [ {{ name: http, port: 80, targetPort: http }} ] }}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{ name: web-1, namespace: shop, labels: {{ kubernetes.io/service-name: web }} }}
addressType: IPv4
ports: [ {{ name: http, port: {PORT}, protocol: TCP }} ]
endpoints:
{endpoints}"#
    )
}

#[derive(Parser)]
struct Cli {
    /// `tunnel` (VXLAN between the nodes) or `native` (routes between them).
    #[arg(long, default_value = "tunnel")]
    routing_mode: String,
}

fn say(text: &str) {
    println!("\n\x1b[1m# {text}\x1b[0m");
}

fn main() -> Result<()> {
    let mode = match Cli::parse().routing_mode.as_str() {
        "tunnel" => RoutingMode::Tunnel,
        "native" => RoutingMode::Native,
        other => bail!("--routing-mode {other:?}: tunnel or native"),
    };
    say(&format!(
        "three nodes, the API server, the operator, an agent per node (routing-mode {})",
        mode.as_str()
    ));
    let mut cluster = Cluster::start(ClusterOptions {
        nodes: 3,
        routing_mode: mode,
        ipam: Ipam::ClusterPool {
            cidr: "10.246.0.0/16".into(),
            mask_size: 24,
        },
        operators: 1,
        ..ClusterOptions::default()
    })
    .context("the cluster")?;
    let result = demo(&mut cluster);
    if result.is_err() {
        eprintln!("{}", cluster.logs());
    }
    result
}

fn demo(cluster: &mut Cluster) -> Result<()> {
    let cidrs =
        r#"jsonpath={range .items[*]}{.metadata.name}: pod CIDRs {.spec.ipam.podCIDRs}{"\n"}{end}"#;
    let nodes = cluster
        .api()
        .kubectl(&["get", "ciliumnodes", "-o", cidrs], "")?;
    print!("the operator's CiliumNodes:\n{nodes}");

    say("pods through cellium-cni: client and stranger on node 1, web on nodes 2 and 3");
    cluster.namespace("shop", "")?;
    cluster.add_pod(0, "shop/client", "app=client", &[])?;
    cluster.add_pod(0, "shop/stranger", "app=stranger", &[])?;
    let http = [("http", PORT, "TCP")];
    cluster.add_pod(1, "shop/web-1", "app=web", &http)?;
    cluster.add_pod(2, "shop/web-2", "app=web", &http)?;
    let mut servers = Vec::new();
    for key in ["shop/web-1", "shop/web-2"] {
        let pod = cluster.pod(key)?;
        servers.push(TcpServer::start(
            &pod.netns,
            SocketAddr::new(IpAddr::V4(pod.ip), PORT),
            key,
        )?);
    }
    for pod in cluster.pods() {
        println!("{:<14} node n{}  {}", pod.key, pod.node + 1, pod.ip);
    }

    say("traffic across nodes");
    for to in ["shop/web-1", "shop/web-2"] {
        for from in ["shop/client", "shop/stranger"] {
            cluster
                .eventually(&format!("{from} reaches {to}"), || {
                    cluster.reaches(from, to, Probe::Tcp(PORT))
                })
                .map_err(anyhow::Error::msg)?;
            println!("{from} -> {to}: answered");
        }
    }

    say("a NetworkPolicy, applied with kubectl: only app=client may reach the web pods");
    cluster.apply_policy(WEB_FROM_CLIENT)?;
    for from in ["shop/client", "shop/stranger"] {
        let reached = cluster.reaches(from, "shop/web-2", Probe::Tcp(PORT));
        println!(
            "{from} -> shop/web-2: {}",
            if reached { "answered" } else { "blocked" }
        );
        if reached != (from == "shop/client") {
            bail!("the policy does not hold for {from}");
        }
    }

    say("a ClusterIP service over the web pods of nodes 2 and 3, and its EndpointSlice");
    let mut backends = Vec::new();
    for key in ["shop/web-1", "shop/web-2"] {
        let pod = cluster.pod(key)?;
        backends.push((IpAddr::V4(pod.ip), Cluster::node_name(pod.node)));
    }
    cluster.apply(&web_service(&backends))?;
    let vip: IpAddr = cluster
        .api()
        .kubectl(
            &[
                "get",
                "service",
                "web",
                "-n",
                "shop",
                "-o",
                "jsonpath={.spec.clusterIP}",
            ],
            "",
        )?
        .trim()
        .parse()
        .context("the cluster IP")?;
    let client = &cluster.pod("shop/client")?.netns;
    let mut seen = BTreeSet::new();
    cluster
        .eventually("both backends answer through the ClusterIP", || {
            if let Ok(reply) = tcp_request(client, SocketAddr::new(vip, 80), Duration::from_secs(1))
            {
                seen.insert(reply.banner);
            }
            seen.len() == 2
        })
        .map_err(anyhow::Error::msg)?;
    println!("shop/web has cluster IP {vip}");
    println!("shop/client -> {vip}:80 answered by: {seen:?}");

    say("done: everything is removed");
    drop(servers);
    Ok(())
}

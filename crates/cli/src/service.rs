//! `cellium service`: the frontends the node load-balances (cluster IPs, node ports, external
//! and load balancer IPs), and their backends.

use std::path::Path;

use cellium_api::v1::services_client::ServicesClient;
use cellium_api::v1::{ListServicesRequest, ServiceBackend, ServiceFrontend};
use serde::Serialize;

use crate::output::{self, Format};

/// `cellium service` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List every frontend (per service port: each cluster IP, node address, external IP and
    /// load balancer IP) with its kind, traffic policy, backend selection, session affinity
    /// and backends.
    List {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t)]
        output: Format,
    },
}

/// What `-o json` prints for a frontend.
#[derive(Debug, Serialize)]
struct FrontendView {
    service: String,
    port_name: String,
    kind: String,
    traffic_policy: String,
    algorithm: String,
    /// sessionAffinity ClientIP's timeout in seconds; absent without affinity.
    #[serde(skip_serializing_if = "Option::is_none")]
    affinity_timeout_seconds: Option<u32>,
    frontend: String,
    vip: String,
    port: u32,
    protocol: String,
    target_port: String,
    backends_from: String,
    rev_nat_id: u32,
    backends: Vec<BackendView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    draining: Vec<BackendView>,
    #[serde(skip_serializing_if = "String::is_empty")]
    error: String,
}

/// One backend of a frontend.
#[derive(Debug, Serialize)]
struct BackendView {
    id: u32,
    address: String,
    source: String,
}

/// Runs a `cellium service` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    let Command::List { output } = command;
    let mut client = ServicesClient::new(cellium_api::connect(socket).await?);
    let frontends =
        output::answer(client.list(ListServicesRequest {}).await, "Services.List")?.frontends;
    let views: Vec<FrontendView> = frontends.into_iter().map(view).collect();
    match output {
        Format::Json => output::print_json(&views),
        Format::Table => {
            let rows: Vec<Vec<String>> = views.iter().map(row).collect();
            output::print_table(
                &[
                    "SERVICE",
                    "PORT",
                    "KIND",
                    "POLICY",
                    "ALGORITHM",
                    "AFFINITY",
                    "FRONTEND",
                    "TARGET",
                    "FROM",
                    "BACKENDS",
                ],
                &rows,
            );
            Ok(())
        }
    }
}

/// `10.96.0.1:80`, `[fd00::1]:80`: an address and a port as one text.
fn host_port(ip: &str, port: u32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

fn view(f: ServiceFrontend) -> FrontendView {
    FrontendView {
        // The host ports of an endpoint without a pod are named after the endpoint alone.
        service: if f.namespace.is_empty() {
            f.name.clone()
        } else {
            format!("{}/{}", f.namespace, f.name)
        },
        frontend: format!("{}/{}", host_port(&f.vip, f.port), f.protocol),
        port_name: f.port_name,
        kind: f.kind,
        traffic_policy: f.traffic_policy,
        algorithm: f.algorithm,
        affinity_timeout_seconds: Some(f.affinity_timeout_seconds).filter(|t| *t > 0),
        vip: f.vip,
        port: f.port,
        protocol: f.protocol,
        target_port: f.target_port,
        backends_from: f.backends_from,
        rev_nat_id: f.rev_nat_id,
        backends: f.backends.into_iter().map(backend_view).collect(),
        draining: f.draining.into_iter().map(backend_view).collect(),
        error: f.error,
    }
}

fn backend_view(b: ServiceBackend) -> BackendView {
    BackendView {
        id: b.id,
        address: host_port(&b.ip, b.port),
        source: b.source,
    }
}

/// One line per frontend; a frontend that is not programmed shows why instead of backends.
/// Draining backends follow the others, marked `(draining)`.
fn row(v: &FrontendView) -> Vec<String> {
    let backends = if !v.error.is_empty() {
        format!("not programmed: {}", v.error)
    } else if v.backends.is_empty() && v.draining.is_empty() {
        "(none)".to_string()
    } else {
        v.backends
            .iter()
            .map(|b| b.address.clone())
            .chain(
                v.draining
                    .iter()
                    .map(|b| format!("{} (draining)", b.address)),
            )
            .collect::<Vec<_>>()
            .join(", ")
    };
    let port = if v.port_name.is_empty() {
        "-".to_string()
    } else {
        v.port_name.clone()
    };
    vec![
        v.service.clone(),
        port,
        v.kind.clone(),
        v.traffic_policy.clone(),
        v.algorithm.clone(),
        v.affinity_timeout_seconds
            .map_or("-".to_string(), |t| format!("ClientIP {t}s")),
        v.frontend.clone(),
        v.target_port.clone(),
        v.backends_from.clone(),
        backends,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_backends_or_why_there_are_none() {
        let mut f = view(ServiceFrontend {
            namespace: "shop".into(),
            name: "web".into(),
            port_name: "http".into(),
            vip: "10.96.1.1".into(),
            port: 80,
            protocol: "TCP".into(),
            target_port: "http".into(),
            backends_from: "selector".into(),
            rev_nat_id: 3,
            backends: vec![
                ServiceBackend {
                    id: 1,
                    ip: "10.244.0.5".into(),
                    port: 8080,
                    source: "endpoint 2 (shop/web-0)".into(),
                },
                ServiceBackend {
                    id: 2,
                    ip: "10.244.0.6".into(),
                    port: 8080,
                    source: "endpoint 3 (shop/web-1)".into(),
                },
            ],
            draining: vec![ServiceBackend {
                id: 3,
                ip: "10.244.0.7".into(),
                port: 8080,
                source: "EndpointSlice shop/web-1".into(),
            }],
            error: String::new(),
            kind: "NodePort".into(),
            traffic_policy: "Local".into(),
            algorithm: "maglev".into(),
            affinity_timeout_seconds: 60,
        });
        assert_eq!(
            row(&f),
            vec![
                "shop/web",
                "http",
                "NodePort",
                "Local",
                "maglev",
                "ClientIP 60s",
                "10.96.1.1:80/TCP",
                "http",
                "selector",
                "10.244.0.5:8080, 10.244.0.6:8080, 10.244.0.7:8080 (draining)"
            ]
        );
        f.backends.clear();
        assert_eq!(row(&f)[9], "10.244.0.7:8080 (draining)");
        f.draining.clear();
        assert_eq!(row(&f)[9], "(none)");
        f.error = "no rev-NAT id left".into();
        assert_eq!(row(&f)[9], "not programmed: no rev-NAT id left");
        assert_eq!(json_kind(&f), "NodePort");
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["frontend"], "10.96.1.1:80/TCP");
        assert_eq!(json["error"], "no rev-NAT id left");
        assert_eq!(json["algorithm"], "maglev");
        assert_eq!(json["affinity_timeout_seconds"], 60);
        f.affinity_timeout_seconds = None;
        assert_eq!(row(&f)[5], "-");
        assert!(
            serde_json::to_value(&f)
                .unwrap()
                .get("affinity_timeout_seconds")
                .is_none()
        );
    }

    fn json_kind(f: &FrontendView) -> String {
        let json = serde_json::to_value(f).unwrap();
        json["kind"].as_str().unwrap().to_string()
    }

    #[test]
    fn ipv6_frontends_and_backends_are_bracketed() {
        let f = view(ServiceFrontend {
            namespace: "shop".into(),
            name: "web".into(),
            vip: "fd00:96::11".into(),
            port: 80,
            protocol: "TCP".into(),
            backends: vec![ServiceBackend {
                id: 1,
                ip: "fd00:10:244::5".into(),
                port: 8080,
                source: "endpoint 2 (shop/web-0)".into(),
            }],
            ..Default::default()
        });
        assert_eq!(f.frontend, "[fd00:96::11]:80/TCP");
        assert_eq!(row(&f)[9], "[fd00:10:244::5]:8080");
    }
}

//! The `shop` app of the Kubernetes-mode tests: in namespace `shop`, pods `client` and `other`
//! on a cluster's first node and `web` (port `http`, [`PORT`]/TCP) on its second, and the
//! policies about them.

use crate::cluster::Cluster;
use crate::error::Result;
use crate::probe::TcpServer;

/// web's port `http`.
pub const PORT: u16 = 8080;

/// Only `app: client` pods, wherever they run, may reach web, on its named port `http`.
pub const WEB_FROM_CLIENT: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-client, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: client } } } ], ports: [ { port: http } ] } ]
"#;

/// `app: client` pods may only reach web, on the port web's pods name `http`.
pub const CLIENT_TO_WEB_HTTP: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: client-to-web-http, namespace: shop }
spec:
  podSelector: { matchLabels: { app: client } }
  policyTypes: [ Egress ]
  egress: [ { to: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: http } ] } ]
"#;

/// The namespace `shop`, `client` and `other` on node 0, `web` on node 1.
pub fn add_to(cluster: &mut Cluster) -> Result<()> {
    cluster.namespace("shop", "")?;
    cluster.add_pod(0, "shop/client", "app=client", &[])?;
    cluster.add_pod(0, "shop/other", "app=other", &[])?;
    cluster.add_pod(1, "shop/web", "app=web", &[("http", PORT, "TCP")])?;
    Ok(())
}

/// A TCP server on web's [`PORT`] that answers `web`, while the guard is held.
pub fn serve_web(cluster: &Cluster) -> Result<TcpServer> {
    TcpServer::start(
        &cluster.pod("shop/web")?.netns,
        cluster.pod_addr("shop/web", PORT)?,
        "web",
    )
}

//! Where the API server is and how to authenticate to it, from the configuration.

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::K8sConfig;
use crate::error::{Error, Result};

/// The configured way to reach the API server.
#[derive(Debug, Clone)]
pub(crate) enum Credentials {
    /// `k8s-api-server` alone: no credentials.
    Url(kube::Config),
    /// `k8s-kubeconfig-path`, its server replaced by `k8s-api-server` when that is set too.
    Kubeconfig {
        path: std::path::PathBuf,
        kubeconfig: Box<Kubeconfig>,
        server: Option<http::Uri>,
    },
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` set).
    InCluster(kube::Config),
}

impl Credentials {
    /// The configured credentials; `None` when nothing names an API server (standalone).
    /// Everything that can be checked without the network is checked here, so a bad key
    /// fails the agent's start naming it.
    pub(crate) fn from_config(cfg: &K8sConfig) -> Result<Option<Credentials>> {
        let server = cfg.k8s_api_server.as_deref().map(parse_url).transpose()?;
        if let Some(path) = &cfg.k8s_kubeconfig_path {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            return Ok(Some(Credentials::Kubeconfig {
                path: path.clone(),
                kubeconfig: Box::new(kubeconfig),
                server,
            }));
        }
        if let Some(server) = server {
            return Ok(Some(Credentials::Url(kube::Config::new(server))));
        }
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            let config = kube::Config::incluster().map_err(Error::InCluster)?;
            return Ok(Some(Credentials::InCluster(config)));
        }
        Ok(None)
    }

    /// The API server's URL, as logs and status name it.
    pub(crate) fn server(&self) -> String {
        match self {
            Credentials::Url(c) | Credentials::InCluster(c) => c.cluster_url.to_string(),
            Credentials::Kubeconfig {
                server: Some(s), ..
            } => s.to_string(),
            Credentials::Kubeconfig { kubeconfig, .. } => kubeconfig_server(kubeconfig)
                .unwrap_or_else(|| "the kubeconfig's current context".into()),
        }
    }

    /// A client. Building it needs the runtime (the client spawns its request buffer), and a
    /// kubeconfig may run an exec credential plugin, so it happens at run time, not at start.
    pub(crate) async fn client(&self) -> Result<kube::Client> {
        let config = match self {
            Credentials::Url(c) | Credentials::InCluster(c) => c.clone(),
            Credentials::Kubeconfig {
                path,
                kubeconfig,
                server,
            } => {
                let mut config = kube::Config::from_custom_kubeconfig(
                    (**kubeconfig).clone(),
                    &KubeConfigOptions::default(),
                )
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.clone(),
                    source,
                })?;
                if let Some(server) = server {
                    config.cluster_url = server.clone();
                }
                config
            }
        };
        kube::Client::try_from(config).map_err(|source| Error::Client {
            server: self.server(),
            source,
        })
    }
}

fn parse_url(url: &str) -> Result<http::Uri> {
    let bad = |reason: String| Error::ServerUrl {
        url: url.to_string(),
        reason,
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(uri),
        _ => Err(bad(
            "an http:// or https:// URL with a host is needed".into()
        )),
    }
}

/// The server of the kubeconfig's current context.
fn kubeconfig_server(kc: &Kubeconfig) -> Option<String> {
    let context = kc.current_context.as_deref()?;
    let cluster = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .clone();
    kc.clusters
        .iter()
        .find(|c| c.name == cluster)?
        .cluster
        .as_ref()?
        .server
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_configured_is_standalone_and_bad_urls_name_the_key() {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            assert!(
                Credentials::from_config(&K8sConfig::default())
                    .unwrap()
                    .is_none()
            );
        }
        for bad in ["not a url", "ftp://x", "/just/a/path"] {
            let cfg = K8sConfig {
                k8s_api_server: Some(bad.into()),
                ..Default::default()
            };
            let err = Credentials::from_config(&cfg).unwrap_err().to_string();
            assert!(err.starts_with("k8s-api-server:"), "{err}");
        }
        let cfg = K8sConfig {
            k8s_api_server: Some("http://127.0.0.1:6443".into()),
            ..Default::default()
        };
        let creds = Credentials::from_config(&cfg).unwrap().unwrap();
        assert_eq!(creds.server(), "http://127.0.0.1:6443/");
    }

    #[test]
    fn a_kubeconfig_gives_its_server_unless_the_url_replaces_it() {
        let dir = std::env::temp_dir().join(format!("cellium-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nclusters:\n- name: k\n  cluster: {server: 'http://10.0.0.1:8080'}\nusers:\n- name: u\n  user: {}\n",
        )
        .unwrap();
        let mut cfg = K8sConfig {
            k8s_kubeconfig_path: Some(path.clone()),
            ..Default::default()
        };
        let creds = Credentials::from_config(&cfg).unwrap().unwrap();
        assert_eq!(creds.server(), "http://10.0.0.1:8080");
        cfg.k8s_api_server = Some("http://127.0.0.1:1".into());
        let creds = Credentials::from_config(&cfg).unwrap().unwrap();
        assert_eq!(creds.server(), "http://127.0.0.1:1/");
        cfg.k8s_kubeconfig_path = Some(dir.join("missing"));
        let err = Credentials::from_config(&cfg).unwrap_err().to_string();
        assert!(err.starts_with("k8s-kubeconfig-path:"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

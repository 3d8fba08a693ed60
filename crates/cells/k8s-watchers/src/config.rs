//! The `k8s-watchers` configuration section, with Cilium's key names.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the API server is, and which node this agent runs on. With none of
/// `k8s-api-server`, `k8s-kubeconfig-path` and the in-cluster environment
/// (`KUBERNETES_SERVICE_HOST`), the agent runs standalone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct K8sConfig {
    /// The API server's URL (`https://10.0.0.1:6443`, or `http://...` for a plain one). With
    /// `k8s-kubeconfig-path` it replaces the kubeconfig's server; alone, the server is used
    /// without credentials.
    pub k8s_api_server: Option<String>,
    /// A kubeconfig file: its current context's server and credentials.
    pub k8s_kubeconfig_path: Option<PathBuf>,
    /// This node's name, as the API server knows it: the pods watched are those with this
    /// `spec.nodeName`, and `ipam: kubernetes` reads this Node's pod CIDRs. Default:
    /// `K8S_NODE_NAME` from the environment, else the host name.
    pub node_name: Option<String>,
}

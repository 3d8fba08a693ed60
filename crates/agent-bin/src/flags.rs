//! The configuration flags shared by `run` and `hive`.

use std::net::SocketAddr;

use ipnet::IpNet;
use std::path::PathBuf;

use cellium_hive::ConfigSources;

/// Configuration: defaults < `--config` file < `--config-dir` keys < `CELLIUM_*` environment <
/// these flags.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ConfigArgs {
    /// A configuration file (TOML, or YAML with a .yaml/.yml name) of `key = value` pairs.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A directory of one file per key, named for the key and holding its value (Cilium's
    /// `--config-dir`; a ConfigMap mounted as a volume): over the file's keys.
    #[arg(long, value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
    /// The state directory (key `state-dir`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The API's unix socket (key `api-socket`).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// Where the datapath's maps and links are pinned; mounted as bpffs if needed (key `bpf-root`).
    #[arg(long, value_name = "DIR")]
    pub bpf_root: Option<PathBuf>,
    /// The address metrics are served on (key `metrics-addr`).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// The ranges ClusterIPs are allocated from: one, or one per family, the first being the
    /// default family; repeat or separate with commas (key `service-cidr`).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub service_cidr: Vec<IpNet>,
    /// A directory of policy YAML files, applied as they change (key `policy-dir`).
    #[arg(long, value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,
    /// A pod CIDR of this node, IPv4 or IPv6; repeat for several (key `pod-cidr`).
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Vec<IpNet>,
    /// At start, remove restored endpoints whose addresses the pod CIDRs no longer cover
    /// (their pods lose their interfaces) instead of refusing to start (key
    /// `remove-endpoints-outside-pod-cidr`).
    #[arg(long)]
    pub remove_endpoints_outside_pod_cidr: bool,
    /// The Kubernetes API server's URL: Kubernetes mode (key `k8s-api-server`).
    #[arg(long, value_name = "URL")]
    pub k8s_api_server: Option<String>,
    /// A kubeconfig for the Kubernetes API server: Kubernetes mode (key `k8s-kubeconfig-path`).
    #[arg(long, value_name = "FILE")]
    pub k8s_kubeconfig_path: Option<PathBuf>,
    /// This node's name as the API server knows it (key `node-name`; default `K8S_NODE_NAME`,
    /// else the host name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Where the node's pod CIDRs come from: `config` (`pod-cidr`), `kubernetes` (the Node's
    /// `spec.podCIDRs`) or `cluster-pool` (the CiliumNode's `spec.ipam.podCIDRs`) (key `ipam`).
    #[arg(long, value_name = "MODE")]
    pub ipam: Option<String>,
}

impl ConfigArgs {
    /// The layered sources the hive reads its configuration from.
    pub fn sources(&self) -> ConfigSources {
        let mut sources = ConfigSources::new();
        if let Some(file) = &self.config {
            sources = sources.file(file);
        }
        if let Some(dir) = &self.config_dir {
            sources = sources.dir(dir);
        }
        sources = sources.env("CELLIUM_");
        if let Some(v) = &self.state_dir {
            sources = sources.flag("state-dir", v);
        }
        if let Some(v) = &self.api_socket {
            sources = sources.flag("api-socket", v);
        }
        if let Some(v) = &self.bpf_root {
            sources = sources.flag("bpf-root", v);
        }
        if let Some(v) = &self.metrics_addr {
            sources = sources.flag("metrics-addr", v);
        }
        if !self.service_cidr.is_empty() {
            sources = sources.flag("service-cidr", &self.service_cidr);
        }
        if let Some(v) = &self.policy_dir {
            sources = sources.flag("policy-dir", v);
        }
        if !self.pod_cidr.is_empty() {
            sources = sources.flag("pod-cidr", &self.pod_cidr);
        }
        if self.remove_endpoints_outside_pod_cidr {
            sources = sources.flag("remove-endpoints-outside-pod-cidr", true);
        }
        let strings = [
            ("k8s-api-server", &self.k8s_api_server),
            ("node-name", &self.node_name),
            ("ipam", &self.ipam),
        ];
        for (key, value) in strings {
            if let Some(v) = value {
                sources = sources.flag(key, v);
            }
        }
        if let Some(v) = &self.k8s_kubeconfig_path {
            sources = sources.flag("k8s-kubeconfig-path", v);
        }
        sources
    }
}

impl cellium_hive::process::Flags for ConfigArgs {
    fn sources(&self) -> ConfigSources {
        ConfigArgs::sources(self)
    }
}

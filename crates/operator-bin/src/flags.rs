//! The configuration flags of `run` and `hive`.

use std::path::PathBuf;

use cellium_hive::ConfigSources;
use ipnet::IpNet;

/// Configuration: defaults < `--config` file < `--config-dir` keys < `CELLIUM_*` environment <
/// these flags.
#[derive(Debug, Default, Clone, clap::Args)]
pub(crate) struct ConfigArgs {
    /// A configuration file (TOML, or YAML with a .yaml/.yml name) of `key = value` pairs.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// A directory of one file per key, named for the key and holding its value (Cilium's
    /// `--config-dir`; a ConfigMap mounted as a volume): over the file's keys.
    #[arg(long, value_name = "DIR")]
    pub(crate) config_dir: Option<PathBuf>,
    /// The Kubernetes API server's URL (key `k8s-api-server`).
    #[arg(long, value_name = "URL")]
    pub(crate) k8s_api_server: Option<String>,
    /// A kubeconfig for the Kubernetes API server (key `k8s-kubeconfig-path`).
    #[arg(long, value_name = "FILE")]
    pub(crate) k8s_kubeconfig_path: Option<PathBuf>,
    /// This operator's name in the Lease (key `operator-id`).
    #[arg(long, value_name = "NAME")]
    pub(crate) operator_id: Option<String>,
    /// IPv4 pools of pod CIDRs; repeat or separate with commas (key `cluster-pool-ipv4-cidr`).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub(crate) cluster_pool_ipv4_cidr: Vec<IpNet>,
    /// The prefix length of each node's IPv4 pod CIDR (key `cluster-pool-ipv4-mask-size`).
    #[arg(long, value_name = "LEN")]
    pub(crate) cluster_pool_ipv4_mask_size: Option<u8>,
    /// IPv6 pools of pod CIDRs; repeat or separate with commas (key `cluster-pool-ipv6-cidr`).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub(crate) cluster_pool_ipv6_cidr: Vec<IpNet>,
    /// The prefix length of each node's IPv6 pod CIDR (key `cluster-pool-ipv6-mask-size`).
    #[arg(long, value_name = "LEN")]
    pub(crate) cluster_pool_ipv6_mask_size: Option<u8>,
}

impl ConfigArgs {
    pub(crate) fn sources(&self) -> ConfigSources {
        let mut sources = ConfigSources::new();
        if let Some(file) = &self.config {
            sources = sources.file(file);
        }
        if let Some(dir) = &self.config_dir {
            sources = sources.dir(dir);
        }
        sources = sources.env("CELLIUM_");
        if let Some(v) = &self.k8s_api_server {
            sources = sources.flag("k8s-api-server", v);
        }
        if let Some(v) = &self.k8s_kubeconfig_path {
            sources = sources.flag("k8s-kubeconfig-path", v);
        }
        if let Some(v) = &self.operator_id {
            sources = sources.flag("operator-id", v);
        }
        for (key, pools) in [
            ("cluster-pool-ipv4-cidr", &self.cluster_pool_ipv4_cidr),
            ("cluster-pool-ipv6-cidr", &self.cluster_pool_ipv6_cidr),
        ] {
            if !pools.is_empty() {
                sources = sources.flag(key, pools);
            }
        }
        for (key, len) in [
            (
                "cluster-pool-ipv4-mask-size",
                self.cluster_pool_ipv4_mask_size,
            ),
            (
                "cluster-pool-ipv6-mask-size",
                self.cluster_pool_ipv6_mask_size,
            ),
        ] {
            if let Some(len) = len {
                sources = sources.flag(key, len);
            }
        }
        sources
    }
}

impl cellium_hive::process::Flags for ConfigArgs {
    fn sources(&self) -> ConfigSources {
        ConfigArgs::sources(self)
    }
}

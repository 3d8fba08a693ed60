//! The `masquerade` cell: BPF masquerading of pods' connections to the world (Cilium's
//! `enable-bpf-masquerade`), done by the datapath (`bpf/lib/masq.h`).
//!
//! - **Owns** the masquerade flags of the datapath's configuration and `cel_ipmasq`, the
//!   destinations pods keep their own address to: `ipv4-native-routing-cidr`,
//!   `ipv6-native-routing-cidr`, and with `enable-ip-masq-agent` the ip-masq-agent's
//!   `nonMasqueradeCIDRs` (its defaults when the file lists none or is missing) plus the
//!   link-local prefixes unless `masqLinkLocal` / `masqLinkLocalIPv6`.
//! - **Depends on** the loader.
//! - **Config keys:** `enable-bpf-masquerade` (default `true`), `enable-ipv4-masquerade`
//!   (default `true`), `enable-ipv6-masquerade` (default `true`), `ipv4-native-routing-cidr`
//!   and `ipv6-native-routing-cidr` (default none), `enable-ip-masq-agent` (default `false`),
//!   `ip-masq-agent-config-path` (default `/etc/config/ip-masq-agent`).
//! - **Provides** `Arc<Masquerade>` and a status note while the ip-masq-agent's file is not
//!   applied.
//! - **Start hook** `masquerade`: the flags and the native routing CIDRs.
//! - **Job** `ip-masq-agent` (with `enable-ip-masq-agent`): reads the file every
//!   [`RELOAD_INTERVAL`] and rewrites `cel_ipmasq` when what it says changed. A file that does
//!   not parse keeps the entries in place (logged and said in the job's OK message: it breaks
//!   nothing that works).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_api::StatusNote;
use cellium_datapath_bpf::DatapathConfig;
use cellium_datapath_bpf::maps::ipmasq::{AGENT, NATIVE_ROUTING};
use cellium_hive::{BoxError, Config, Hook, Jobs, Lifecycle, Module};
use cellium_loader::Loader;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// How often the ip-masq-agent file is read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The ip-masq-agent's defaults when its file lists no `nonMasqueradeCIDRs` (Cilium's, which
/// are the ip-masq-agent's: the private and reserved IPv4 ranges).
pub const DEFAULT_NON_MASQUERADE: [&str; 11] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
];

/// The `masquerade` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct MasqueradeConfig {
    /// Masquerade in the datapath (the only masquerading the agent does): off, pods' packets
    /// to the world leave with their own address, for the node's own rules to translate.
    pub enable_bpf_masquerade: bool,
    /// Masquerade pods' IPv4.
    pub enable_ipv4_masquerade: bool,
    /// Masquerade pods' IPv6.
    pub enable_ipv6_masquerade: bool,
    /// IPv4 destinations reached without masquerading (the network that routes pod CIDRs).
    pub ipv4_native_routing_cidr: Option<IpNet>,
    /// IPv6 destinations reached without masquerading.
    pub ipv6_native_routing_cidr: Option<IpNet>,
    /// Take more destinations not to masquerade from the ip-masq-agent's configuration.
    pub enable_ip_masq_agent: bool,
    /// The ip-masq-agent's configuration file (YAML or JSON; a ConfigMap mounted there).
    pub ip_masq_agent_config_path: PathBuf,
}

impl Default for MasqueradeConfig {
    fn default() -> Self {
        MasqueradeConfig {
            enable_bpf_masquerade: true,
            enable_ipv4_masquerade: true,
            enable_ipv6_masquerade: true,
            ipv4_native_routing_cidr: None,
            ipv6_native_routing_cidr: None,
            enable_ip_masq_agent: false,
            ip_masq_agent_config_path: PathBuf::from("/etc/config/ip-masq-agent"),
        }
    }
}

/// The ip-masq-agent's configuration file, as Cilium reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpMasqAgentFile {
    /// Destinations not masqueraded; none: [`DEFAULT_NON_MASQUERADE`].
    #[serde(default, rename = "nonMasqueradeCIDRs")]
    pub non_masquerade_cidrs: Vec<IpNet>,
    /// Masquerade to 169.254.0.0/16 too (left alone by default).
    #[serde(default)]
    pub masq_link_local: bool,
    /// Masquerade to fe80::/10 too (left alone by default).
    #[serde(default, rename = "masqLinkLocalIPv6")]
    pub masq_link_local_ipv6: bool,
    /// The ip-masq-agent's own resync period: accepted and ignored (the file is read every
    /// [`RELOAD_INTERVAL`]).
    #[serde(default)]
    pub resync_interval: Option<String>,
}

impl IpMasqAgentFile {
    /// Parses the file's text (YAML, of which JSON is a subset); empty is no setting.
    pub fn parse(text: &str) -> Result<Self, serde_yaml::Error> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_yaml::from_str(text)
    }

    /// The prefixes it keeps from masquerading.
    pub fn prefixes(&self) -> Vec<IpNet> {
        let mut nets = if self.non_masquerade_cidrs.is_empty() {
            DEFAULT_NON_MASQUERADE
                .iter()
                .map(|c| c.parse().expect("a valid default CIDR"))
                .collect()
        } else {
            self.non_masquerade_cidrs.clone()
        };
        if !self.masq_link_local {
            nets.push("169.254.0.0/16".parse().expect("a valid CIDR"));
        }
        if !self.masq_link_local_ipv6 {
            nets.push("fe80::/10".parse().expect("a valid CIDR"));
        }
        nets
    }
}

/// The `masquerade` module.
pub fn cell() -> Module {
    Module::new(
        "masquerade",
        "Masquerades pods' connections to the world in the datapath, except to the native routing and ip-masq-agent CIDRs",
    )
    .config::<MasqueradeConfig>()
    .provide(Masquerade::new)
    // `cellium status` says when the ip-masq-agent's file is not applied; and the API, which
    // takes every note, so starts after this cell's hooks (a pod served before the flags are
    // set would start connections that are never masqueraded).
    .contribute(|m: Arc<Masquerade>| Arc::new(StatusNote::new(move || m.note())))
}

/// The masquerading of this node: what its `ip-masq-agent` job last found wrong.
#[derive(Debug, Default)]
pub struct Masquerade {
    /// Why the ip-masq-agent's file is not applied, while it is not.
    not_applied: Mutex<Option<String>>,
}

impl Masquerade {
    /// Declares the start hook and the job (see the module docs).
    pub fn new(
        cfg: Config<MasqueradeConfig>,
        loader: Arc<Loader>,
        lc: Lifecycle,
        jobs: Jobs,
    ) -> Arc<Masquerade> {
        let this = Arc::new(Masquerade::default());
        start(cfg, loader, lc, jobs, this.clone());
        this
    }

    /// The status note: the ip-masq-agent's file that does not parse, while it does not.
    pub fn note(&self) -> Option<String> {
        self.not_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_not_applied(&self, why: Option<String>) {
        *self.not_applied.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }
}

/// The native routing CIDRs.
fn native_prefixes(cfg: &MasqueradeConfig) -> BTreeSet<IpNet> {
    [cfg.ipv4_native_routing_cidr, cfg.ipv6_native_routing_cidr]
        .into_iter()
        .flatten()
        .map(|net| net.trunc())
        .collect()
}

fn start(
    cfg: Config<MasqueradeConfig>,
    loader: Arc<Loader>,
    lc: Lifecycle,
    jobs: Jobs,
    this: Arc<Masquerade>,
) {
    let cfg = (*cfg).clone();
    let native = native_prefixes(&cfg);
    // The agent file's prefixes as last applied (none until read).
    let applied: Arc<Mutex<Option<BTreeSet<IpNet>>>> = Arc::default();
    let hook_loader = loader.clone();
    let hook_cfg = cfg.clone();
    lc.append(Hook::new("masquerade").on_start(move |_| async move {
        let dp = hook_loader.datapath()?;
        let on = hook_cfg.enable_bpf_masquerade;
        let config = dp.config();
        config.set_flag(DatapathConfig::MASQ4, on && hook_cfg.enable_ipv4_masquerade)?;
        config.set_flag(DatapathConfig::MASQ6, on && hook_cfg.enable_ipv6_masquerade)?;
        // Until the agent file is read, the prefixes of its last run stay: the file said
        // them then, and the first read follows at once. Without the agent, none.
        if !hook_cfg.enable_ip_masq_agent {
            dp.ipmasq().sync(AGENT, &BTreeSet::new())?;
        }
        dp.ipmasq().sync(NATIVE_ROUTING, &native)?;
        tracing::info!(
            ipv4 = on && hook_cfg.enable_ipv4_masquerade,
            ipv6 = on && hook_cfg.enable_ipv6_masquerade,
            native_routing = ?native,
            ip_masq_agent = hook_cfg.enable_ip_masq_agent,
            "BPF masquerading"
        );
        Ok::<(), BoxError>(())
    }));
    if !cfg.enable_ip_masq_agent {
        return;
    }
    let path = cfg.ip_masq_agent_config_path.clone();
    jobs.timer("ip-masq-agent", RELOAD_INTERVAL, move |ctx| {
        let loader = loader.clone();
        let applied = applied.clone();
        let path = path.clone();
        let this = this.clone();
        async move {
            let message = match read_agent_file(&path) {
                Ok(prefixes) => {
                    let mut last = applied.lock().unwrap_or_else(|p| p.into_inner());
                    if last.as_ref() != Some(&prefixes) {
                        let dp = loader.datapath()?;
                        let (written, removed) = dp.ipmasq().sync(AGENT, &prefixes)?;
                        tracing::info!(
                            path = %path.display(),
                            written,
                            removed,
                            "ip-masq-agent configuration applied"
                        );
                            *last = Some(prefixes.clone());
                    }
                    this.set_not_applied(None);
                    format!(
                        "{} prefixes not masqueraded from {}",
                        prefixes.len(),
                        path.display()
                    )
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ip-masq-agent configuration not applied; the previous one stays");
                    this.set_not_applied(Some(format!(
                        "the ip-masq-agent configuration {} is not applied ({e}): the prefixes it gave before stay unmasqueraded",
                        path.display()
                    )));
                    format!("{}: {e}; the previous configuration stays", path.display())
                }
            };
            ctx.reporter().ok(message);
            Ok(())
        }
    })
    .add();
}

/// The prefixes the file keeps from masquerading; a missing file is an empty one (the
/// defaults), as for Cilium.
fn read_agent_file(path: &Path) -> Result<BTreeSet<IpNet>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.to_string()),
    };
    IpMasqAgentFile::parse(&text)
        .map(|f| f.prefixes().into_iter().map(|n| n.trunc()).collect())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_ciliums_and_default_to_masquerading() {
        let cfg: MasqueradeConfig = serde_json::from_value(serde_json::json!({
            "ipv4-native-routing-cidr": "10.0.0.0/8",
            "enable-ip-masq-agent": true,
        }))
        .unwrap();
        assert!(cfg.enable_bpf_masquerade && cfg.enable_ipv4_masquerade);
        assert!(cfg.enable_ipv6_masquerade);
        assert_eq!(
            native_prefixes(&cfg).into_iter().collect::<Vec<_>>(),
            vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]
        );
        assert!(
            serde_json::from_value::<MasqueradeConfig>(serde_json::json!({
                "ipv4-native-routing-cidr": "not-a-cidr",
            }))
            .is_err()
        );
    }

    #[test]
    fn the_agent_file_reads_as_ciliums() {
        let f = IpMasqAgentFile::parse(
            "nonMasqueradeCIDRs:\n- 198.51.100.0/24\nmasqLinkLocal: true\nresyncInterval: 60s\n",
        )
        .unwrap();
        assert_eq!(
            f.prefixes(),
            vec![
                "198.51.100.0/24".parse::<IpNet>().unwrap(),
                "fe80::/10".parse().unwrap()
            ]
        );
        let empty = IpMasqAgentFile::parse("").unwrap().prefixes();
        assert_eq!(empty.len(), DEFAULT_NON_MASQUERADE.len() + 2);
        assert!(IpMasqAgentFile::parse("{\"nonMasqueradeCIDRs\": [\"10.0.0.0/8\"]}").is_ok());
        assert!(IpMasqAgentFile::parse("nonMasqueradeCidrs: []").is_err());
    }
}

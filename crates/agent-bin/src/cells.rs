//! The cells that make up `cellium-agent`.

use std::sync::Arc;

use cellium_api_server::ApiServerConfig;
use cellium_hive::{Cell, Config, Module, group};
use cellium_loader::LoaderConfig;
use cellium_statedir::node_lock::{self, NodeClaim};

/// Every cell of the agent, infrastructure first, and the node lock before everything.
pub fn cells() -> Vec<Cell> {
    vec![
        group([
            node_lock().into(),
            cellium_statedir::cell().into(),
            cellium_metrics::cell().into(),
            cellium_api_server::cell().into(),
        ])
        .into(),
        cellium_loader::cell().into(),
        group([
            cellium_resources::cell().into(),
            cellium_ipam::cell().into(),
            cellium_identity::cell().into(),
            cellium_ipcache::cell().into(),
            cellium_policy_repo::cell().into(),
            cellium_endpoint_manager::cell().into(),
            cellium_svc_lb::cell().into(),
        ])
        .into(),
    ]
}

/// The `node-lock` cell with the standard agent's claims: its network namespace, its API
/// socket (`api-socket`) and its BPF root (`bpf-root`). Its start hook must run before any
/// other cell's, so it goes first in a list of cells; an embedded agent with the same cells
/// includes it as [`cells`] does, one with others contributes its own `Arc<NodeClaim>`s to
/// [`node_lock::cell`].
pub fn node_lock() -> Module {
    node_lock::cell()
        .contribute(|c: Config<ApiServerConfig>| {
            Arc::new(NodeClaim::ApiSocket(c.api_socket.clone()))
        })
        .contribute(|c: Config<LoaderConfig>| Arc::new(NodeClaim::BpfRoot(c.bpf_root.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_hive::{ConfigSources, Hive};

    /// A broken wiring (a missing provider, a cycle, a clash of config keys) fails here.
    #[test]
    fn the_agent_graph_populates() {
        let dir = tempfile::tempdir().unwrap();
        let sources = ConfigSources::new()
            .flag("state-dir", dir.path().join("state"))
            .flag("api-socket", dir.path().join("api.sock"));
        let mut hive = Hive::new(cells()).with_config(sources);
        if let Err(e) = hive.populate() {
            panic!("the agent's graph does not populate:\n{e}");
        }
        // Before any cell touches the node (restores, sweeps, mounts), it is claimed.
        let order = hive.start_order();
        assert_eq!(
            order.first().map(|(h, m)| (h.as_str(), m.as_str())),
            Some(("claim-node", "node-lock")),
            "{order:?}"
        );
        let text = hive.describe();
        for module in [
            "node-lock",
            "statedir",
            "metrics",
            "api-server",
            "loader",
            "resources",
            "ipam",
            "svc-lb",
        ] {
            assert!(text.contains(module), "{module} missing from:\n{text}");
        }
    }

    /// Leaving out a cell that another needs is reported before anything runs, naming the
    /// missing type and who needs it.
    #[test]
    fn a_missing_cell_is_named_with_who_needs_it() {
        let without_ipam: Vec<Cell> = vec![
            cellium_statedir::cell().into(),
            cellium_loader::cell().into(),
            cellium_resources::cell().into(),
            cellium_identity::cell().into(),
            cellium_ipcache::cell().into(),
            cellium_policy_repo::cell().into(),
            cellium_endpoint_manager::cell().into(),
            cellium_api_server::cell().into(),
        ];
        let err = Hive::new(without_ipam).validate().unwrap_err().to_string();
        assert!(err.contains("cellium_ipam::ipam::Ipam"), "{err}");
        assert!(err.contains("endpoint-manager"), "{err}");
        assert!(err.contains("EndpointManager::new"), "{err}");
    }
}

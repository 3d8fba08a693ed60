//! The cells that make up `cellium-agent`.

use std::sync::Arc;

use cellium_api::DatapathModules;
use cellium_api_server::ApiServerConfig;
use cellium_hive::{Cell, Config, Module, group};
use cellium_loader::LoaderConfig;
use cellium_node_lock::NodeClaim;

/// Every cell of the agent, infrastructure first, and the node lock before everything; the
/// loader's `load-datapath` right after it, so that the load runs beside the rest of the start.
pub fn cells() -> Vec<Cell> {
    vec![
        group([
            node_lock().into(),
            cellium_statedir::cell().into(),
            cellium_metrics::cell().into(),
            // Before the cells that read the API server: the datapath loads beside their sync.
            cellium_loader::cell().into(),
            cellium_api_server::cell().provide(datapath_modules).into(),
        ])
        .into(),
        group([
            cellium_k8s_watchers::cell().into(),
            cellium_resources::cell().into(),
            cellium_ipam::cell().into(),
            cellium_identity::cell().into(),
            cellium_ipcache::cell().into(),
            cellium_policy_repo::cell().into(),
            cellium_endpoint_manager::cell().into(),
            cellium_svc_lb::cell().into(),
            cellium_node_discovery::cell().into(),
            cellium_node_discovery::masquerade::cell().into(),
            cellium_kvstore::cell().into(),
            cellium_flows::cell().into(),
        ])
        .into(),
    ]
}

/// The modules that keep running pods' datapath current: the loader (programs and maps), the
/// endpoint manager (endpoints, their policy entries), identities, the ipcache, the policy
/// repository and the service load-balancer. When one of them is not OK, `Agent.Status` says
/// running pods may have limited connectivity (CNI STATUS 51); when only others are (IPAM, the
/// resource tables, the API, metrics), only new pods are refused (50). Declared here, once,
/// from the cells' own ids.
fn datapath_modules() -> Arc<DatapathModules> {
    Arc::new(DatapathModules::new([
        cellium_loader::cell().id(),
        cellium_endpoint_manager::cell().id(),
        cellium_identity::cell().id(),
        cellium_ipcache::cell().id(),
        cellium_policy_repo::cell().id(),
        cellium_svc_lb::cell().id(),
    ]))
}

/// The `node-lock` cell with the standard agent's claims: its network namespace, its API
/// socket (`api-socket`) and its BPF root (`bpf-root`). Its start hook must run before any
/// other cell's, so it goes first in a list of cells; an embedded agent with the same cells
/// includes it as [`cells`] does, one with others contributes its own `Arc<NodeClaim>`s to
/// [`cellium_node_lock::cell`].
pub fn node_lock() -> Module {
    cellium_node_lock::cell()
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
            "flows",
        ] {
            assert!(text.contains(module), "{module} missing from:\n{text}");
        }
    }

    #[test]
    fn the_datapath_modules_are_modules_of_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let sources = ConfigSources::new()
            .flag("state-dir", dir.path().join("state"))
            .flag("api-socket", dir.path().join("api.sock"));
        let mut hive = Hive::new(cells()).with_config(sources);
        hive.populate().unwrap();
        let text = hive.describe();
        let ids: Vec<&str> = datapath_modules().ids().collect();
        assert_eq!(ids.len(), 6);
        for id in ids {
            assert!(text.contains(id), "{id} is not a module of the agent");
        }
        assert!(text.contains("datapath_modules"), "{text}");
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

    /// The cells of an agent of connectivity only, as `examples/connectivity_agent.rs` lists
    /// them: the endpoint manager's optional dependencies (resources, identity, ipcache,
    /// policy-repo) left out.
    fn connectivity() -> Vec<Cell> {
        vec![
            node_lock().into(),
            cellium_statedir::cell().into(),
            cellium_metrics::cell().into(),
            cellium_api_server::cell().into(),
            cellium_loader::cell().into(),
            cellium_ipam::cell().into(),
            cellium_endpoint_manager::cell().into(),
        ]
    }

    #[test]
    fn an_agent_of_connectivity_only_populates() {
        let dir = tempfile::tempdir().unwrap();
        let sources = ConfigSources::new()
            .flag("state-dir", dir.path().join("state"))
            .flag("api-socket", dir.path().join("api.sock"));
        let mut hive = Hive::new(connectivity()).with_config(sources);
        if let Err(e) = hive.populate() {
            panic!("the connectivity agent's graph does not populate:\n{e}");
        }
        let text = hive.describe();
        assert!(text.contains("  endpoint-manager: "), "{text}");
        for absent in ["policy-repo", "svc-lb", "identity", "ipcache", "resources"] {
            assert!(
                !text.contains(&format!("  {absent}: ")),
                "{absent} in:\n{text}"
            );
        }
    }

    /// Leaving out a cell that is required even by a smaller agent is still reported, and
    /// only that one: the optional dependencies left out are not problems.
    #[test]
    fn a_smaller_agent_missing_a_required_cell_names_only_that_cell() {
        let without_loader: Vec<Cell> = vec![
            cellium_statedir::cell().into(),
            cellium_api_server::cell().into(),
            cellium_ipam::cell().into(),
            cellium_endpoint_manager::cell().into(),
        ];
        let err = Hive::new(without_loader)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("cellium_loader::loader::Loader"), "{err}");
        assert!(err.contains("EndpointManager::new"), "{err}");
        for optional in ["Identities", "Ipcache", "PolicyRepository", "Resources"] {
            assert!(!err.contains(optional), "{optional} reported:\n{err}");
        }
    }
}

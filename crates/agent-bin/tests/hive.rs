//! `cellium-agent hive`: the description a person reads and the graph Graphviz draws.

use std::io::Write;
use std::process::{Command, Stdio};

fn agent(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cellium-agent"))
        .args(args)
        .output()
        .expect("cellium-agent runs");
    assert!(
        out.status.success(),
        "cellium-agent {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[test]
fn the_description_lists_every_module_and_the_start_order() {
    let text = agent(&["hive"]);
    for module in MODULES {
        assert!(
            text.contains(&format!("  {module}: ")),
            "{module} missing:\n{text}"
        );
    }
    let order = text
        .split("start order:")
        .nth(1)
        .expect("a start order section");
    let pos = |hook: &str| {
        order
            .find(hook)
            .unwrap_or_else(|| panic!("{hook} not in:\n{order}"))
    };
    // The node is claimed before anything else starts.
    assert!(
        order.contains("  1. claim-node (node-lock)\n"),
        "claim-node is not first:\n{order}"
    );
    // Dependencies start first: the datapath before the endpoints, the endpoints before the API.
    assert!(pos("datapath-loaded") < pos("restore-endpoints"));
    // The load starts before the tables are restored (in Kubernetes mode, listed), and runs
    // beside them; it is waited for before the first cell that uses the datapath starts.
    assert!(pos("load-datapath") < pos("restore-objects"));
    assert!(pos("restore-objects") < pos("datapath-loaded"));
    assert!(pos("datapath-loaded") < pos("mirror-datapath"));
    assert!(pos("restore-endpoints") < pos("serve-api"));
    // Services are taken over from the pinned maps only once objects and endpoints are back.
    assert!(pos("restore-objects") < pos("restore-services"));
    assert!(pos("restore-endpoints") < pos("restore-services"));
    assert!(pos("restore-services") < pos("serve-api"));
}

#[test]
fn the_graph_renders_with_graphviz() {
    let dot_text = agent(&["hive", "--dot"]);
    let mut dot = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("Graphviz `dot` is installed (scripts/setup.sh installs it)");
    dot.stdin
        .take()
        .expect("stdin")
        .write_all(dot_text.as_bytes())
        .expect("dot reads the graph");
    let out = dot.wait_with_output().expect("dot finishes");
    assert!(
        out.status.success(),
        "dot rejected the graph: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = String::from_utf8_lossy(&out.stdout);
    assert!(
        svg.contains("<svg") && svg.contains("EndpointManager::new"),
        "{svg}"
    );
}

/// Every module of the agent.
const MODULES: [&str; 12] = [
    "node-lock",
    "statedir",
    "metrics",
    "api-server",
    "loader",
    "resources",
    "ipam",
    "identity",
    "ipcache",
    "policy-repo",
    "endpoint-manager",
    "svc-lb",
];

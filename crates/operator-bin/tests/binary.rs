//! The `cellium-operator` binary: its cells described, its refusals, and a run against the
//! test API server ended by SIGTERM.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Cluster, eventually};

const BIN: &str = env!("CARGO_BIN_EXE_cellium-operator");

/// The binary, with no configuration from this process's environment.
fn operator() -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CELLIUM_") {
            cmd.env_remove(&key);
        }
    }
    cmd.env_remove("KUBERNETES_SERVICE_HOST");
    cmd
}

#[test]
fn hive_describes_the_cells_and_their_keys() {
    let out = operator()
        .args(["hive", "--k8s-api-server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for word in [
        "k8s-client",
        "leader-election",
        "cluster-pool",
        "gc",
        "cluster-pool-ipv4-mask-size",
        "identity-gc-interval",
        "leader-election-lease-duration",
    ] {
        assert!(stdout.contains(word), "{word} missing from:\n{stdout}");
    }
}

#[test]
fn run_refuses_without_an_api_server_or_with_a_bad_pool_naming_the_key() {
    let out = operator().arg("run").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("k8s-api-server"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("operator.toml");
    std::fs::write(
        &config,
        "k8s-api-server = \"http://127.0.0.1:1\"\ncluster-pool-ipv4-cidr = [\"fd00::/64\"]\n",
    )
    .unwrap();
    let out = operator()
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cluster-pool-ipv4-cidr: fd00::/64 is not an IPv4 CIDR"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_leads_allocates_and_releases_its_lease_on_sigterm() {
    let cluster = Cluster::new();
    cluster.create_cilium_node("n1", &[]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("operator.yaml");
    std::fs::write(
        &config,
        "leader-election-retry-period: 200ms\ncluster-pool-ipv6-cidr: [fd00:20::/104]\n",
    )
    .unwrap();
    let mut child = operator()
        .args([
            "run",
            "--operator-id",
            "op-bin",
            "--k8s-api-server",
            &cluster.url,
        ])
        .args(["--cluster-pool-ipv4-cidr", "10.20.0.0/16"])
        .args(["--cluster-pool-ipv4-mask-size", "26", "--config"])
        .arg(&config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        "the binary holds the Lease",
        Duration::from_secs(10),
        || cluster.holder().as_deref() == Some("op-bin"),
    )
    .await;
    eventually("n1 gets a CIDR", Duration::from_secs(10), || {
        cluster.pod_cidrs("n1") == ["10.20.0.0/26", "fd00:20::/112"]
    })
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    assert_eq!(cluster.holder(), None, "the Lease is released at exit");
}

//! Helpers for Cellium's privileged end-to-end tests and benchmarks: network
//! namespaces with drop guards ([`NetNs`]), the node-and-pods topology the
//! datapath serves ([`Topology`]), a private bpffs mount ([`BpffsMount`]),
//! traffic probes ([`probe`]), hand-made frames sent as they are ([`frame`]), and a running
//! agent with its CLI and CNI plugin ([`Agent`], [`CniCall`]), a cluster of node namespaces on
//! an underlay with the test API server, operators and an agent per node ([`Cluster`]),
//! reachability probes that tell a policy drop apart ([`reach`]), a directory made read-only
//! for real ([`ReadOnlyDir`]), a cgroup v2 of the test's own ([`TestCgroup`]), a policy lab of pods in Kubernetes namespaces with truth tables
//! ([`lab`]), a TCP ping-pong of both families for latency benchmarks ([`pingpong`]), new
//! TCP connections timed one by one ([`connrate`]), and what
//! the benchmarks that run an agent at scale share ([`bench`]).
//!
//! Everything here needs root. Tests built on it create their own
//! namespaces, send traffic only to addresses inside them, and clean up
//! through the guards even when an assertion fails.

pub mod agent;
pub mod bench;
pub mod bpffs;
pub mod cgroup;
pub mod cluster;
pub mod cmd;
pub mod cni;
pub mod connrate;
mod error;
pub mod etcd;
pub mod frame;
pub mod k8s;
pub mod lab;
mod leftovers;
pub mod netns;
pub mod pingpong;
pub mod probe;
pub mod reach;
pub mod readonly;
pub mod shop;
pub mod topology;
pub mod veth;
pub mod wait;

pub use agent::{Agent, AgentOptions, EndpointLink};
pub use bpffs::BpffsMount;
pub use cgroup::TestCgroup;
pub use cluster::{Cluster, ClusterOptions};
pub use cni::{CniCall, CniProcess};
pub use error::{Error, Result};
pub use etcd::{Etcd, EtcdTls};
pub use k8s::K8sApi;
pub use netns::NetNs;
pub use readonly::ReadOnlyDir;
pub use topology::{Pod, Topology};

/// A new temporary directory `/tmp/<prefix><pid>-XXXXXX`, removed with the guard: named for
/// this process, so that what a killed process left in it can be told from a live one's
/// ([`leftovers`]).
pub(crate) fn temp_dir(prefix: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir()
        .map_err(|source| Error::Io {
            op: "create",
            path: "a temporary directory".into(),
            source,
        })
}

/// One privileged test of a test binary at a time: the tests share two cores, run agents
/// and wait on time-sensitive events. Hold the guard for the whole test; a test that failed
/// while holding it does not stop the others. The first call removes what killed test
/// processes left behind ([`leftovers`]).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    leftovers::sweep_once();
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

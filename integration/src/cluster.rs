//! A cluster in network namespaces: N node namespaces joined by an underlay, one test API
//! server served on every node's loopback, optional `cellium-operator`s, one `cellium-agent` per
//! node in Kubernetes mode, and pods created through `cellium-cni` on any node.
//!
//! ```text
//!   underlay netns: bridge cel-und (no address)
//!     |  veth   node n1: und0 192.0.2.1/24    agent, API server on 127.0.0.1:<port>
//!     |  veth   node n2: und0 192.0.2.2/24    agent, the same API server on the same port
//!     ...
//! ```
//!
//! Node `i` (from 0) is named `n{i+1}` and has the underlay address `192.0.2.{i+1}`. With
//! [`Ipam::Kubernetes`] its Node object carries the pod CIDR `10.245.{11+i}.0/24`; with
//! [`Ipam::ClusterPool`] it carries none and the operators hand out CIDRs from their pool.
//!
//! The routing mode is a parameter ([`RoutingMode`], the agent's key `routing-mode`), so that
//! every test written on a [`Cluster`] runs in each mode by naming it.
//!
//! Faults: every part is a guard. Dropping the cluster (also when a test panics) removes the
//! pods' namespaces, kills the operators and agents, stops the API server and deletes the node
//! and underlay namespaces; a panicking test gets each agent's log (from [`Agent`]'s guard) and
//! each operator's log on stderr.

use std::fs::OpenOptions;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::agent::{Agent, AgentOptions};
use crate::error::{Error, Result};
use crate::k8s::K8sApi;
use crate::lab::{Place, PlaceKind};
use crate::netns::NetNs;
use crate::reach::{Outcome, Probe, probe};
use crate::veth;

/// How long a cluster may take to converge on a change (routes, ipcache, policy) before a wait
/// is an error.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// How long a probe of [`Cluster::reach`] waits for each step.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(700);

/// The underlay bridge, in the underlay namespace.
const BRIDGE: &str = "cel-und";

/// Each node's underlay interface.
pub const UNDERLAY_IF: &str = "und0";

/// The agent's `routing-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingMode {
    /// A route to each other node's pod CIDRs via that node's underlay address.
    Native,
    /// VXLAN towards the node that hosts the destination.
    Tunnel,
}

impl RoutingMode {
    /// The key's value.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingMode::Native => "native",
            RoutingMode::Tunnel => "tunnel",
        }
    }
}

/// Where nodes' pod CIDRs come from (the agent's key `ipam`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ipam {
    /// The Node objects' `spec.podCIDRs`, written by the test (`10.245.{11+i}.0/24`).
    Kubernetes,
    /// The operators' cluster pool (`cluster-pool-ipv4-cidr`, mask size): CiliumNode
    /// `spec.ipam.podCIDRs`.
    ClusterPool {
        /// The pool.
        cidr: String,
        /// The prefix length of each node's CIDR.
        mask_size: u8,
    },
}

/// How a cluster is made.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// How many nodes.
    pub nodes: usize,
    /// The agents' `routing-mode`.
    pub routing_mode: RoutingMode,
    /// Where pod CIDRs come from.
    pub ipam: Ipam,
    /// How many operators to start (each in a node namespace, round robin from node 0).
    pub operators: usize,
    /// Whether [`Cluster::start`] starts every agent (and waits for it); otherwise the test
    /// starts them with [`Cluster::start_agent`] or [`Cluster::launch_agent`].
    pub start_agents: bool,
    /// Extra environment of every operator (`CELLIUM_*` keys).
    pub operator_env: Vec<(String, String)>,
    /// Extra environment of every agent (`CELLIUM_*` keys).
    pub agent_env: Vec<(String, String)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 2,
            routing_mode: RoutingMode::Native,
            ipam: Ipam::Kubernetes,
            operators: 0,
            start_agents: true,
            operator_env: Vec::new(),
            agent_env: Vec::new(),
        }
    }
}

/// A pod of the cluster.
#[derive(Debug)]
pub struct ClusterPod {
    /// `namespace/name`.
    pub key: String,
    /// The index of the node it runs on.
    pub node: usize,
    /// The runtime's container id.
    pub container_id: String,
    /// Its network namespace.
    pub netns: NetNs,
    /// Its address.
    pub ip: Ipv4Addr,
}

/// A `cellium-operator` in a node namespace, killed (and reaped) on drop.
#[derive(Debug)]
pub struct Operator {
    id: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Operator {
    /// Its `operator-id`, the Lease holder's name while it leads.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it with SIGKILL, as a crash would: its Lease is not released.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether it is alive.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- operator {} log ----\n{}---- end of operator log ----",
                self.id,
                self.log()
            );
        }
    }
}

/// The cluster; see the module docs.
#[derive(Debug)]
pub struct Cluster {
    // Fields drop in order: pods, operators, the API server, the agents (with their node
    // namespaces), the underlay.
    pods: Vec<ClusterPod>,
    operators: Vec<Operator>,
    api: K8sApi,
    agents: Vec<Agent>,
    underlay: NetNs,
    opts: ClusterOptions,
    files: tempfile::TempDir,
    /// Pods created so far: container ids are never reused.
    created: usize,
    /// The operators' kubeconfig, once [`Cluster::use_service_accounts`] made one.
    operator_kubeconfig: Option<PathBuf>,
}

impl Cluster {
    /// Makes the nodes, the underlay, the API server (with the Node objects), the operators,
    /// and, with [`ClusterOptions::start_agents`], starts every agent and waits for each.
    pub fn start(opts: ClusterOptions) -> Result<Cluster> {
        let underlay = NetNs::new()?;
        underlay.ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        underlay.ip(&["link", "set", BRIDGE, "up"])?;
        let mut agents = Vec::new();
        for i in 0..opts.nodes {
            let agent = Agent::prepare(AgentOptions {
                pod_cidrs: Vec::new(),
                ..AgentOptions::default()
            })?;
            join_underlay(
                &underlay,
                &format!("und-n{}", i + 1),
                agent.node(),
                UNDERLAY_IF,
                &format!("{}/24", Cluster::node_ip(i)),
            )?;
            agents.push(agent);
        }
        let first = agents.first().ok_or_else(|| Error::Unexpected {
            what: "cluster",
            detail: "a cluster needs a node".into(),
        })?;
        let api = K8sApi::start(first.node())?;
        for agent in &agents[1..] {
            api.serve_on(agent.node())?;
        }
        let files = crate::temp_dir("cel-cluster-")?;
        let mut cluster = Cluster {
            pods: Vec::new(),
            operators: Vec::new(),
            api,
            agents,
            underlay,
            opts,
            files,
            created: 0,
            operator_kubeconfig: None,
        };
        for i in 0..cluster.opts.nodes {
            let yaml = cluster.node_yaml(i);
            cluster
                .api
                .api()
                .apply_yaml(&yaml)
                .map_err(|e| Error::Unexpected {
                    what: "Node object",
                    detail: e.to_string(),
                })?;
        }
        for i in 0..cluster.agents.len() {
            let env = cluster.agent_env(i);
            cluster.agents[i].options_mut().env = env;
        }
        for i in 0..cluster.opts.operators {
            cluster.start_operator(&format!("op-{}", i + 1), i % cluster.opts.nodes)?;
        }
        if cluster.opts.start_agents {
            for i in 0..cluster.agents.len() {
                cluster.start_agent(i)?;
            }
        }
        Ok(cluster)
    }

    /// The name of node `i`: `n{i+1}`.
    pub fn node_name(i: usize) -> String {
        format!("n{}", i + 1)
    }

    /// The underlay address of node `i`: `192.0.2.{i+1}`.
    pub fn node_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(192, 0, 2, i as u8 + 1)
    }

    /// The pod CIDR the Node object of node `i` carries with [`Ipam::Kubernetes`].
    pub fn node_pod_cidr(i: usize) -> String {
        format!("10.245.{}.0/24", 11 + i)
    }

    /// The Node object of node `i`, as the cluster applies it (and a test re-applies it).
    pub fn node_yaml(&self, i: usize) -> String {
        let spec = match self.opts.ipam {
            Ipam::Kubernetes => format!("spec: {{ podCIDRs: [ {} ] }}\n", Self::node_pod_cidr(i)),
            Ipam::ClusterPool { .. } => String::new(),
        };
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{ name: {} }}\n{spec}\
             status: {{ addresses: [ {{ type: InternalIP, address: {} }} ] }}\n",
            Self::node_name(i),
            Self::node_ip(i)
        )
    }

    /// The agent environment of node `i`: Kubernetes mode on the API server, the routing
    /// mode, the IPAM mode, then the options' extra environment.
    pub fn agent_env(&self, i: usize) -> Vec<(String, String)> {
        let mut env = self.api.agent_env(&Self::node_name(i));
        env.retain(|(k, _)| k != "CELLIUM_IPAM");
        let ipam = match self.opts.ipam {
            Ipam::Kubernetes => "kubernetes",
            Ipam::ClusterPool { .. } => "cluster-pool",
        };
        env.push(("CELLIUM_IPAM".into(), ipam.into()));
        env.push((
            "CELLIUM_ROUTING_MODE".into(),
            self.opts.routing_mode.as_str().into(),
        ));
        env.extend(self.opts.agent_env.iter().cloned());
        env
    }

    /// Starts the agent of node `i` (again) and waits until it answers.
    pub fn start_agent(&mut self, i: usize) -> Result<()> {
        self.agents[i].start()
    }

    /// Starts the agent of node `i` without waiting for it (`ipam: cluster-pool` waits for its
    /// CIDRs before it answers).
    pub fn launch_agent(&mut self, i: usize) -> Result<()> {
        self.agents[i].launch()
    }

    /// Starts `cellium-operator` with `operator-id` `id` in node `node`'s namespace, with the
    /// cluster's pool (if any), a short lease (3 s, renewed every 200 ms) and the options'
    /// extra environment.
    pub fn start_operator(&mut self, id: &str, node: usize) -> Result<&mut Operator> {
        let program = self.agents[node].binaries().dir().join("cellium-operator");
        if !program.is_file() {
            return Err(Error::MissingBinary {
                name: "cellium-operator",
                path: program.display().to_string(),
            });
        }
        let log = self.files.path().join(format!("{id}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| Error::Io {
                op: "open",
                path: log.display().to_string(),
                source,
            })?;
        let err = out.try_clone().map_err(|source| Error::Io {
            op: "open",
            path: log.display().to_string(),
            source,
        })?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!(
            "--net={}",
            self.agents[node].node().path().display()
        ))
        .arg("--")
        .arg(&program)
        .args(["run", "--k8s-api-server", &self.api.url()])
        .args(["--operator-id", id]);
        if let Some(kubeconfig) = &self.operator_kubeconfig {
            cmd.arg("--k8s-kubeconfig-path").arg(kubeconfig);
        }
        if let Ipam::ClusterPool { cidr, mask_size } = &self.opts.ipam {
            cmd.args(["--cluster-pool-ipv4-cidr", cidr])
                .args(["--cluster-pool-ipv4-mask-size", &mask_size.to_string()]);
        }
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CELLIUM_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("RUST_LOG", "info")
            .env("CELLIUM_LEADER_ELECTION_LEASE_DURATION", "3s")
            .env("CELLIUM_LEADER_ELECTION_RENEW_DEADLINE", "2s")
            .env("CELLIUM_LEADER_ELECTION_RETRY_PERIOD", "200ms")
            .envs(self.opts.operator_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: format!("nsenter ... {}", program.display()),
            source,
        })?;
        self.operators.push(Operator {
            id: id.into(),
            child: Some(child),
            log,
        });
        Ok(self.operators.last_mut().expect("just pushed"))
    }

    /// From now on the agents and operators started authenticate as the ServiceAccounts of
    /// `deploy/base/` (`kube-system/cellium` and `kube-system/cellium-operator`), each with a
    /// token the API server issued, in a kubeconfig: with the server's RBAC on
    /// ([`cellium_test_apiserver::ApiServer::enable_rbac`]), every call they make is
    /// authorized by the rules applied to it, as in a real cluster.
    pub fn use_service_accounts(&mut self) -> Result<()> {
        let agent = self.kubeconfig("cellium")?;
        for a in &mut self.agents {
            a.options_mut().env.push((
                "CELLIUM_K8S_KUBECONFIG_PATH".into(),
                agent.display().to_string(),
            ));
        }
        self.operator_kubeconfig = Some(self.kubeconfig("cellium-operator")?);
        Ok(())
    }

    /// A kubeconfig naming the API server with a token of ServiceAccount
    /// `kube-system/account`.
    fn kubeconfig(&self, account: &str) -> Result<PathBuf> {
        let token = self.api.api().service_account_token("kube-system", account);
        let path = self.files.path().join(format!("{account}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: cluster\n\
             clusters: [{{name: cluster, cluster: {{server: '{}'}}}}]\n\
             users: [{{name: {account}, user: {{token: '{token}'}}}}]\n\
             contexts: [{{name: cluster, context: {{cluster: cluster, user: {account}}}}}]\n",
            self.api.url()
        );
        std::fs::write(&path, text).map_err(|source| Error::Io {
            op: "write",
            path: path.display().to_string(),
            source,
        })?;
        Ok(path)
    }

    /// Removes the network of the pod `namespace/name` through `cellium-cni` DEL on its node;
    /// its object stays.
    pub fn remove_pod_network(&mut self, key: &str) -> Result<()> {
        let at = self
            .pods
            .iter()
            .position(|p| p.key == key)
            .ok_or_else(|| Error::Unexpected {
                what: "pod",
                detail: format!("no pod {key} in the cluster"),
            })?;
        let pod = self.pods.remove(at);
        self.agents[pod.node].del(&pod.container_id, &pod.netns.path())
    }

    /// The operators.
    pub fn operators_mut(&mut self) -> &mut [Operator] {
        &mut self.operators
    }

    /// The holder of the operators' Lease, if any.
    pub fn lease_holder(&self) -> Option<String> {
        let lease = self.api.api().get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "cellium-operator",
        )?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
    }

    /// The API server.
    pub fn api(&self) -> &K8sApi {
        &self.api
    }

    /// The agent of node `i`.
    pub fn agent(&self, i: usize) -> &Agent {
        &self.agents[i]
    }

    /// The agent of node `i`, to stop, kill or start it.
    pub fn agent_mut(&mut self, i: usize) -> &mut Agent {
        &mut self.agents[i]
    }

    /// The underlay namespace (the bridge every node is on).
    pub fn underlay(&self) -> &NetNs {
        &self.underlay
    }

    /// A host on the underlay that is no node: a new namespace whose `eth0` has `cidr` (an
    /// address of the underlay's `192.0.2.0/24`), its veth's other end `port` on the bridge.
    /// Dropping it removes the namespace and the link.
    pub fn underlay_host(&self, port: &str, cidr: &str) -> Result<NetNs> {
        let ns = NetNs::new()?;
        join_underlay(&self.underlay, port, &ns, "eth0", cidr)?;
        Ok(ns)
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, key: &str) -> Result<&ClusterPod> {
        self.pods
            .iter()
            .find(|p| p.key == key)
            .ok_or_else(|| Error::Unexpected {
                what: "pod",
                detail: format!("no pod {key} in the cluster"),
            })
    }

    /// The pods.
    pub fn pods(&self) -> &[ClusterPod] {
        &self.pods
    }

    /// `kubectl apply` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        self.api.apply(yaml).map(|_| ())
    }

    /// Creates the Kubernetes namespace `name` with `labels` (`k=v`, comma-separated; may be
    /// empty).
    pub fn namespace(&self, name: &str, labels: &str) -> Result<()> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{ name: {name}, labels: {{ {} }} }}\n",
            yaml_labels(labels)
        ))
    }

    /// Creates the pod `namespace/name` on node `node`: its object (with `labels`, `k=v`
    /// comma-separated, and `ports`, `(name, port, protocol)`) through the API server, then
    /// its network through `cellium-cni` on that node, as a kubelet would. Its namespace must
    /// exist.
    pub fn add_pod(
        &mut self,
        node: usize,
        key: &str,
        labels: &str,
        ports: &[(&str, u16, &str)],
    ) -> Result<&ClusterPod> {
        let (ns, name) = split_key(key)?;
        let ports: Vec<String> = ports
            .iter()
            .map(|(n, p, proto)| format!("{{ name: {n}, containerPort: {p}, protocol: {proto} }}"))
            .collect();
        self.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, namespace: {ns}, labels: {{ {} }} }}\n\
             spec: {{ nodeName: {}, containers: [ {{ name: c, image: x, ports: [ {} ] }} ] }}\n",
            yaml_labels(labels),
            Self::node_name(node),
            ports.join(", ")
        ))?;
        self.create_pod_network(node, key)
    }

    /// Creates the network of the pod `namespace/name`, whose object exists already (naming
    /// node `node`), through `cellium-cni` on that node.
    pub fn create_pod_network(&mut self, node: usize, key: &str) -> Result<&ClusterPod> {
        let (ns, name) = split_key(key)?;
        let netns = NetNs::new()?;
        self.created += 1;
        let container_id = format!("cl{}x{}", self.created, std::process::id());
        let ip = self.agents[node].add_pod(&netns, &container_id, ns, name)?;
        self.pods.push(ClusterPod {
            key: key.into(),
            node,
            container_id,
            netns,
            ip,
        });
        Ok(self.pods.last().expect("just pushed"))
    }

    /// Probes from the pod `from` to the pod `to`.
    pub fn reach(&self, from: &str, to: &str, what: Probe) -> Result<Outcome> {
        let (from, to) = (self.pod(from)?, self.pod(to)?);
        probe(&from.netns, None, to.ip, what, PROBE_TIMEOUT)
    }

    /// Whether a probe from `from` to `to` is answered.
    pub fn reaches(&self, from: &str, to: &str, what: Probe) -> bool {
        matches!(self.reach(from, to, what), Ok(Outcome::Answered))
    }

    /// The pods as places of a truth table ([`crate::lab::table::run`]), IPv4.
    pub fn places(&self) -> Vec<Place> {
        self.pods
            .iter()
            .map(|p| Place {
                name: p.key.clone(),
                kind: PlaceKind::Pod,
                netns: p.netns.name().into(),
                ip: p.ip,
                ip6: None,
            })
            .collect()
    }

    /// `kubectl apply` of policies, then waits until every agent has taken a change in and
    /// every endpoint of every node enforces its agent's revision.
    pub fn apply_policy(&self, yaml: &str) -> Result<()> {
        let before: Vec<u64> = self
            .agents
            .iter()
            .map(Agent::policy_revision)
            .collect::<Result<_>>()?;
        self.apply(yaml)?;
        for (agent, before) in self.agents.iter().zip(before) {
            agent.wait_policy_revision_after(before)?;
        }
        for agent in &self.agents {
            agent.settle()?;
        }
        Ok(())
    }

    /// The routes the agent of node `i` owns (`ip route show proto 206`).
    pub fn routes(&self, i: usize) -> Result<String> {
        self.agents[i].node().ip(&["route", "show", "proto", "206"])
    }

    /// Whether the agent of node `i` has `ip` in its ipcache as a remote entry (`cellium
    /// ipcache list`).
    pub fn ipcache_has_remote(&self, i: usize, ip: IpAddr) -> bool {
        let prefix = match ip {
            IpAddr::V4(_) => format!("{ip}/32"),
            IpAddr::V6(_) => format!("{ip}/128"),
        };
        self.agents[i].cli(&["ipcache", "list"]).is_ok_and(|list| {
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(&prefix) && l.contains("remote"))
        })
    }

    /// Every agent's and operator's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = Vec::new();
        for (i, a) in self.agents.iter().enumerate() {
            out.push(format!(
                "---- agent {} ----\n{}",
                Self::node_name(i),
                a.log()
            ));
        }
        for o in &self.operators {
            out.push(format!("---- operator {} ----\n{}", o.id, o.log()));
        }
        out.join("\n")
    }

    /// Waits until `ok` holds; fails naming `what` after [`CONVERGE`].
    pub fn eventually(&self, what: &str, ok: impl FnMut() -> bool) -> Result<Duration> {
        crate::wait::poll_until(what, CONVERGE, ok)
    }

    /// A TCP listener address on pod `key` at `port`.
    pub fn pod_addr(&self, key: &str, port: u16) -> Result<SocketAddr> {
        Ok(SocketAddr::new(IpAddr::V4(self.pod(key)?.ip), port))
    }
}

/// Puts `ns` on the underlay: a veth pair, `ifname` in `ns` with the address `cidr`, the other
/// end `port` on the bridge.
fn join_underlay(underlay: &NetNs, port: &str, ns: &NetNs, ifname: &str, cidr: &str) -> Result<()> {
    veth::pair(underlay, port, ns, ifname)?;
    underlay.ip(&["link", "set", port, "master", BRIDGE])?;
    underlay.ip(&["link", "set", port, "up"])?;
    ns.ip(&["addr", "add", cidr, "dev", ifname])?;
    ns.ip(&["link", "set", ifname, "up"])?;
    Ok(())
}

fn split_key(key: &str) -> Result<(&str, &str)> {
    key.split_once('/').ok_or_else(|| Error::Unexpected {
        what: "pod key",
        detail: format!("{key:?} is not namespace/name"),
    })
}

/// `a=b,c=d` as the inside of a YAML flow mapping.
fn yaml_labels(labels: &str) -> String {
    labels
        .split(',')
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! A running `cellium-agent` in a node network namespace of its own, with its CLI and its CNI
//! plugin at hand, for end-to-end suites.
//!
//! [`Agent::start_new`] makes a node namespace and a temporary directory holding the state
//! directory, the API socket, the BPF root and the agent's log, starts the agent with
//! `nsenter --net=<node> -- cellium-agent run ...` and waits until its API answers. Another
//! agent built from the cells (an example such as `connectivity_agent`) runs the same way with
//! [`AgentOptions::program`].
//!
//! Why `nsenter` and not `ip netns exec`: the latter also gives the process a private mount
//! namespace, so the bpffs the agent mounts at its BPF root would vanish when it exits, and its
//! pinned maps and links with it: a restart test would test nothing. With `nsenter --net` the
//! agent mounts bpffs in the host's mount namespace, where it outlives the process as in
//! production, and the guard unmounts it.
//!
//! The binaries are the ones `cargo build --workspace` put next to the test executable's target
//! directory (`target/debug/{cellium-agent,cellium,cellium-cni}`); a missing one is an error that
//! says to build them. Dropping the [`Agent`] kills the agent and removes its mount, directory
//! and node namespace (and so every host-side veth), also when a test fails; a failing test
//! gets the agent's log on stderr. Pods are further [`NetNs`] guards of the test's own.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::cni::{CniCall, CniProcess, result_ipv4};
use crate::error::{Error, Result};
use crate::netns::NetNs;

/// How long a policy change may take to be enforced by every endpoint.
const POLICY_SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The port the agent serves metrics on, on the node namespace's loopback.
pub const METRICS_PORT: u16 = 9962;

/// How long the agent may take from exec to answering its API (loading the datapath runs the
/// verifier, which takes seconds on a busy 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `stop` waits for the agent to exit after SIGTERM before killing it.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The built binaries the suites run.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `cellium-agent`.
    pub agent: PathBuf,
    /// `cellium`, the CLI.
    pub cli: PathBuf,
    /// `cellium-cni`, the plugin.
    pub cni: PathBuf,
}

impl Binaries {
    /// The binaries in the target directory of the running test executable
    /// (`target/debug/deps/<test>` -> `target/debug/`).
    pub fn find() -> Result<Binaries> {
        let exe = std::env::current_exe().map_err(|source| Error::Io {
            op: "locate",
            path: "the test executable".into(),
            source,
        })?;
        let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        if dir.ends_with("deps") {
            dir.pop();
        }
        Binaries::in_dir(&dir)
    }

    /// The programs in `dir`: another build's (an upgrade test's previous release).
    pub fn in_dir(dir: &Path) -> Result<Binaries> {
        let find = |name: &'static str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(Error::MissingBinary {
                    name,
                    path: path.display().to_string(),
                })
            }
        };
        Ok(Binaries {
            agent: find("cellium-agent")?,
            cli: find("cellium")?,
            cni: find("cellium-cni")?,
        })
    }

    /// The example program `name` of the workspace (`target/debug/examples/<name>`, built by
    /// `cargo build --workspace --all-targets`).
    pub fn example(&self, name: &'static str) -> Result<PathBuf> {
        let path = self.dir().join("examples").join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::MissingBinary {
                name,
                path: path.display().to_string(),
            })
        }
    }

    /// The directory holding them: the plugin directory a runtime is pointed at.
    pub fn dir(&self) -> &Path {
        self.cni.parent().unwrap_or(Path::new("."))
    }
}

/// How the agent is run.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The program run as the agent: `None` is `cellium-agent run`; another agent built from
    /// the cells (see [`Binaries::example`]) is given the same flags (`--state-dir`,
    /// `--api-socket`, `--bpf-root`, `--metrics-addr`, `--pod-cidr`) without a subcommand.
    pub program: Option<PathBuf>,
    /// `--pod-cidr` values, passed as written (so a malformed one reaches the agent).
    pub pod_cidrs: Vec<String>,
    /// Extra environment (e.g. `CELLIUM_*` configuration keys).
    pub env: Vec<(String, String)>,
    /// `RUST_LOG` of the agent.
    pub log_filter: String,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            program: None,
            pod_cidrs: vec!["10.244.0.0/24".into()],
            env: Vec::new(),
            log_filter: "info".into(),
        }
    }
}

impl AgentOptions {
    /// The defaults with `cidr` as the only pod CIDR.
    pub fn with_pod_cidr(cidr: &str) -> AgentOptions {
        AgentOptions {
            pod_cidrs: vec![cidr.into()],
            ..AgentOptions::default()
        }
    }
}

/// A `cellium-agent` in its own node namespace; see the module docs.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    bins: Binaries,
    opts: AgentOptions,
    node: NetNs,
    dir: tempfile::TempDir,
}

impl Agent {
    /// Makes a node namespace and a directory, starts the agent and waits until it answers.
    pub fn start_new(opts: AgentOptions) -> Result<Agent> {
        let mut agent = Agent::prepare(opts)?;
        agent.start()?;
        Ok(agent)
    }

    /// Makes a node namespace and a directory, and starts nothing yet: for a test that puts
    /// something on the node (an API server) before [`Agent::start`].
    pub fn prepare(opts: AgentOptions) -> Result<Agent> {
        let bins = Binaries::find()?;
        let node = NetNs::new()?;
        let dir = crate::temp_dir("cel-agent-")?;
        Ok(Agent {
            child: None,
            bins,
            opts,
            node,
            dir,
        })
    }

    /// Starts the agent (again) on the same node, state and BPF root, and waits until its API
    /// answers. Fails, with the agent's log, if it exits first or does not answer in time.
    pub fn start(&mut self) -> Result<()> {
        self.launch()?;
        self.wait_ready()
    }

    /// Starts the agent (again) on the same node, state and BPF root, without waiting for it:
    /// for a caller that times the start itself ([`Agent::wait_ready`] waits as `start` does).
    pub fn launch(&mut self) -> Result<()> {
        if self.is_running() {
            return Err(Error::Agent {
                what: "is already running".into(),
                log: self.log(),
            });
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(self.io("open", &self.log_path()))?;
        let stderr = log.try_clone().map_err(self.io("open", &self.log_path()))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.node.path().display()))
            .arg("--");
        match &self.opts.program {
            Some(program) => cmd.arg(program),
            None => cmd.arg(&self.bins.agent).arg("run"),
        };
        cmd.arg("--state-dir")
            .arg(self.state_dir())
            .arg("--api-socket")
            .arg(self.socket())
            .arg("--bpf-root")
            .arg(self.bpf_root())
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{METRICS_PORT}"));
        for cidr in &self.opts.pod_cidrs {
            cmd.arg("--pod-cidr").arg(cidr);
        }
        // Configuration keys of the test's own environment must not leak in: an unknown
        // `CELLIUM_*` variable is an error.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CELLIUM_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("RUST_LOG", &self.opts.log_filter)
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: format!("nsenter ... {}", self.program().display()),
            source,
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the agent with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            child.wait().map_err(self.io("wait for", self.program()))?;
        }
        Ok(())
    }

    /// Kills the agent and takes its datapath off the node: the BPF root unmounted (so pinned
    /// maps and tcx links go with their last reference) and every device's clsact qdisc
    /// deleted (with the filters that hold the programs). The node keeps the devices,
    /// addresses and routes the agent made, with no BPF attached to them: a benchmark's
    /// baseline of plain kernel routing. Fails if a BPF filter is still on a device.
    /// [`Agent::start`] afterwards loads and attaches everything afresh.
    pub fn kill_and_unpin(&mut self) -> Result<()> {
        self.kill()?;
        let root = self.bpf_root();
        if is_bpffs(&root) {
            umount2(&root, MntFlags::MNT_DETACH).map_err(|e| Error::Io {
                op: "unmount",
                path: root.display().to_string(),
                source: e.into(),
            })?;
        }
        let links = self.node.ip(&["-o", "link", "show"])?;
        let devices: Vec<&str> = links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name))
            .collect();
        for dev in &devices {
            // No clsact on a device is no error: there is nothing to take off.
            let _ = self
                .node
                .exec("tc", &["qdisc", "del", "dev", dev, "clsact"]);
        }
        for dev in &devices {
            for hook in ["ingress", "egress"] {
                let filters = self
                    .node
                    .exec("tc", &["filter", "show", "dev", dev, hook])
                    .unwrap_or_default();
                if filters.contains("bpf") {
                    return Err(Error::Unexpected {
                        what: "BPF filter left on a device",
                        detail: format!("{dev} {hook}: {filters}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Sends SIGTERM and waits for the agent to exit; returns its exit status and how long it
    /// took. An agent still running after 20 s is killed and reported as an error.
    pub fn stop(&mut self) -> Result<(ExitStatus, Duration)> {
        let Some(mut child) = self.child.take() else {
            return Err(Error::Agent {
                what: "is not running".into(),
                log: self.log(),
            });
        };
        let began = Instant::now();
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGTERM).map_err(|e| self.io("signal", self.program())(e.into()))?;
        loop {
            if let Some(status) = child
                .try_wait()
                .map_err(self.io("wait for", self.program()))?
            {
                return Ok((status, began.elapsed()));
            }
            if began.elapsed() > STOP_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Agent {
                    what: format!("did not exit within {STOP_TIMEOUT:?} of SIGTERM"),
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The agent's process id while it runs (`nsenter` execs the agent, so it is the agent's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the agent process is alive.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// How the agent is run: change it between a stop and the next [`Agent::start`] (another
    /// pod CIDR, a configuration key in `env`).
    pub fn options_mut(&mut self) -> &mut AgentOptions {
        &mut self.opts
    }

    /// The node namespace the agent runs in.
    pub fn node(&self) -> &NetNs {
        &self.node
    }

    /// The host ends of veth pairs in the node namespace (`lxc...`).
    pub fn lxc_links(&self) -> Result<BTreeSet<String>> {
        Ok(self
            .node
            .ip(&["-o", "link", "show"])?
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with("lxc"))
            .collect())
    }

    /// The built binaries.
    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("api.sock")
    }

    /// The state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The BPF root (a bpffs the agent mounts).
    pub fn bpf_root(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    /// The agent's log file (stdout and stderr of every run, appended).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    /// Everything the agent has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs `cellium --socket <socket> args...` and returns its stdout; fails unless it exits 0.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.bins.cli)
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .output()
            .map_err(|source| Error::Spawn {
                cmd: format!("cellium {}", args.join(" ")),
                source,
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("cellium {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `cellium <verb> -f` (`apply` or `delete`) of a YAML text, through a file in the agent's
    /// directory as a person would.
    pub fn objects(&self, verb: &str, yaml: &str) -> Result<String> {
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.path().join(format!("objects-{n}.yaml"));
        std::fs::write(&path, yaml).map_err(self.io("write", &path))?;
        self.cli(&[verb, "-f", &path.display().to_string()])
    }

    /// The policy repository's revision (`cellium policy get`).
    pub fn policy_revision(&self) -> Result<u64> {
        let v = self.cli_json(&["policy", "get"])?;
        v["revision"].as_u64().ok_or_else(|| Error::Unexpected {
            what: "cellium policy get",
            detail: v.to_string(),
        })
    }

    /// Waits until the repository's revision is past `before`: it has taken a change in.
    pub fn wait_policy_revision_after(&self, before: u64) -> Result<u64> {
        let began = Instant::now();
        loop {
            let now = self.policy_revision()?;
            if now > before {
                return Ok(now);
            }
            if began.elapsed() > POLICY_SETTLE_TIMEOUT {
                return Err(Error::Unexpected {
                    what: "policy revision",
                    detail: format!(
                        "still {now} {POLICY_SETTLE_TIMEOUT:?} after a change; the agent did not take it in"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every endpoint is ready and reports that it enforces the repository's
    /// current revision, twice in a row (a regeneration may be on its way); returns it.
    pub fn settle(&self) -> Result<u64> {
        let began = Instant::now();
        let mut seen: Option<u64> = None;
        loop {
            let revision = self.policy_revision()?;
            let endpoints = self.endpoints()?;
            let behind: Vec<String> = endpoints
                .iter()
                .filter(|e| {
                    e["state"] != "ready" || e["policy_revision"].as_u64().unwrap_or(0) < revision
                })
                .map(|e| format!("{} at {}", e["pod"], e["policy_revision"]))
                .collect();
            if behind.is_empty() {
                if seen == Some(revision) {
                    return Ok(revision);
                }
                seen = Some(revision);
            } else {
                seen = None;
            }
            if began.elapsed() > POLICY_SETTLE_TIMEOUT {
                return Err(Error::Unexpected {
                    what: "policy enforcement",
                    detail: format!(
                        "after {POLICY_SETTLE_TIMEOUT:?} at revision {revision}, endpoints behind: {}",
                        behind.join(", ")
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `cellium apply -f` of policies in `yaml`; waits until the repository has taken them in
    /// and every endpoint enforces the resulting revision, which it returns.
    pub fn apply_policy(&self, yaml: &str) -> Result<u64> {
        let before = self.policy_revision()?;
        self.objects("apply", yaml)?;
        self.wait_policy_revision_after(before)?;
        self.settle()
    }

    /// The flows the agent reports dropped, as Hubble's JSON objects (none while the agent
    /// does not answer).
    pub fn dropped_flows(&self) -> Vec<Value> {
        self.cli(&["observe", "--all", "--verdict", "DROPPED", "-o", "json"])
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    /// Runs a listing command with `-o json` and parses its output.
    pub fn cli_json(&self, args: &[&str]) -> Result<Value> {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        let text = self.cli(&full)?;
        serde_json::from_str(&text).map_err(|source| Error::Json {
            what: format!("cellium {}", full.join(" ")),
            text,
            source,
        })
    }

    /// `cellium endpoint list -o json`.
    pub fn endpoints(&self) -> Result<Vec<Value>> {
        Ok(as_array(self.cli_json(&["endpoint", "list"])?))
    }

    /// The interface of the endpoint holding `ip`, as the datapath sees it (from
    /// `cellium endpoint list`). Panics when no endpoint holds it: a test's precondition.
    pub fn endpoint_link(&self, ip: std::net::IpAddr) -> EndpointLink {
        let eps = self.endpoints().expect("endpoint list");
        let prefix = format!("{ip}/");
        let ep = eps
            .iter()
            .find(|e| {
                e["addresses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|a| a.as_str().is_some_and(|a| a.starts_with(&prefix)))
            })
            .unwrap_or_else(|| panic!("no endpoint with {ip} in {eps:?}"));
        let text = |k: &str| {
            ep[k]
                .as_str()
                .unwrap_or_else(|| panic!("no {k} in {ep}"))
                .to_string()
        };
        EndpointLink {
            host_ifname: text("host_ifname"),
            host_mac: mac(&text("host_mac")),
            pod_mac: mac(&text("pod_mac")),
        }
    }

    /// `cellium ipam list -o json`.
    pub fn pools(&self) -> Result<Vec<Value>> {
        Ok(as_array(self.cli_json(&["ipam", "list"])?))
    }

    /// The network configuration a runtime would pass the plugin for this agent, written in
    /// `cni_version`.
    pub fn net_conf(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "name": "cellium",
            "type": "cellium-cni",
            "socket": self.socket(),
            "timeout": "30s",
        })
    }

    /// Runs the plugin once, as a runtime does, and waits for it.
    pub fn cni(&self, call: &CniCall) -> Result<(ExitStatus, Value)> {
        self.spawn_cni(call)?.wait()
    }

    /// Starts the plugin for `call` without waiting, so that many can run at once.
    pub fn spawn_cni(&self, call: &CniCall) -> Result<CniProcess> {
        let mut cmd = match call.via.split_first() {
            None => Command::new(&self.bins.cni),
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&self.bins.cni);
                cmd
            }
        };
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        let cni_path = format!("{}:/usr/lib/cni", self.bins.dir().display());
        cmd.env("CNI_PATH", cni_path)
            .envs(call.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: format!("cellium-cni ({})", call.describe()),
            source,
        })?;
        let stdin = call.stdin.clone().unwrap_or_else(|| {
            serde_json::to_vec(&self.net_conf(&call.cni_version)).unwrap_or_default()
        });
        if let Some(mut pipe) = child.stdin.take() {
            // A configuration is far smaller than a pipe's buffer: this cannot block on the
            // plugin, and dropping the pipe closes it so the plugin sees the end.
            pipe.write_all(&stdin)
                .map_err(self.io("write stdin of", &self.bins.cni))?;
        }
        Ok(CniProcess {
            child,
            what: call.describe(),
        })
    }

    /// ADD of `container_id` in `pod` (interface `eth0`); fails unless the plugin succeeds.
    /// Returns the pod's IPv4 address and the plugin's result.
    pub fn add(&self, pod: &NetNs, container_id: &str) -> Result<(Ipv4Addr, Value)> {
        self.add_call(&CniCall::new("ADD", container_id).netns(pod.path()))
    }

    /// ADD of `container_id` in `pod` for the Kubernetes pod `namespace/name` (named in
    /// `CNI_ARGS` as the kubelet does), so the endpoint gets the pod's labels.
    pub fn add_pod(
        &self,
        pod: &NetNs,
        container_id: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Ipv4Addr> {
        let call = CniCall::new("ADD", container_id)
            .netns(pod.path())
            .args(&format!(
                "K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
            ));
        Ok(self.add_call(&call)?.0)
    }

    /// Runs an ADD `call`; fails unless the plugin succeeds. Returns the pod's IPv4 address and
    /// the plugin's result.
    pub fn add_call(&self, call: &CniCall) -> Result<(Ipv4Addr, Value)> {
        let (status, out) = self.cni(call)?;
        if !status.success() {
            return Err(Error::Unexpected {
                what: "CNI ADD failure",
                detail: format!("{} ({status}): {out}", call.describe()),
            });
        }
        let ip = result_ipv4(&out).ok_or_else(|| Error::Unexpected {
            what: "CNI ADD result",
            detail: out.to_string(),
        })?;
        Ok((ip, out))
    }

    /// DEL of `container_id` (interface `eth0`) with `netns`; fails unless the plugin succeeds.
    pub fn del(&self, container_id: &str, netns: &Path) -> Result<()> {
        let call = CniCall::new("DEL", container_id).netns(netns);
        let (status, out) = self.cni(&call)?;
        if !status.success() {
            return Err(Error::Unexpected {
                what: "CNI DEL failure",
                detail: format!("{} ({status}): {out}", call.describe()),
            });
        }
        Ok(())
    }

    /// The agent's Prometheus metrics, fetched inside the node namespace.
    pub fn metrics(&self) -> Result<String> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, METRICS_PORT));
        let text = self.node.run(move || -> std::io::Result<String> {
            let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            conn.set_read_timeout(Some(Duration::from_secs(5)))?;
            conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
            let mut text = String::new();
            conn.read_to_string(&mut text)?;
            Ok(text)
        })?;
        text.map_err(|source| Error::Probe {
            probe: "metrics scrape",
            target: addr.to_string(),
            source,
        })
    }

    /// Packets the datapath dropped so far, for any reason (from the agent's metrics).
    pub fn datapath_drops(&self) -> Result<u64> {
        let text = self.metrics()?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("cellium_datapath_packets"))
            .filter(|l| !l.contains("reason=\"forwarded\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    /// The datapath's packet counter for (direction, reason), with the labels the metrics give
    /// them (`"egress"`, `"first fragment not seen"`, ...).
    pub fn datapath_packets(&self, direction: &str, reason: &str) -> Result<u64> {
        let labels = format!("direction=\"{direction}\",reason=\"{reason}\"");
        Ok(self
            .metrics()?
            .lines()
            .filter(|l| l.starts_with("cellium_datapath_packets") && l.contains(&labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    /// Waits until the launched agent answers on its API; fails, with its log, if it exits
    /// first or does not answer in time.
    pub fn wait_ready(&mut self) -> Result<()> {
        let began = Instant::now();
        loop {
            let exited = match &mut self.child {
                Some(child) => child
                    .try_wait()
                    .map_err(self.io("wait for", self.program()))?,
                None => None,
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(Error::Agent {
                    what: format!("exited ({status}) before its API answered"),
                    log: self.log(),
                });
            }
            // The socket appears when the API server starts, which is after every other cell:
            // an answer to Agent.Status means endpoints are restored and CNI calls are served.
            if self.socket().exists() && self.cli(&["status"]).is_ok() {
                return Ok(());
            }
            if began.elapsed() > START_TIMEOUT {
                return Err(Error::Agent {
                    what: format!("did not answer on its API within {START_TIMEOUT:?}"),
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// From the next start on, runs the programs of `bins`: the agent, the CLI and the plugin
    /// its CNI calls run (an upgrade, or a downgrade).
    pub fn use_binaries(&mut self, bins: Binaries) {
        self.bins = bins;
    }

    /// The program run as the agent.
    fn program(&self) -> &Path {
        self.opts.program.as_deref().unwrap_or(&self.bins.agent)
    }

    fn io(&self, op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.display().to_string();
        move |source| Error::Io { op, path, source }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- agent log ({}) ----\n{}---- end of agent log ----",
                self.log_path().display(),
                self.log()
            );
        }
        let root = self.bpf_root();
        // Lazy: pinned links may still be in use until the node namespace's devices go.
        if is_bpffs(&root)
            && let Err(e) = umount2(&root, MntFlags::MNT_DETACH)
        {
            tracing::warn!(path = %root.display(), error = %e, "cannot unmount the agent's bpffs");
        }
        // The node namespace (every host-side veth with it) and the directory go with the
        // fields.
    }
}

fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

fn as_array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items,
        _ => Vec::new(),
    }
}

/// An endpoint's interface as the datapath sees it: the host end's name and both MACs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointLink {
    /// The host end of the pod's veth.
    pub host_ifname: String,
    /// The host end's MAC.
    pub host_mac: [u8; 6],
    /// The pod end's MAC.
    pub pod_mac: [u8; 6],
}

/// `aa:bb:cc:dd:ee:ff` as bytes.
fn mac(text: &str) -> [u8; 6] {
    let mut out = [0u8; 6];
    for (b, part) in out.iter_mut().zip(text.split(':')) {
        *b = u8::from_str_radix(part, 16).expect("mac");
    }
    out
}

/// The Pod objects `default/<name>` with the label `app: <name>`, one per name, for
/// [`Agent::objects`].
pub fn pod_objects(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {n}, labels: {{ app: {n} }} }}\nspec: {{ containers: [ {{ name: c }} ] }}\n---\n"
            )
        })
        .collect()
}

//! The few lines the services suite needs to run the real agent: `cellium-agent` in a node
//! namespace of its own (`nsenter --net`, so the bpffs it mounts lives in the host's mount
//! namespace and its pins survive a restart, as in production), its CLI, and pods created
//! through the real `cellium-cni`. Dropping [`Agent`] kills the agent, unmounts its bpffs and
//! deletes its directory and node namespace (every host-side veth with it), also when a test
//! fails, which then prints the agent's log.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cellium_integration::NetNs;
use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// Loading the datapath runs the verifier: seconds on a busy 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The directory of the built binaries (`target/debug`), next to the test executable's
/// `deps/`.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: run `cargo build --workspace` before this suite",
            path.display()
        );
    }
    Ok(path)
}

/// A running agent; see the module docs.
pub struct Agent {
    child: Option<Child>,
    dir: tempfile::TempDir,
    node: NetNs,
}

impl Agent {
    /// A node namespace, a state directory, and the agent started and answering.
    pub fn start_new() -> anyhow::Result<Agent> {
        let mut agent = Agent {
            child: None,
            dir: tempfile::Builder::new().prefix("cel-svc-").tempdir()?,
            node: NetNs::new()?,
        };
        agent.start()?;
        Ok(agent)
    }

    /// Starts the agent (again, on the same state and BPF root) and waits for its API.
    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.node.path().display()))
            .arg("--")
            .arg(binary("cellium-agent")?)
            .arg("run")
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .arg("--api-socket")
            .arg(self.socket())
            .arg("--bpf-root")
            .arg(self.bpf_root())
            .arg("--metrics-addr")
            .arg("127.0.0.1:0")
            .arg("--pod-cidr")
            .arg("10.244.0.0/24");
        // Configuration of the test's own environment must not leak in.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CELLIUM_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(
            cmd.spawn()
                .context("cannot start nsenter ... cellium-agent")?,
        );
        let began = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "the agent exited ({status}) before answering:\n{}",
                    self.log()
                );
            }
            if self.socket().exists() && self.cli(&["status"]).is_ok() {
                return Ok(());
            }
            if began.elapsed() > START_TIMEOUT {
                bail!(
                    "the agent did not answer within {START_TIMEOUT:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and waits for the agent to exit.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("the agent is not running");
        };
        let pid = i32::try_from(child.id())?;
        kill(Pid::from_raw(pid), Signal::SIGTERM)?;
        let began = Instant::now();
        while child.try_wait()?.is_none() {
            if began.elapsed() > STOP_TIMEOUT {
                let _ = child.kill();
                bail!("the agent did not exit within {STOP_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("api.sock")
    }

    fn bpf_root(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    /// Everything the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `cellium --socket <socket> args...`; its stdout, or an error with its stderr.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(binary("cellium")?)
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "cellium {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `cellium apply -f` (or `delete`) of a YAML text.
    pub fn kubectl(&self, verb: &str, yaml: &str) -> anyhow::Result<String> {
        let file = self.dir.path().join("objects.yaml");
        std::fs::write(&file, yaml)?;
        let path = file.display().to_string();
        self.cli(&[verb, "-f", &path])
    }

    /// `cellium service list -o json`.
    pub fn frontends(&self) -> anyhow::Result<Vec<Value>> {
        let text = self.cli(&["service", "list", "-o", "json"])?;
        match serde_json::from_str(&text)? {
            Value::Array(items) => Ok(items),
            other => bail!("service list printed {other}"),
        }
    }

    /// Runs the plugin as a runtime does: `command` for `container_id` (interface `eth0`)
    /// in `pod`, naming the pod `namespace/name`. Returns its result.
    pub fn cni(
        &self,
        command: &str,
        container_id: &str,
        pod: &NetNs,
        name: &str,
    ) -> anyhow::Result<Value> {
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "cellium",
            "type": "cellium-cni",
            "socket": self.socket(),
        });
        let mut cmd = Command::new(binary("cellium-cni")?);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        let mut child = cmd
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", bin_dir())
            .env(
                "CNI_ARGS",
                format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(conf.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("cellium-cni {command} {container_id} failed: {text}");
        }
        Ok(if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)?
        })
    }

    /// CNI ADD of a pod; returns its IPv4 address.
    pub fn add_pod(&self, container_id: &str, pod: &NetNs, name: &str) -> anyhow::Result<Ipv4Addr> {
        let result = self.cni("ADD", container_id, pod, name)?;
        result["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next()?.parse().ok())
            .with_context(|| format!("no address in the ADD result {result}"))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- agent log ----\n{}---- end of agent log ----",
                self.log()
            );
        }
        let root = self.bpf_root();
        let is_bpffs = nix::sys::statfs::statfs(&root)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC);
        // Lazy: pinned links stay busy until the node namespace's devices are gone.
        if is_bpffs && let Err(e) = umount2(&root, MntFlags::MNT_DETACH) {
            eprintln!("cannot unmount {}: {e}", root.display());
        }
        // The node namespace and the directory go with the fields.
    }
}

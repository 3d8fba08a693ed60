//! A real etcd (Debian's `etcd-server`) for the kvstore tests and benchmark: its own data
//! directory and ports, inside a test's network namespace, killed on drop.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::netns::NetNs;

/// The client port; the peer port is the next one. Each etcd runs in its own namespace, so
/// every test may use the same.
pub const CLIENT_PORT: u16 = 2379;

/// A running etcd member (a cluster of one).
#[derive(Debug)]
pub struct Etcd {
    ns: NetNs,
    ip: IpAddr,
    data: tempfile::TempDir,
    child: Mutex<Option<Child>>,
}

impl Etcd {
    /// Starts etcd in `ns` on `ip` (an address of the namespace, or `127.0.0.1`), with a new
    /// data directory; returns once it answers.
    pub fn start(ns: &NetNs, ip: IpAddr) -> Result<Etcd> {
        let data = tempfile::Builder::new()
            .prefix("cel-etcd-")
            .tempdir()
            .map_err(|source| Error::Spawn {
                cmd: "etcd's data directory".into(),
                source,
            })?;
        let etcd = Etcd {
            ns: NetNs::existing(ns.name()),
            ip,
            data,
            child: Mutex::default(),
        };
        etcd.spawn()?;
        Ok(etcd)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("http://{}:{CLIENT_PORT}", self.ip)
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data.path().to_path_buf()
    }

    fn spawn(&self) -> Result<()> {
        let peer = format!("http://{}:{}", self.ip, CLIENT_PORT + 1);
        let client = self.url();
        let data = self.data.path().join("member");
        let args = [
            format!("--net={}", self.ns.path().display()),
            "--".into(),
            "etcd".into(),
            "--name=cel".into(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=cel={peer}"),
            "--log-level=error".into(),
            "--logger=zap".into(),
        ];
        let child = Command::new("nsenter")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| Error::Spawn {
                cmd: "nsenter ... etcd".into(),
                source,
            })?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_healthy()
    }

    /// Waits until `etcdctl endpoint health` says so (bounded: etcd that does not come up is
    /// an error naming it, not a hang).
    fn wait_healthy(&self) -> Result<()> {
        let mut last = String::new();
        for _ in 0..200 {
            match self.etcdctl(&["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Error::Unexpected {
            what: "etcd did not come up",
            detail: last,
        })
    }

    /// Runs `etcdctl ARGS` against it from its namespace; its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let endpoints = format!("--endpoints={}", self.url());
        let mut all = vec!["--dial-timeout=2s", "--command-timeout=5s", &endpoints];
        all.extend_from_slice(args);
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path().display()))
            .arg("--")
            .arg("etcdctl")
            .args(&all)
            .env("ETCDCTL_API", "3")
            .output()
            .map_err(|source| Error::Spawn {
                cmd: format!("etcdctl {}", args.join(" ")),
                source,
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("etcdctl {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The keys under `prefix`.
    pub fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        let out = self.etcdctl(&["get", "--prefix", "--keys-only", prefix])?;
        Ok(out
            .lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    /// Kills it (SIGKILL: a crash, no goodbye to clients).
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it (SIGSTOP) without closing anything: every request waits, as with an etcd too
    /// busy to answer, until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a paused etcd go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(child) = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, signal);
        }
    }

    /// Starts it again on the same data directory and address.
    pub fn restart(&self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

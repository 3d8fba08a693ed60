//! A real etcd (Debian's `etcd-server`) for the kvstore tests and benchmark: its own data
//! directory and ports, inside a test's network namespace, killed on drop; over plain HTTP, or
//! over TLS with client certificates required ([`EtcdTls`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::netns::NetNs;

/// The client port; the peer port is the next one. Each etcd runs in its own namespace, so
/// every test may use the same.
pub const CLIENT_PORT: u16 = 2379;

/// The PEM files of an etcd that serves TLS and requires client certificates
/// (`--client-cert-auth`): only clients whose certificate `ca` signed get in.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA of the server's certificate and of the client certificates it accepts.
    pub ca: PathBuf,
    /// The server's certificate (for the address etcd listens on) and key.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate `ca` signed, and its key: what `etcdctl` uses.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
}

/// A running etcd member (a cluster of one).
#[derive(Debug)]
pub struct Etcd {
    ns: NetNs,
    ip: IpAddr,
    tls: Option<EtcdTls>,
    data: tempfile::TempDir,
    child: Mutex<Option<Child>>,
}

impl Etcd {
    /// Starts etcd in `ns` on `ip` (an address of the namespace, or `127.0.0.1`), with a new
    /// data directory; returns once it answers.
    pub fn start(ns: &NetNs, ip: IpAddr) -> Result<Etcd> {
        Etcd::start_with(ns, ip, None)
    }

    /// As [`start`](Self::start), serving `https://` with `tls`'s certificates and accepting
    /// only clients with a certificate its CA signed.
    pub fn start_tls(ns: &NetNs, ip: IpAddr, tls: EtcdTls) -> Result<Etcd> {
        Etcd::start_with(ns, ip, Some(tls))
    }

    fn start_with(ns: &NetNs, ip: IpAddr, tls: Option<EtcdTls>) -> Result<Etcd> {
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
            tls,
            data,
            child: Mutex::default(),
        };
        etcd.spawn()?;
        Ok(etcd)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{CLIENT_PORT}", self.ip)
    }

    /// Its TLS files, if it serves TLS.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data.path().to_path_buf()
    }

    fn spawn(&self) -> Result<()> {
        let peer = format!("http://{}:{}", self.ip, CLIENT_PORT + 1);
        let client = self.url();
        let data = self.data.path().join("member");
        let mut args = vec![
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
        if let Some(tls) = &self.tls {
            args.extend([
                "--client-cert-auth".into(),
                format!("--trusted-ca-file={}", tls.ca.display()),
                format!("--cert-file={}", tls.server_cert.display()),
                format!("--key-file={}", tls.server_key.display()),
            ]);
        }
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

    /// Runs `etcdctl ARGS` against it from its namespace (with the client certificate of
    /// its TLS files, if any); its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let client = self
            .tls
            .as_ref()
            .map(|t| (t.client_cert.as_path(), t.client_key.as_path()));
        self.etcdctl_as(client, args)
    }

    /// Runs `etcdctl ARGS` as the client with certificate and key `client` (`None`: none),
    /// trusting its CA if it serves TLS: what etcd does with another client.
    pub fn etcdctl_as(&self, client: Option<(&Path, &Path)>, args: &[&str]) -> Result<String> {
        let mut all = vec![
            "--dial-timeout=2s".to_string(),
            "--command-timeout=5s".into(),
            format!("--endpoints={}", self.url()),
        ];
        if let Some(tls) = &self.tls {
            all.push(format!("--cacert={}", tls.ca.display()));
        }
        if let Some((cert, key)) = client {
            all.push(format!("--cert={}", cert.display()));
            all.push(format!("--key={}", key.display()));
        }
        all.extend(args.iter().map(|a| a.to_string()));
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

//! Network namespaces with a drop guard, commands and closures run inside
//! them.
//!
//! A network namespace is a property of a thread: [`NetNs::run`] starts a
//! thread, `setns`es it into the namespace and runs the closure there, so
//! sockets it opens (and netlink or TC calls it makes) belong to that
//! namespace, while the caller's thread stays where it was.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sched::{CloneFlags, setns};

use crate::cmd;
use crate::error::{Error, Result};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A named network namespace (`ip netns`), deleted on drop when owned.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    owned: bool,
}

impl NetNs {
    /// Creates a namespace with a unique name `cel-<pid>-<n>`, loopback up.
    pub fn new() -> Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self::create(&format!("cel-{}-{n}", std::process::id()))
    }

    /// Creates a namespace with the given name, owned (deleted on drop).
    pub fn create(name: &str) -> Result<Self> {
        cmd::run("ip", &["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
            owned: true,
        };
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Refers to an existing namespace without deleting it on drop.
    pub fn existing(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            owned: false,
        }
    }

    /// Keeps the namespace after this guard is dropped.
    pub fn keep(mut self) -> Self {
        self.owned = false;
        self
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its bind mount, `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace and returns its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        cmd::run("ip", &full)
    }

    /// Runs `ip -n <ns> args...`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        cmd::run("ip", &full)
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")])
            .map(|_| ())
    }

    /// Runs `f` on a new thread that has entered this namespace, and waits.
    pub fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let name = self.name.clone();
        let file = File::open(self.path()).map_err(|source| Error::Setns {
            name: name.clone(),
            source,
        })?;
        let thread = std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || -> Result<T> {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| Error::Setns {
                    name: name.clone(),
                    source: e.into(),
                })?;
                Ok(f())
            })
            .map_err(|source| Error::Setns {
                name: self.name.clone(),
                source,
            })?;
        thread.join().map_err(|_| Error::ThreadPanicked {
            name: self.name.clone(),
        })?
    }

    /// A counter from the namespace's `/proc/net/snmp` or `/proc/net/netstat`, e.g. ("Tcp",
    /// "RetransSegs") or ("TcpExt", "TCPLossProbes").
    pub fn snmp(&self, proto: &str, field: &str) -> Result<u64> {
        let text = self.exec("cat", &["/proc/net/snmp", "/proc/net/netstat"])?;
        let prefix = format!("{proto}:");
        let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
        let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
            return Err(Error::Unexpected {
                what: "/proc/net/snmp",
                detail: format!("no {proto} lines"),
            });
        };
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == field)
            .and_then(|(_, v)| v.parse().ok())
            .ok_or_else(|| Error::Unexpected {
                what: "/proc/net/snmp",
                detail: format!("no {proto} {field}"),
            })
    }

    /// TCP segments sent again because one was lost: `RetransSegs` without the tail loss
    /// probes (`TCPLossProbes`), which TCP also sends when an ACK is merely late, as on a busy
    /// machine, and which say nothing of a lost packet.
    pub fn tcp_loss_retransmissions(&self) -> Result<u64> {
        let sent_again = self.snmp("Tcp", "RetransSegs")?;
        let probes = self.snmp("TcpExt", "TCPLossProbes")?;
        Ok(sent_again.saturating_sub(probes))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Err(e) = cmd::run("ip", &["netns", "del", &self.name]) {
            tracing::warn!(netns = %self.name, error = %e, "cannot delete network namespace");
        }
    }
}

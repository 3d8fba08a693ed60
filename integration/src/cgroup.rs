//! A cgroup v2 of the test's own, for the socket-level load balancer: the machine's cgroup v2
//! hierarchy mounted at a temporary directory (wherever, or whether, the host mounts it), a
//! new cgroup in it for the agent's `cgroup-root`, and a way for the test process to create
//! sockets inside it ([`TestCgroup::enter`]). A socket belongs to the cgroup of the process
//! that created it, for good: sockets made while entered stay in the test's cgroup after the
//! process has gone back to its own.
//!
//! ```no_run
//! # fn main() -> cellium_integration::Result<()> {
//! use cellium_integration::TestCgroup;
//!
//! let cgroup = TestCgroup::new()?;
//! // cgroup-root: cgroup.path()
//! let inside = cgroup.enter()?;
//! let socket = std::net::UdpSocket::bind("127.0.0.1:0");
//! drop(inside); // back in its own cgroup; the socket stays in the test's
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The test's cgroup; removed, with the mount, on drop.
#[derive(Debug)]
pub struct TestCgroup {
    mount: tempfile::TempDir,
    path: PathBuf,
    home: PathBuf,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |source| Error::Io { op, path, source }
}

impl TestCgroup {
    /// Mounts the cgroup v2 hierarchy and makes a cgroup in it.
    pub fn new() -> Result<TestCgroup> {
        let mount = tempfile::Builder::new()
            .prefix("cel-cgroup2-")
            .tempdir()
            .map_err(io("create", Path::new("a temporary directory")))?;
        nix::mount::mount(
            Some("none"),
            mount.path(),
            Some("cgroup2"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| Error::Mount {
            op: "mount cgroup2 on",
            path: mount.path().display().to_string(),
            source: e.into(),
        })?;
        let home = mount.path().join(own_cgroup()?.trim_start_matches('/'));
        let path = mount
            .path()
            .join(format!("cellium-test-{}-{}", std::process::id(), next()));
        std::fs::create_dir(&path).map_err(io("create the cgroup", &path))?;
        Ok(TestCgroup { mount, path, home })
    }

    /// The cgroup's directory: the agent's `cgroup-root`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves this process into the cgroup until the guard is dropped.
    pub fn enter(&self) -> Result<Entered<'_>> {
        move_self(&self.path)?;
        Ok(Entered { cgroup: self })
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
        let _ = nix::mount::umount2(self.mount.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The process is inside a [`TestCgroup`]; dropped, it goes back to its own cgroup.
#[derive(Debug)]
pub struct Entered<'a> {
    cgroup: &'a TestCgroup,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Err(e) = move_self(&self.cgroup.home) {
            eprintln!("cannot move the test process back to its cgroup: {e}");
        }
    }
}

fn move_self(cgroup: &Path) -> Result<()> {
    let procs = cgroup.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string()).map_err(io("write", &procs))
}

/// This process's cgroup v2 path (`0::<path>` in /proc/self/cgroup).
fn own_cgroup() -> Result<String> {
    let file = Path::new("/proc/self/cgroup");
    let text = std::fs::read_to_string(file).map_err(io("read", file))?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
        .ok_or_else(|| Error::Unexpected {
            what: "/proc/self/cgroup",
            detail: "no cgroup v2 entry (0::)".into(),
        })
}

fn next() -> u32 {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

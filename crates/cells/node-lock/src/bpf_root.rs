//! The BPF root: a flock on the directory, on a bpffs that is mounted first if needed.
//!
//! The lock must sit on the directory the agent will pin into, which is the root of a
//! bpffs the agent may have to mount itself. A lock taken before the mount would sit on
//! the directory the mount hides, where a rival opening the path afterwards never sees
//! it; so the mount comes first, and mounts are serialized: whoever mounts holds a flock on
//! the not-yet-mounted directory and checks again under it, so two agents starting together
//! never stack two bpffs on one path (the first one's pins would vanish under the second).
//! Then the lock is taken on the mounted directory and the path checked to still lead to
//! it. A crashed agent's lock goes with its process; the mount stays, as its pins must.

use std::fs::{self, File};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{BPF_FS_MAGIC, fstatfs, statfs};

use super::error::{Error, Result, io};
use super::holder::flock_holder;

/// How long to wait for another process mounting bpffs on the same directory.
const MOUNT_WAIT: Duration = Duration::from_secs(10);

/// Makes `root` a directory on a bpffs and locks it.
pub(crate) fn claim(root: &Path) -> Result<Flock<File>> {
    // A path can be remounted between the lock and the check; a few rounds settle it.
    for _ in 0..3 {
        ensure_bpffs(root)?;
        let dir = File::open(root).map_err(io("open", root))?;
        if !on_bpffs(&dir) {
            continue;
        }
        let locked = match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((dir, _)) => {
                return Err(Error::BpfRootTaken {
                    path: root.to_path_buf(),
                    holder: flock_holder(&dir),
                });
            }
        };
        if same_inode(&locked, root) {
            return Ok(locked);
        }
    }
    Err(Error::Io {
        op: "lock",
        path: root.to_path_buf(),
        source: std::io::Error::other("the directory kept being remounted"),
    })
}

/// Makes `root` a directory on a bpffs, mounting one (on `root`, or on its parent when
/// `root` cannot be created there, as under an unmounted `/sys/fs/bpf`).
fn ensure_bpffs(root: &Path) -> Result<()> {
    if !root.exists()
        && let Err(first) = fs::create_dir_all(root)
    {
        let parent = root.parent().filter(|p| p.is_dir());
        let Some(parent) = parent.filter(|p| !is_bpffs(p)) else {
            return Err(io("create", root)(first));
        };
        mount_once(parent)?;
        fs::create_dir_all(root).map_err(io("create", root))?;
    }
    if is_bpffs(root) {
        return Ok(());
    }
    mount_once(root)
}

/// Mounts bpffs on `dir` unless one is there, serialized with anyone doing the same.
fn mount_once(dir: &Path) -> Result<()> {
    let began = Instant::now();
    loop {
        let file = File::open(dir).map_err(io("open", dir))?;
        // Opened after someone's mount: the mount's root, nothing to do.
        if on_bpffs(&file) {
            return Ok(());
        }
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(_guard) => {
                // Whoever held the lock before may have mounted meanwhile.
                if is_bpffs(dir) {
                    return Ok(());
                }
                mount(
                    Some("bpf"),
                    dir,
                    Some("bpf"),
                    MsFlags::empty(),
                    None::<&str>,
                )
                .map_err(|source| Error::Mount {
                    path: dir.to_path_buf(),
                    source,
                })?;
                tracing::info!(path = %dir.display(), "mounted bpffs");
                return Ok(());
            }
            Err(_) if began.elapsed() < MOUNT_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => {
                return Err(Error::MountBusy {
                    path: dir.to_path_buf(),
                });
            }
        }
    }
}

fn is_bpffs(path: &Path) -> bool {
    statfs(path).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC)
}

fn on_bpffs(file: &impl AsFd) -> bool {
    fstatfs(file).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC)
}

fn same_inode(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

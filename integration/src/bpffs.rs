//! A private bpffs mount in a temporary directory, unmounted on drop, so
//! each test has its own pins.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::{Error, Result};

/// A bpffs mounted at a fresh temporary directory.
#[derive(Debug)]
pub struct BpffsMount {
    path: PathBuf,
}

impl BpffsMount {
    /// Mounts bpffs at `/tmp/cel-bpf-<pid>-<n>`.
    pub fn new() -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("cel-bpf-{}-{n}", std::process::id()));
        let err = |op, source| Error::Mount {
            op,
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&path).map_err(|e| err("create", e))?;
        mount(
            Some("bpf"),
            &path,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| err("mount", e.into()))?;
        Ok(Self { path })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpffsMount {
    fn drop(&mut self) {
        // Lazy: pins in use by a still-running program do not block it.
        if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot unmount bpffs");
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

//! A directory made read-only for real, by a read-only bind mount of it onto itself, and made
//! writable again on drop: root ignores permission bits, not a read-only mount.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::{Error, Result};

/// A read-only bind mount of a directory over itself; unmounted on drop.
#[derive(Debug)]
pub struct ReadOnlyDir {
    path: PathBuf,
}

impl ReadOnlyDir {
    /// Makes `path` (an existing directory of the test's own) read-only: every write,
    /// create, rename and removal in it fails with EROFS until the guard is dropped.
    pub fn new(path: &Path) -> Result<ReadOnlyDir> {
        let err = |op, source: nix::Error| Error::Mount {
            op,
            path: path.display().to_string(),
            source: source.into(),
        };
        mount(
            Some(path),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| err("bind-mount", e))?;
        let guard = ReadOnlyDir {
            path: path.to_path_buf(),
        };
        // A bind mount takes the read-only flag only on a remount.
        mount(
            None::<&str>,
            path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| err("remount read-only", e))?;
        Ok(guard)
    }
}

impl Drop for ReadOnlyDir {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot unmount a read-only bind");
        }
    }
}

//! Making sure the BPF root is a bpffs mount.
//!
//! `ip netns exec` remounts `/sys` privately and hides `/sys/fs/bpf`, and a
//! fresh node may not mount bpffs at all, so the datapath mounts it itself.

use std::fs;
use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};

use crate::error::{Error, Result};

/// Whether `path` is the root or a directory of a bpffs mount.
pub fn is_bpffs(path: &Path) -> Result<bool> {
    let st = statfs(path).map_err(|source| Error::Statfs {
        path: path.to_owned(),
        source,
    })?;
    Ok(st.filesystem_type() == BPF_FS_MAGIC)
}

fn mount_bpffs(path: &Path) -> Result<()> {
    mount(
        Some("bpf"),
        path,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| Error::Mount {
        path: path.to_owned(),
        source,
    })?;
    tracing::info!(path = %path.display(), "mounted bpffs");
    Ok(())
}

/// Makes `root` a directory on a bpffs. Returns whether a mount was made.
///
/// - `root` on a bpffs already: nothing to do.
/// - `root` elsewhere: bpffs is mounted on it (e.g. `/run/cellium/bpf`).
/// - `root` missing under an unmounted `/sys/fs/bpf`: sysfs refuses the
///   directory, so bpffs is mounted on the parent first, then `root` is
///   created inside it (`/sys/fs/bpf/cellium` on a fresh node).
pub fn ensure_bpffs(root: &Path) -> Result<bool> {
    if !root.exists()
        && let Err(first) = fs::create_dir_all(root)
    {
        let parent = root.parent().filter(|p| p.is_dir());
        let Some(parent) = parent.filter(|p| !is_bpffs(p).unwrap_or(true)) else {
            return Err(Error::CreateDir {
                path: root.to_owned(),
                source: first,
            });
        };
        mount_bpffs(parent)?;
        fs::create_dir_all(root).map_err(|source| Error::CreateDir {
            path: root.to_owned(),
            source,
        })?;
        return Ok(true);
    }
    if is_bpffs(root)? {
        return Ok(false);
    }
    mount_bpffs(root)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_is_not_bpffs() {
        let dir = std::env::temp_dir();
        assert!(!is_bpffs(&dir).unwrap());
    }

    #[test]
    fn statfs_of_a_missing_path_names_it() {
        let err = is_bpffs(Path::new("/nonexistent/cellium-bpf")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/cellium-bpf"),
            "{err}"
        );
    }
}

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

/// Creates `root` and mounts bpffs on it unless it already is one.
/// Returns whether a mount was made.
pub fn ensure_bpffs(root: &Path) -> Result<bool> {
    fs::create_dir_all(root).map_err(|source| Error::CreateDir {
        path: root.to_owned(),
        source,
    })?;
    if is_bpffs(root)? {
        return Ok(false);
    }
    mount(
        Some("bpf"),
        root,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| Error::Mount {
        path: root.to_owned(),
        source,
    })?;
    tracing::info!(path = %root.display(), "mounted bpffs");
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

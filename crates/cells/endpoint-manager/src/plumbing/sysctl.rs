//! Writing sysctls of the agent's own network namespace.

use std::path::PathBuf;

use crate::plumbing::error::{Error, Result};

/// Writes `value` to `/proc/sys/<key with dots as slashes>`; the value is read back first
/// and left alone when it is already right, so the agent does not fight a read-only /proc
/// for nothing.
pub fn set(key: &str, value: &str) -> Result<()> {
    let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
    if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|source| Error::Sysctl { path, source })
}

/// Sets a per-interface IPv4 sysctl, e.g. `rp_filter` of `lxc1`.
pub fn set_if(ifname: &str, key: &str, value: &str) -> Result<()> {
    // Interface names may contain dots, so this path is built without the dot translation.
    let path = PathBuf::from("/proc/sys/net/ipv4/conf")
        .join(ifname)
        .join(key);
    write(path, value)
}

/// Sets a per-interface IPv6 sysctl, e.g. `accept_dad` of `lxc1`; an interface without IPv6
/// (disabled in the namespace) has nothing to set.
pub fn set_if6(ifname: &str, key: &str, value: &str) -> Result<()> {
    let dir = PathBuf::from("/proc/sys/net/ipv6/conf").join(ifname);
    if !dir.is_dir() {
        return Ok(());
    }
    write(dir.join(key), value)
}

fn write(path: PathBuf, value: &str) -> Result<()> {
    if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|source| Error::Sysctl { path, source })
}

//! Socket-level load balancing (`bpf-lb-sock`): the node's own processes get services
//! translated where their sockets name a peer (`connect()`, `sendmsg()`), by the datapath's
//! cgroup programs on `cgroup-root` (`docs/services.md`).

use std::path::Path;

use cellium_datapath_bpf::Datapath;
use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};

use crate::config::SvcLbConfig;
use crate::error::{Error, Result};

/// Turns socket-level load balancing on or off as `cfg` says: on, the programs are attached
/// to `cgroup-root` (a cgroup v2 hierarchy is mounted there first when the path is none) or
/// moved to this agent's programs; off, links a previous run left are removed.
pub(crate) fn apply(dp: &Datapath, cfg: &SvcLbConfig) -> Result<()> {
    if !cfg.bpf_lb_sock {
        let removed = dp.detach_sock_lb().map_err(sock_err(&cfg.cgroup_root))?;
        if removed > 0 {
            tracing::info!(
                links = removed,
                "bpf-lb-sock off: socket-level load balancing removed"
            );
        }
        return Ok(());
    }
    ensure_cgroup2(&cfg.cgroup_root)?;
    let done = dp
        .attach_sock_lb(&cfg.cgroup_root)
        .map_err(sock_err(&cfg.cgroup_root))?;
    tracing::info!(
        cgroup = %cfg.cgroup_root.display(),
        hooks = done.len(),
        "bpf-lb-sock: the node's sockets are load-balanced at connect() and sendmsg()"
    );
    Ok(())
}

/// Makes `path` a cgroup v2 directory: as it is when it is one (the hierarchy's root or a
/// cgroup in it), else a new hierarchy mounted there, as Cilium does on its own `cgroup-root`.
fn ensure_cgroup2(path: &Path) -> Result<()> {
    let fail = |why: String| Error::CgroupRoot {
        path: path.to_owned(),
        why,
    };
    std::fs::create_dir_all(path).map_err(|e| fail(format!("cannot create it: {e}")))?;
    let fs = statfs(path).map_err(|e| fail(format!("cannot inspect it: {e}")))?;
    if fs.filesystem_type() == CGROUP2_SUPER_MAGIC {
        return Ok(());
    }
    nix::mount::mount(
        Some("none"),
        path,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| {
        fail(format!(
            "not a cgroup v2 directory, and mounting one there failed: {e}"
        ))
    })?;
    tracing::info!(path = %path.display(), "mounted a cgroup v2 hierarchy for bpf-lb-sock");
    Ok(())
}

fn sock_err(cgroup: &Path) -> impl FnOnce(cellium_datapath_bpf::Error) -> Error {
    let cgroup = cgroup.to_owned();
    move |source| Error::SockLb { cgroup, source }
}

//! Socket-level load balancing: the `cel_sock*` programs (`bpf/lib/sock.h`) attached to a
//! cgroup v2 with one BPF link per hook, each pinned at `<bpf_root>/links/cgroup-<hook>` so
//! that it outlives the agent. A new agent points the pinned links at its programs
//! (`bpf_link_update`, atomic, as for tcx); a link found on another cgroup (the configured
//! `cgroup-root` changed) is detached and replaced.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use libbpf_rs::Program;
use libbpf_rs::query::{LinkInfo, LinkTypeInfo};

use crate::attach::AttachAction;
use crate::error::{Error, Result};
use crate::sys;

/// One hook of the socket-level load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SockHook {
    /// `connect()` of an IPv4 socket: the frontend becomes a backend.
    Connect4,
    /// `sendmsg()` of an unconnected IPv4 UDP socket: likewise, per message.
    Sendmsg4,
    /// `recvmsg()` of an IPv4 UDP socket: the backend's address becomes the frontend.
    Recvmsg4,
    /// `getpeername()` of an IPv4 socket: likewise.
    Getpeername4,
    /// [`SockHook::Connect4`] for IPv6.
    Connect6,
    /// [`SockHook::Sendmsg4`] for IPv6.
    Sendmsg6,
    /// [`SockHook::Recvmsg4`] for IPv6.
    Recvmsg6,
    /// [`SockHook::Getpeername4`] for IPv6.
    Getpeername6,
}

impl SockHook {
    /// Every hook.
    pub const ALL: [SockHook; 8] = [
        SockHook::Connect4,
        SockHook::Sendmsg4,
        SockHook::Recvmsg4,
        SockHook::Getpeername4,
        SockHook::Connect6,
        SockHook::Sendmsg6,
        SockHook::Recvmsg6,
        SockHook::Getpeername6,
    ];

    /// The program attached at this hook.
    pub fn program(self) -> &'static str {
        match self {
            SockHook::Connect4 => "cel_sock4_connect",
            SockHook::Sendmsg4 => "cel_sock4_sendmsg",
            SockHook::Recvmsg4 => "cel_sock4_recvmsg",
            SockHook::Getpeername4 => "cel_sock4_getpeername",
            SockHook::Connect6 => "cel_sock6_connect",
            SockHook::Sendmsg6 => "cel_sock6_sendmsg",
            SockHook::Recvmsg6 => "cel_sock6_recvmsg",
            SockHook::Getpeername6 => "cel_sock6_getpeername",
        }
    }

    fn attach_type(self) -> libbpf_sys::bpf_attach_type {
        match self {
            SockHook::Connect4 => libbpf_sys::BPF_CGROUP_INET4_CONNECT,
            SockHook::Sendmsg4 => libbpf_sys::BPF_CGROUP_UDP4_SENDMSG,
            SockHook::Recvmsg4 => libbpf_sys::BPF_CGROUP_UDP4_RECVMSG,
            SockHook::Getpeername4 => libbpf_sys::BPF_CGROUP_INET4_GETPEERNAME,
            SockHook::Connect6 => libbpf_sys::BPF_CGROUP_INET6_CONNECT,
            SockHook::Sendmsg6 => libbpf_sys::BPF_CGROUP_UDP6_SENDMSG,
            SockHook::Recvmsg6 => libbpf_sys::BPF_CGROUP_UDP6_RECVMSG,
            SockHook::Getpeername6 => libbpf_sys::BPF_CGROUP_INET6_GETPEERNAME,
        }
    }

    fn pin_name(self) -> String {
        format!("cgroup-{}", self.program().trim_start_matches("cel_"))
    }
}

/// Attaches every hook's program (`progs` in [`SockHook::ALL`]'s order) to the cgroup v2
/// directory `cgroup`, or moves the pinned links to these programs.
pub(crate) fn attach(
    links_dir: &Path,
    progs: &[BorrowedFd<'_>; 8],
    cgroup: &Path,
) -> Result<Vec<(SockHook, AttachAction)>> {
    let invalid = |why: &str| Error::invalid(format!("cgroup {}", cgroup.display()), why);
    let dir = fs::File::open(cgroup).map_err(|e| invalid(&e.to_string()))?;
    let id = dir.metadata().map_err(|e| invalid(&e.to_string()))?.ino();
    let mut done = Vec::with_capacity(progs.len());
    for (hook, prog) in SockHook::ALL.into_iter().zip(progs) {
        let path = links_dir.join(hook.pin_name());
        if path.exists() {
            let link = sys::obj_get(&path).map_err(link_err("open", &path))?;
            let info = LinkInfo::from_fd(link.as_fd()).ok();
            if cgroup_of(info.as_ref()) == Some(id) {
                let action = if info.map(|i| i.prog_id) == Program::id_from_fd(*prog).ok() {
                    AttachAction::Unchanged
                } else {
                    sys::link_update(link.as_fd(), *prog).map_err(link_err("update", &path))?;
                    AttachAction::Replaced
                };
                done.push((hook, action));
                continue;
            }
            tracing::info!(path = %path.display(), "replacing a link to another cgroup");
            detach_one(&path)?;
        }
        let link =
            sys::cgroup_link_create(*prog, dir.as_fd(), hook.attach_type()).map_err(|source| {
                Error::AttachCgroup {
                    program: hook.program(),
                    cgroup: cgroup.to_owned(),
                    source,
                }
            })?;
        if let Err(source) = sys::obj_pin(link.as_fd(), &path) {
            // Unpinned, the link would vanish with this process: undo.
            let _ = sys::link_detach(link.as_fd());
            return Err(link_err("pin", &path)(source));
        }
        done.push((hook, AttachAction::Created));
    }
    Ok(done)
}

/// Detaches and unpins every hook's link; returns how many there were.
pub(crate) fn detach(links_dir: &Path) -> Result<usize> {
    let mut detached = 0;
    for hook in SockHook::ALL {
        let path = links_dir.join(hook.pin_name());
        if path.exists() {
            detach_one(&path)?;
            detached += 1;
        }
    }
    Ok(detached)
}

/// The cgroup id each hook's pinned link is attached to, for the hooks that have one.
pub(crate) fn attached(links_dir: &Path) -> Result<Vec<(SockHook, u64)>> {
    let mut out = Vec::new();
    for hook in SockHook::ALL {
        let path = links_dir.join(hook.pin_name());
        if path.exists() {
            let link = sys::obj_get(&path).map_err(link_err("open", &path))?;
            if let Some(id) = cgroup_of(LinkInfo::from_fd(link.as_fd()).ok().as_ref()) {
                out.push((hook, id));
            }
        }
    }
    Ok(out)
}

fn detach_one(path: &Path) -> Result<()> {
    let link = sys::obj_get(path).map_err(link_err("open", path))?;
    match sys::link_detach(link.as_fd()) {
        // ENOLINK: already defunct (its cgroup was removed).
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOLINK as i32) => {}
        Err(source) => return Err(link_err("detach", path)(source)),
    }
    fs::remove_file(path).map_err(|source| Error::Unpin {
        path: path.to_owned(),
        source,
    })
}

fn link_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path: PathBuf = path.to_owned();
    move |source| Error::Link { op, path, source }
}

/// The cgroup a pinned link is attached to (None when defunct or not a cgroup link).
fn cgroup_of(link: Option<&LinkInfo>) -> Option<u64> {
    match &link?.info {
        LinkTypeInfo::Cgroup(c) if c.cgroup_id != 0 => Some(c.cgroup_id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_has_its_own_pin() {
        let names: std::collections::BTreeSet<_> =
            SockHook::ALL.iter().map(|h| h.pin_name()).collect();
        assert_eq!(names.len(), SockHook::ALL.len());
        assert!(names.contains("cgroup-sock4_connect"));
    }
}

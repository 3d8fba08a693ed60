//! Attaching the two programs to a pod's host-side veth (and, in tunnel mode,
//! `cel_from_overlay` to the node's VXLAN device), replacing them in place on
//! upgrade, and detaching them.
//!
//! tcx (kernel >= 6.6) is preferred: each attachment is a BPF link pinned at
//! `<bpf_root>/links/<ifindex>-<hook>`, so it outlives the agent, and a new
//! agent updates the pinned link to its program with `bpf_link_update`,
//! which swaps the program atomically. Without tcx, a clsact filter with a
//! fixed handle and priority is attached with replace semantics, which is
//! also atomic but leaves no pin to list.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libbpf_rs::query::{LinkInfo, LinkTypeInfo};
use libbpf_rs::{TC_EGRESS, TC_INGRESS, TcHookBuilder};

use crate::error::{Error, Result};
use crate::sys::{self, TcxHook};

/// How programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// tcx, falling back to clsact where the kernel has no tcx.
    #[default]
    Auto,
    /// tcx only.
    Tcx,
    /// clsact only.
    Clsact,
}

/// Where a program is attached: one of the two hooks of a pod's veth, the VXLAN device's, or
/// the ingress of a device holding the node's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// TC ingress of the host veth: `cel_from_container`.
    FromContainer,
    /// TC egress of the host veth: `cel_to_container`.
    ToContainer,
    /// TC ingress of the node's VXLAN device (tunnel mode): `cel_from_overlay`.
    FromOverlay,
    /// TC egress of the node's VXLAN device (tunnel mode): `cel_to_overlay`.
    ToOverlay,
    /// TC ingress of a device holding one of the node's addresses: `cel_from_netdev`.
    FromNetdev,
}

impl Hook {
    /// The hooks of a pod's veth.
    pub const ENDPOINT: [Hook; 2] = [Hook::FromContainer, Hook::ToContainer];
    /// The hooks of the VXLAN device.
    pub const OVERLAY: [Hook; 2] = [Hook::FromOverlay, Hook::ToOverlay];
    /// The hook of a node's device.
    pub const NETDEV: [Hook; 1] = [Hook::FromNetdev];
    /// Every hook.
    pub const ALL: [Hook; 5] = [
        Hook::FromContainer,
        Hook::ToContainer,
        Hook::FromOverlay,
        Hook::ToOverlay,
        Hook::FromNetdev,
    ];

    /// The program attached at this hook.
    pub fn program(self) -> &'static str {
        match self {
            Hook::FromContainer => "cel_from_container",
            Hook::ToContainer => "cel_to_container",
            Hook::FromOverlay => "cel_from_overlay",
            Hook::ToOverlay => "cel_to_overlay",
            Hook::FromNetdev => "cel_from_netdev",
        }
    }

    fn pin_suffix(self) -> &'static str {
        match self {
            Hook::FromContainer => "ingress",
            Hook::ToContainer => "egress",
            Hook::FromOverlay => "overlay",
            Hook::ToOverlay => "overlay_egress",
            Hook::FromNetdev => "netdev",
        }
    }

    fn tcx(self) -> TcxHook {
        match self {
            Hook::FromContainer | Hook::FromOverlay | Hook::FromNetdev => TcxHook::Ingress,
            Hook::ToContainer | Hook::ToOverlay => TcxHook::Egress,
        }
    }
}

/// The mechanism of an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachKind {
    /// A pinned tcx link.
    Tcx,
    /// A clsact filter.
    Clsact,
}

impl fmt::Display for AttachKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachKind::Tcx => "tcx",
            AttachKind::Clsact => "clsact",
        })
    }
}

/// What `attach` did on one hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachAction {
    /// A new attachment.
    Created,
    /// An existing attachment now runs the new program.
    Replaced,
    /// The attachment ran this very program already (an agent restarted with the programs
    /// it pinned): left as it was.
    Unchanged,
}

/// One attached hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The interface.
    pub ifindex: u32,
    /// The hook.
    pub hook: Hook,
    /// tcx or clsact.
    pub kind: AttachKind,
    /// The program's kernel id, where known (tcx).
    pub program_id: Option<u32>,
    /// The link's pin (tcx).
    pub pin: Option<PathBuf>,
}

/// clsact filter identity: fixed so a new agent replaces its predecessor's.
const CLSACT_HANDLE: u32 = 0xce11;
const CLSACT_PRIORITY: u32 = 1;

/// Attaches programs and remembers clsact attachments (tcx ones are pins).
#[derive(Debug)]
pub(crate) struct Attacher {
    links_dir: PathBuf,
    mode: AttachMode,
    clsact: Mutex<BTreeSet<(u32, Hook)>>,
}

/// The loaded programs.
pub(crate) struct Programs<'a> {
    pub(crate) from_container: BorrowedFd<'a>,
    pub(crate) to_container: BorrowedFd<'a>,
    pub(crate) from_overlay: BorrowedFd<'a>,
    pub(crate) to_overlay: BorrowedFd<'a>,
    pub(crate) from_netdev: BorrowedFd<'a>,
}

impl Programs<'_> {
    fn fd(&self, hook: Hook) -> BorrowedFd<'_> {
        match hook {
            Hook::FromContainer => self.from_container,
            Hook::ToContainer => self.to_container,
            Hook::FromOverlay => self.from_overlay,
            Hook::ToOverlay => self.to_overlay,
            Hook::FromNetdev => self.from_netdev,
        }
    }
}

impl Attacher {
    pub(crate) fn new(links_dir: PathBuf, mode: AttachMode) -> Self {
        Self {
            links_dir,
            mode,
            clsact: Mutex::new(BTreeSet::new()),
        }
    }

    fn pin_path(&self, ifindex: u32, hook: Hook) -> PathBuf {
        self.links_dir
            .join(format!("{ifindex}-{}", hook.pin_suffix()))
    }

    /// Attaches the programs of `hooks` to `ifindex`, or moves existing attachments to
    /// these programs.
    pub(crate) fn attach(
        &self,
        progs: &Programs<'_>,
        ifindex: u32,
        hooks: &[Hook],
    ) -> Result<Vec<(Hook, AttachKind, AttachAction)>> {
        let mut done = Vec::with_capacity(hooks.len());
        for &hook in hooks {
            let prog = progs.fd(hook);
            let result = match self.mode {
                AttachMode::Clsact => self
                    .attach_clsact(prog, ifindex, hook)
                    .map(|a| (AttachKind::Clsact, a)),
                AttachMode::Tcx => self
                    .attach_tcx(prog, ifindex, hook)
                    .map(|a| (AttachKind::Tcx, a)),
                AttachMode::Auto => match self.attach_tcx(prog, ifindex, hook) {
                    Ok(a) => Ok((AttachKind::Tcx, a)),
                    Err(Error::Attach { source, .. }) if tcx_unsupported(&source) => {
                        tracing::info!(ifindex, "tcx unavailable, attaching with clsact");
                        self.attach_clsact(prog, ifindex, hook)
                            .map(|a| (AttachKind::Clsact, a))
                    }
                    Err(e) => Err(e),
                },
            }?;
            tracing::debug!(ifindex, program = hook.program(), kind = %result.0, action = ?result.1, "attached");
            done.push((hook, result.0, result.1));
        }
        Ok(done)
    }

    fn attach_tcx(&self, prog: BorrowedFd<'_>, ifindex: u32, hook: Hook) -> Result<AttachAction> {
        let path = self.pin_path(ifindex, hook);
        if path.exists() {
            let link = sys::obj_get(&path).map_err(|source| Error::Link {
                op: "open",
                path: path.clone(),
                source,
            })?;
            let info = LinkInfo::from_fd(link.as_fd()).ok();
            if link_target(info.as_ref()) == Some(ifindex) {
                if info.map(|i| i.prog_id) == program_id(prog) {
                    return Ok(AttachAction::Unchanged);
                }
                sys::link_update(link.as_fd(), prog).map_err(|source| Error::Link {
                    op: "update",
                    path: path.clone(),
                    source,
                })?;
                return Ok(AttachAction::Replaced);
            }
            // The interface this pin was for is gone (the link is defunct)
            // or the index was reused: start over with a fresh link.
            tracing::info!(path = %path.display(), "replacing stale tcx link");
            fs::remove_file(&path).map_err(|source| Error::Unpin {
                path: path.clone(),
                source,
            })?;
        }
        let link =
            sys::tcx_link_create(prog, ifindex, hook.tcx()).map_err(|source| Error::Attach {
                program: hook.program(),
                ifindex,
                mode: "tcx",
                source,
            })?;
        if let Err(source) = sys::obj_pin(link.as_fd(), &path) {
            // Unpinned, the link would vanish with this process: undo.
            let _ = sys::link_detach(link.as_fd());
            return Err(Error::Link {
                op: "pin",
                path,
                source,
            });
        }
        Ok(AttachAction::Created)
    }

    fn attach_clsact(
        &self,
        prog: BorrowedFd<'_>,
        ifindex: u32,
        hook: Hook,
    ) -> Result<AttachAction> {
        let err = |op: &'static str| {
            move |source: libbpf_rs::Error| Error::Clsact {
                op,
                program: hook.program(),
                ifindex,
                source,
            }
        };
        let mut tc = clsact_hook(prog, ifindex, hook)?;
        // One netlink round trip when the filter runs this program already, three otherwise.
        let action = match tc.query() {
            Ok(id) if Some(id) == program_id(prog) => AttachAction::Unchanged,
            Ok(_) => AttachAction::Replaced,
            Err(_) => {
                tc.create().map_err(err("create the clsact qdisc for"))?;
                AttachAction::Created
            }
        };
        if action != AttachAction::Unchanged {
            tc.attach().map_err(err("attach"))?;
        }
        self.clsact
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((ifindex, hook));
        // A tcx link pinned by an agent that ran in tcx mode runs before any clsact filter:
        // left in place, both programs would see the pod's packets. The filter is in place
        // now, so removing the link leaves no moment without a program.
        self.detach_tcx(ifindex, hook)?;
        Ok(action)
    }

    /// Detaches the programs of `hooks` from `ifindex`; a hook with nothing attached
    /// is not an error (the interface may be gone already).
    pub(crate) fn detach(&self, progs: &Programs<'_>, ifindex: u32, hooks: &[Hook]) -> Result<()> {
        for &hook in hooks {
            self.detach_tcx(ifindex, hook)?;
            let was_clsact = self
                .clsact
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(ifindex, hook));
            if was_clsact || self.mode == AttachMode::Clsact {
                self.detach_clsact(progs.fd(hook), ifindex, hook)?;
            }
        }
        Ok(())
    }

    /// Detaches and unpins the tcx link of one hook, if there is one.
    fn detach_tcx(&self, ifindex: u32, hook: Hook) -> Result<()> {
        let path = self.pin_path(ifindex, hook);
        if !path.exists() {
            return Ok(());
        }
        let link = sys::obj_get(&path).map_err(|source| Error::Link {
            op: "open",
            path: path.clone(),
            source,
        })?;
        match sys::link_detach(link.as_fd()) {
            // ENOLINK: the link is already defunct (interface removed).
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOLINK as i32) => {}
            Err(source) => {
                return Err(Error::Link {
                    op: "detach",
                    path,
                    source,
                });
            }
        }
        fs::remove_file(&path).map_err(|source| Error::Unpin { path, source })
    }

    fn detach_clsact(&self, prog: BorrowedFd<'_>, ifindex: u32, hook: Hook) -> Result<()> {
        // With the interface gone, its filters are gone too.
        if nix::net::if_::if_indextoname(ifindex).is_err() {
            return Ok(());
        }
        let mut tc = clsact_hook(prog, ifindex, hook)?;
        if tc.query().is_err() {
            return Ok(());
        }
        tc.detach().map_err(|source| Error::Clsact {
            op: "detach",
            program: hook.program(),
            ifindex,
            source,
        })
    }

    /// Every attachment: pinned tcx links (of any agent run) and the clsact
    /// filters this process attached.
    pub(crate) fn list(&self) -> Result<Vec<Attachment>> {
        let mut out = Vec::new();
        let dir = fs::read_dir(&self.links_dir).map_err(|source| Error::ListLinks {
            path: self.links_dir.clone(),
            source,
        })?;
        for entry in dir {
            let entry = entry.map_err(|source| Error::ListLinks {
                path: self.links_dir.clone(),
                source,
            })?;
            let Some((ifindex, hook)) = parse_pin_name(&entry.file_name().to_string_lossy()) else {
                continue;
            };
            let path = entry.path();
            let link = sys::obj_get(&path).map_err(|source| Error::Link {
                op: "open",
                path: path.clone(),
                source,
            })?;
            let info = LinkInfo::from_fd(link.as_fd()).ok();
            // A defunct link (interface gone) attaches nothing.
            if info.as_ref().and_then(tcx_ifindex) != Some(ifindex) {
                continue;
            }
            out.push(Attachment {
                ifindex,
                hook,
                kind: AttachKind::Tcx,
                program_id: info.map(|i| i.prog_id),
                pin: Some(path),
            });
        }
        for (ifindex, hook) in self.clsact.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            out.push(Attachment {
                ifindex: *ifindex,
                hook: *hook,
                kind: AttachKind::Clsact,
                program_id: None,
                pin: None,
            });
        }
        out.sort_by_key(|a| (a.ifindex, a.hook));
        Ok(out)
    }
}

fn parse_pin_name(name: &str) -> Option<(u32, Hook)> {
    let (index, suffix) = name.split_once('-')?;
    let hook = Hook::ALL.into_iter().find(|h| h.pin_suffix() == suffix)?;
    Some((index.parse().ok()?, hook))
}

fn tcx_ifindex(info: &LinkInfo) -> Option<u32> {
    match &info.info {
        LinkTypeInfo::Tcx(t) => Some(t.ifindex),
        _ => None,
    }
}

/// The interface a pinned tcx link is attached to (0 or None when defunct).
fn link_target(link: Option<&LinkInfo>) -> Option<u32> {
    link.and_then(tcx_ifindex).filter(|i| *i != 0)
}

/// Kernels without tcx reject the attach type.
fn tcx_unsupported(e: &io::Error) -> bool {
    [
        nix::errno::Errno::EINVAL,
        nix::errno::Errno::EOPNOTSUPP,
        nix::errno::Errno::ENOTSUP,
    ]
    .iter()
    .any(|n| e.raw_os_error() == Some(*n as i32))
}

/// The clsact filter of one hook, with our fixed handle and priority.
fn clsact_hook(prog: BorrowedFd<'_>, ifindex: u32, hook: Hook) -> Result<libbpf_rs::TcHook> {
    let index = i32::try_from(ifindex)
        .map_err(|_| Error::invalid(format!("ifindex {ifindex}"), "out of range"))?;
    let point = match hook {
        Hook::FromContainer | Hook::FromOverlay | Hook::FromNetdev => TC_INGRESS,
        Hook::ToContainer | Hook::ToOverlay => TC_EGRESS,
    };
    Ok(TcHookBuilder::new(prog)
        .ifindex(index)
        .replace(true)
        .handle(CLSACT_HANDLE)
        .priority(CLSACT_PRIORITY)
        .hook(point))
}

/// The kernel id of a loaded program, if the kernel tells it.
fn program_id(prog: BorrowedFd<'_>) -> Option<u32> {
    libbpf_rs::Program::id_from_fd(prog).ok()
}

/// `links` directory under the BPF root.
pub(crate) fn links_dir(root: &Path) -> PathBuf {
    root.join("links")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_names_round_trip() {
        assert_eq!(
            parse_pin_name("12-ingress"),
            Some((12, Hook::FromContainer))
        );
        assert_eq!(parse_pin_name("7-egress"), Some((7, Hook::ToContainer)));
        assert_eq!(parse_pin_name("7-sideways"), None);
        assert_eq!(parse_pin_name("x-egress"), None);
    }
}

//! The few libbpf calls libbpf-rs 0.27 has no safe wrapper for: creating,
//! pinning, opening, updating and detaching tcx and cgroup links by file
//! descriptor; the maps a loaded program uses; libbpf's version; and the cookie of the caller's network
//! namespace.
//! Every function returns an owned fd or an `io::Error` with the errno.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// libbpf returns `-errno` (libbpf 1.x mode) or a non-negative fd.
fn fd_or_errno(ret: i32) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::from_raw_os_error(-ret));
    }
    // SAFETY: a non-negative return of these calls is a new descriptor
    // that the kernel handed to this process and nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret) })
}

fn ok_or_errno(ret: i32) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::from_raw_os_error(-ret))
    } else {
        Ok(())
    }
}

/// Which tcx hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TcxHook {
    Ingress,
    Egress,
}

/// Attaches `prog` to `ifindex` with a new tcx link.
pub(crate) fn tcx_link_create(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    hook: TcxHook,
) -> io::Result<OwnedFd> {
    let attach_type = match hook {
        TcxHook::Ingress => libbpf_sys::BPF_TCX_INGRESS,
        TcxHook::Egress => libbpf_sys::BPF_TCX_EGRESS,
    };
    let target = i32::try_from(ifindex).map_err(|_| io::Error::from_raw_os_error(libc_einval()))?;
    // SAFETY: plain integer arguments; libbpf accepts NULL opts (no
    // relative ordering among tcx programs).
    let ret = unsafe {
        libbpf_sys::bpf_link_create(prog.as_raw_fd(), target, attach_type, std::ptr::null())
    };
    fd_or_errno(ret)
}

/// Attaches `prog` to the cgroup open at `cgroup` with a new link of `attach_type`
/// (`BPF_CGROUP_*`).
pub(crate) fn cgroup_link_create(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: libbpf_sys::bpf_attach_type,
) -> io::Result<OwnedFd> {
    // SAFETY: two valid descriptors; NULL opts (no ordering among the cgroup's programs).
    let ret = unsafe {
        libbpf_sys::bpf_link_create(
            prog.as_raw_fd(),
            cgroup.as_raw_fd(),
            attach_type,
            std::ptr::null(),
        )
    };
    fd_or_errno(ret)
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14): what
/// `bpf_get_netns_cookie` returns for its sockets.
pub(crate) fn netns_cookie() -> io::Result<u64> {
    use nix::libc;
    // asm-generic/socket.h (x86 and arm alike); libc 0.2 does not export it.
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and a buffer of the option's size that outlives the call.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Points an existing link at `prog` atomically (no window without a program).
pub(crate) fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: two valid descriptors and NULL opts (no expected old program).
    ok_or_errno(unsafe {
        libbpf_sys::bpf_link_update(link.as_raw_fd(), prog.as_raw_fd(), std::ptr::null())
    })
}

/// Detaches a link from its hook (the link object lives on, defunct).
pub(crate) fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    ok_or_errno(unsafe { libbpf_sys::bpf_link_detach(link.as_raw_fd()) })
}

/// Pins any BPF object fd at `path` on a bpffs.
pub(crate) fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = cstring(path)?;
    // SAFETY: a valid descriptor and a NUL-terminated path that outlives the call.
    ok_or_errno(unsafe { libbpf_sys::bpf_obj_pin(fd.as_raw_fd(), c.as_ptr()) })
}

/// Opens the BPF object pinned at `path`.
pub(crate) fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    fd_or_errno(unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) })
}

/// The ids of the maps the program open at `prog` uses.
pub(crate) fn prog_map_ids(prog: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: `info` is a valid bpf_prog_info of `len` bytes; no array is asked for yet.
    ok_or_errno(unsafe {
        libbpf_sys::bpf_prog_get_info_by_fd(prog.as_raw_fd(), &mut info, &mut len)
    })?;
    let mut ids = vec![0u32; info.nr_map_ids as usize];
    let mut info = libbpf_sys::bpf_prog_info {
        nr_map_ids: ids.len() as u32,
        map_ids: ids.as_mut_ptr() as u64,
        ..Default::default()
    };
    let mut len = size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: `map_ids` points at `nr_map_ids` u32s that outlive the call; the kernel
    // writes at most that many.
    ok_or_errno(unsafe {
        libbpf_sys::bpf_prog_get_info_by_fd(prog.as_raw_fd(), &mut info, &mut len)
    })?;
    // Maps added between the two calls are not listed; the program's maps never change.
    ids.truncate(info.nr_map_ids as usize);
    Ok(ids)
}

/// The linked libbpf's (major, minor) version.
pub(crate) fn libbpf_version() -> (u32, u32) {
    // SAFETY: getters of constants compiled into libbpf; no arguments.
    unsafe {
        (
            libbpf_sys::libbpf_major_version(),
            libbpf_sys::libbpf_minor_version(),
        )
    }
}

fn libc_einval() -> i32 {
    nix::errno::Errno::EINVAL as i32
}

//! Telling which process holds a claim: the peer of a listening socket, the owner of a
//! flock. Best effort: a claim is refused whether or not its holder can be named.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, UnixAddr, connect, getsockopt, socket, sockopt,
};
use nix::sys::stat::{fstat, major, minor};

use super::error::Holder;

/// What connecting to a unix socket found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// Nobody listens (no such socket, or a stale one).
    Absent,
    /// A process listens; its pid when the kernel tells it.
    Listening(Holder),
}

/// Connects to `addr` and asks the kernel who listens there (`SO_PEERCRED` gives the
/// listener's credentials from the moment it called `listen`). Non-blocking, so a full
/// backlog does not hang the caller: it still counts as someone listening.
pub(crate) fn peer(addr: &UnixAddr) -> Peer {
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return Peer::Absent;
    };
    match connect(fd.as_raw_fd(), addr) {
        Ok(()) => {
            let pid = getsockopt(&fd, sockopt::PeerCredentials)
                .ok()
                .and_then(|c| u32::try_from(c.pid()).ok());
            Peer::Listening(Holder(pid))
        }
        Err(nix::errno::Errno::EAGAIN) => Peer::Listening(Holder(None)),
        Err(_) => Peer::Absent,
    }
}

/// The process holding a flock on `file`'s inode, from `/proc/locks`.
pub(crate) fn flock_holder(file: &File) -> Holder {
    let Ok(st) = fstat(file) else {
        return Holder(None);
    };
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return Holder(None);
    };
    let key = (major(st.st_dev), minor(st.st_dev), st.st_ino);
    Holder(locks.lines().find_map(|line| holder_in_line(line, key)))
}

/// The pid of a granted FLOCK line for the inode `(major, minor, inode)`:
/// `1: FLOCK  ADVISORY  WRITE 4242 00:27:453810 0 EOF`. Waiters (`1: -> FLOCK ...`) are
/// not holders.
fn holder_in_line(line: &str, (maj, min, ino): (u64, u64, u64)) -> Option<u32> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(1) != Some(&"FLOCK") {
        return None;
    }
    let pid = fields.get(4)?.parse().ok()?;
    let mut id = fields.get(5)?.split(':');
    let parsed = (
        u64::from_str_radix(id.next()?, 16).ok()?,
        u64::from_str_radix(id.next()?, 16).ok()?,
        id.next()?.parse::<u64>().ok()?,
    );
    (parsed == (maj, min, ino)).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_are_matched_by_inode_and_waiters_are_skipped() {
        let key = (0, 0x27, 453810);
        let granted = "7: FLOCK  ADVISORY  WRITE 13170 00:27:453810 0 EOF";
        assert_eq!(holder_in_line(granted, key), Some(13170));
        let waiter = "7: -> FLOCK  ADVISORY  WRITE 13171 00:27:453810 0 EOF";
        assert_eq!(holder_in_line(waiter, key), None);
        let other = "8: FLOCK  ADVISORY  WRITE 1 00:27:453811 0 EOF";
        assert_eq!(holder_in_line(other, key), None);
        let posix = "9: POSIX  ADVISORY  WRITE 2 00:27:453810 0 EOF";
        assert_eq!(holder_in_line(posix, key), None);
        assert_eq!(holder_in_line("garbage", key), None);
        let wide = "3: FLOCK  ADVISORY  WRITE 99 103:02:12 0 EOF";
        assert_eq!(holder_in_line(wide, (0x103, 2, 12)), Some(99));
    }

    #[test]
    fn our_own_flock_is_found_in_proc_locks() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::open(dir.path()).unwrap();
        let locked =
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
        assert_eq!(flock_holder(&locked), Holder(Some(std::process::id())));
    }

    #[test]
    fn nobody_listening_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        assert_eq!(peer(&UnixAddr::new(&path).unwrap()), Peer::Absent);
    }
}

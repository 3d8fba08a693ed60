//! The API socket: a lock file beside it, and no live agent answering on it.
//!
//! The API server binds its socket late, after every cell has restored its state, so the
//! socket alone cannot keep a second agent from starting: two agents starting together
//! would both find no socket, both restore, and the second to bind would take the path
//! from under the first. The lock file `<api-socket>.lock` is taken first, before anything
//! else, and held for the agent's life (the kernel drops it with the process); it holds the
//! holder's pid for the message. A socket that answers although nobody holds the lock (an
//! agent that does not take it) is refused too, naming its pid from `SO_PEERCRED`.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::socket::UnixAddr;

use super::error::{Error, Holder, Result, io};
use super::holder::{Peer, flock_holder, peer};

/// The lock file of the socket at `path`.
pub(crate) fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
}

/// Takes the socket's lock file and checks that nobody answers on the socket.
pub(crate) fn claim(path: &Path) -> Result<Flock<File>> {
    if let Some(parent) = path.parent() {
        // The mode the API server gives it; the socket itself is 0600.
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(io("create", parent))?;
    }
    let lock = lock_path(path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        // A link planted in its place would have the agent, as root, truncate what it names.
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&lock)
        .map_err(io("open", &lock))?;
    let mut locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((file, _)) => {
            return Err(Error::ApiSocketTaken {
                path: path.to_path_buf(),
                holder: pid_of(file),
            });
        }
    };
    if let Ok(addr) = UnixAddr::new(path)
        && let Peer::Listening(holder) = peer(&addr)
    {
        return Err(Error::ApiSocketTaken {
            path: path.to_path_buf(),
            holder,
        });
    }
    locked.set_len(0).map_err(io("truncate", &lock))?;
    write!(locked, "{}", std::process::id()).map_err(io("write", &lock))?;
    Ok(locked)
}

/// The holder named by the kernel, else by the pid the file holds.
fn pid_of(mut file: File) -> Holder {
    if let Holder(Some(pid)) = flock_holder(&file) {
        return Holder(Some(pid));
    }
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    Holder(text.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn a_second_claim_is_refused_with_the_holders_pid_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/cellium.sock");
        let first = claim(&path).unwrap();
        let lock = std::fs::read_to_string(lock_path(&path)).unwrap();
        assert_eq!(lock, std::process::id().to_string());
        let err = claim(&path).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, Error::ApiSocketTaken { holder: Holder(Some(pid)), .. } if pid == std::process::id()),
            "{text}"
        );
        assert!(
            text.contains("cellium.sock") && text.contains("--api-socket"),
            "{text}"
        );
        drop(first);
        claim(&path).unwrap();
    }

    #[test]
    fn a_live_socket_without_a_lock_is_refused_and_a_stale_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cellium.sock");
        let live = UnixListener::bind(&path).unwrap();
        let err = claim(&path).unwrap_err();
        assert!(
            matches!(err, Error::ApiSocketTaken { holder: Holder(Some(pid)), .. } if pid == std::process::id()),
            "{err}"
        );
        // The lock taken for the check is not kept by a refused claim.
        drop(live);
        let _claimed = claim(&path).expect("a socket nobody answers on is stale");
    }
}

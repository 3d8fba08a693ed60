//! The network namespace: an abstract unix socket bound in it.
//!
//! Abstract unix sockets belong to the network namespace they are bound in, and the kernel
//! removes one when the last descriptor closes, so the claim cannot outlive a crashed agent
//! and needs no cleanup. The holder listens, so a rival connecting to the name learns its
//! pid from `SO_PEERCRED`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};

use nix::sys::socket::UnixAddr;

use super::error::{Error, Holder, Result, io};
use super::holder::{Peer, peer};

/// Binds `@name` in the calling thread's network namespace.
pub(crate) fn claim(name: &str) -> Result<UnixListener> {
    let path = format!("@{name}");
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(io("name", &path))?;
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => {
            listener
                .set_nonblocking(true)
                .map_err(io("set non-blocking", &path))?;
            Ok(listener)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(Error::NetnsTaken {
            name: name.to_string(),
            holder: holder(name),
        }),
        Err(e) => Err(io("bind", &path)(e)),
    }
}

fn holder(name: &str) -> Holder {
    match UnixAddr::new_abstract(name.as_bytes()).map(|a| peer(&a)) {
        Ok(Peer::Listening(holder)) => holder,
        _ => Holder(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name of this test process's own, so parallel tests and other agents on the
    /// machine's namespace never meet it.
    fn unique(tag: &str) -> String {
        format!("cellium-test-{}-{tag}", std::process::id())
    }

    #[test]
    fn a_second_claim_names_the_first_holder_and_a_released_one_is_free() {
        let name = unique("netns");
        let first = claim(&name).unwrap();
        let err = claim(&name).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, Error::NetnsTaken { holder: Holder(Some(pid)), .. } if pid == std::process::id()),
            "{text}"
        );
        assert!(
            text.contains(&format!("pid {}", std::process::id())) && text.contains(&name),
            "{text}"
        );
        drop(first);
        claim(&name).unwrap();
    }
}

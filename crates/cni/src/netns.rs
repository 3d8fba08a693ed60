//! The pod's network namespace, opened by the plugin.
//!
//! `CNI_NETNS` is a path in the runtime's mount and PID namespaces, which the plugin shares and
//! the agent may not (`/proc/<pid>/ns/net` of a runtime in another PID namespace, a bind mount
//! in a private mount namespace, or `/proc/self/ns/net`, which in the agent would name the
//! agent's own namespace). So the plugin opens it and passes the namespace itself to the agent
//! with the call; the agent checks what it got (a network namespace, neither its own nor the
//! node's) and never opens the path.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::error::{Error, Result};

/// Opens `CNI_NETNS` for passing to the agent.
pub fn open(path: &str) -> Result<OwnedFd> {
    File::open(Path::new(path))
        .map(OwnedFd::from)
        .map_err(|source| Error::NetnsOpen {
            path: path.into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_named() {
        let err = open("/run/netns/cellium-does-not-exist").unwrap_err();
        assert_eq!(err.code(), 102);
        assert!(err.to_string().contains("cellium-does-not-exist"), "{err}");
    }
}

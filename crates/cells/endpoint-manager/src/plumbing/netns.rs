//! Netlink connections in other network namespaces.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use nix::sched::{CloneFlags, setns};
use rtnetlink::Handle;

use crate::plumbing::error::{Error, Result};

/// A netlink connection bound to one network namespace.
///
/// A netlink socket belongs to the namespace of the thread that opened it, for its whole
/// life. So a connection into a pod's namespace is opened on a throw-away thread that entered
/// the namespace (and never leaves it, so no runtime thread ever runs in the wrong one); the
/// socket is then driven by the agent's runtime like any other.
#[derive(Debug, Clone)]
pub struct Netlink {
    /// The request handle.
    pub handle: Handle,
    /// The namespace's name in messages: its path, or "the node".
    pub netns: String,
}

impl Netlink {
    /// A connection in the agent's own namespace.
    pub fn node() -> Result<Netlink> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|source| Error::Netns {
            path: "/proc/self/ns/net".into(),
            source,
        })?;
        tokio::spawn(conn);
        Ok(Netlink {
            handle,
            netns: "the node".into(),
        })
    }

    /// A connection in the namespace at `path` (e.g. `/run/netns/x`, `/proc/<pid>/ns/net`).
    pub async fn open(path: &Path) -> Result<Netlink> {
        let file = File::open(path).map_err(|source| Error::Netns {
            path: path.to_path_buf(),
            source,
        })?;
        let runtime = tokio::runtime::Handle::current();
        let owned = path.to_path_buf();
        let opened = std::thread::spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            // The socket registers with the runtime's reactor, which needs its context here.
            let _entered = runtime.enter();
            rtnetlink::new_connection()
        })
        .join()
        .map_err(|_| Error::Netns {
            path: owned.clone(),
            source: std::io::Error::other("the namespace thread panicked"),
        })?;
        let (conn, handle, _) = opened.map_err(|source| Error::Netns {
            path: owned.clone(),
            source,
        })?;
        tokio::spawn(conn);
        Ok(Netlink {
            handle,
            netns: owned.display().to_string(),
        })
    }

    /// Resolves when the kernel announces the removal of link `index` of the agent's own
    /// namespace (RTM_DELLINK on the link multicast group); never, if it does not.
    pub fn link_removed(
        index: u32,
    ) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
        use futures::StreamExt;
        use rtnetlink::packet_core::NetlinkPayload;
        use rtnetlink::packet_route::RouteNetlinkMessage;

        let (conn, _handle, mut messages) =
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])?;
        // The socket is driven by a task that ends with the listener, however that ends
        // (announced, or dropped because the deletion answered first).
        let driver = AbortOnDrop(tokio::spawn(conn));
        Ok(async move {
            let _driver = driver;
            while let Some((msg, _)) = messages.next().await {
                if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link)) =
                    msg.payload
                    && link.header.index == index
                {
                    return;
                }
            }
            std::future::pending::<()>().await
        })
    }

    /// Deletes link `index` of the agent's own namespace on a blocking thread, over a netlink
    /// socket of its own.
    ///
    /// Unregistering an interface keeps the request in the kernel for RCU grace periods, about
    /// 15 ms for a veth pair. On the shared node connection that would hold up every other
    /// netlink request of the agent, and the runtime worker driving it; alone, concurrent
    /// deletions (a burst of CNI DELs) wait out their grace periods side by side. The thread
    /// comes from the runtime's blocking pool, whose threads all stay in the agent's namespace
    /// (only the throw-away threads of [`Netlink::open`] enter pods' namespaces).
    pub async fn delete_link_alone(index: u32) -> std::io::Result<Result<(), rtnetlink::Error>> {
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()?;
            runtime.block_on(async move {
                let (conn, handle, _) = rtnetlink::new_connection()?;
                let driver = tokio::spawn(conn);
                let deleted = handle.link().del(index).execute().await;
                driver.abort();
                Ok(deleted)
            })
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether `path` names a network namespace that still exists.
pub fn netns_exists(path: &Path) -> bool {
    // A bind-mounted namespace whose last process is gone stays valid; a deleted one is
    // unmounted, leaving an empty file that is not a namespace.
    match File::open(path) {
        Ok(file) => nix::sys::statfs::fstatfs(&file)
            .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
            .unwrap_or(false),
        Err(_) => false,
    }
}

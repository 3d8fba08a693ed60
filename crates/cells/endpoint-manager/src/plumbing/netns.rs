//! Pods' network namespaces as the runtime hands them over, and netlink connections in them.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sched::{CloneFlags, setns};
use rtnetlink::Handle;

use crate::plumbing::error::{Error, Result};

/// The agent's own network namespace, as the kernel names it to this process.
const OWN_NETNS: &str = "/proc/self/ns/net";
/// The node's network namespace: that of PID 1, the init of the agent's PID namespace.
const NODE_NETNS: &str = "/proc/1/ns/net";

/// A pod's network namespace: the namespace itself, passed by the CNI plugin as an open
/// descriptor, and the path the runtime named it by (`CNI_NETNS`).
///
/// Trap: the path is valid in the runtime's mount and PID namespaces, not necessarily in the
/// agent's (a runtime in its own mount namespace, `/proc/<pid>/ns/net` of another PID
/// namespace, or `/proc/self/ns/net`, which here would be the agent's own). It is kept for
/// records and messages only; every netlink operation on the pod goes through the descriptor.
#[derive(Clone)]
pub struct PodNetns {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    id: NsId,
}

/// A namespace's identity: the device and inode of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NsId {
    dev: u64,
    ino: u64,
}

impl NsId {
    fn of_fd(fd: BorrowedFd<'_>) -> std::io::Result<NsId> {
        let st = nix::sys::stat::fstat(fd)?;
        Ok(NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    fn of_path(path: &str) -> std::io::Result<NsId> {
        let st = nix::sys::stat::stat(path)?;
        Ok(NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }
}

/// Why a namespace handed over cannot hold a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It is not a network namespace (what it is instead: a regular file, a directory, another
    /// kind of namespace).
    NotNetns(String),
    /// It is the agent's own network namespace.
    AgentOwn,
    /// It is the node's network namespace (PID 1's).
    Node,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotNetns(what) => write!(f, "it is not a network namespace but {what}"),
            Refusal::AgentOwn => f.write_str(
                "it is the agent's own network namespace (/proc/self/ns/net of the agent): a pod needs a namespace of its own, and its interface and default route would land in the node's network",
            ),
            Refusal::Node => f.write_str(
                "it is the node's network namespace (that of PID 1): a pod needs a namespace of its own, and its interface and default route would land in the node's network",
            ),
        }
    }
}

impl PodNetns {
    /// The namespace `fd`, which the runtime names `path`, once it is known to be a network
    /// namespace other than the agent's own and the node's: a pod set up in either would put its
    /// interface and a default route into the node's network.
    pub fn new(path: PathBuf, fd: Arc<OwnedFd>) -> Result<PodNetns> {
        let refused = |why| Error::NetnsRefused {
            path: path.clone(),
            why,
        };
        if let Some(what) = not_a_netns(fd.as_fd()) {
            return Err(refused(Refusal::NotNetns(what)));
        }
        let id = NsId::of_fd(fd.as_fd()).map_err(|e| refused(Refusal::NotNetns(e.to_string())))?;
        let own = NsId::of_path(OWN_NETNS).map_err(|source| Error::Netns {
            path: OWN_NETNS.into(),
            source,
        })?;
        match judge(id, own, node_netns()) {
            Some(why) => Err(refused(why)),
            None => Ok(PodNetns { path, fd, id }),
        }
    }

    /// The path the runtime named the namespace by: for records and messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A handle on the namespace open at `path`, without the checks of [`PodNetns::new`]: for
    /// tests of code that only reads the path.
    #[cfg(test)]
    pub(crate) fn unchecked(path: &str) -> PodNetns {
        let file = std::fs::File::open(OWN_NETNS).expect("open /proc/self/ns/net");
        let fd = Arc::new(OwnedFd::from(file));
        let id = NsId::of_fd(fd.as_fd()).expect("fstat");
        PodNetns {
            path: path.into(),
            fd,
            id,
        }
    }
}

/// What `fd` is when it is not a network namespace. Only namespaces live on nsfs, and of those
/// only a network namespace can be entered as one: the kernel refuses `setns` with
/// `CLONE_NEWNET` on any other, so a throw-away thread tries it.
fn not_a_netns(fd: BorrowedFd<'_>) -> Option<String> {
    let on_nsfs = nix::sys::statfs::fstatfs(fd)
        .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
        .unwrap_or(false);
    if !on_nsfs {
        let kind = match nix::sys::stat::fstat(fd) {
            Ok(st) => match st.st_mode & nix::libc::S_IFMT {
                nix::libc::S_IFREG => "a regular file",
                nix::libc::S_IFDIR => "a directory",
                _ => "a file that is not a namespace",
            },
            Err(_) => "unreadable",
        };
        return Some(kind.to_string());
    }
    let probe = match fd.try_clone_to_owned() {
        Ok(probe) => probe,
        Err(e) => return Some(format!("unreadable ({e})")),
    };
    let entered = std::thread::spawn(move || setns(probe.as_fd(), CloneFlags::CLONE_NEWNET))
        .join()
        .unwrap_or(Err(nix::errno::Errno::EINVAL));
    match entered {
        Ok(()) => None,
        Err(nix::errno::Errno::EINVAL) => Some("a namespace of another type".to_string()),
        Err(e) => Some(format!("a namespace that cannot be entered ({e})")),
    }
}

/// Why the network namespace `id` cannot hold a pod, given the agent's own and the node's
/// (when it can be read).
fn judge(id: NsId, own: NsId, node: Option<NsId>) -> Option<Refusal> {
    if id == own {
        Some(Refusal::AgentOwn)
    } else if node == Some(id) {
        Some(Refusal::Node)
    } else {
        None
    }
}

/// The node's network namespace, read once. A sandbox may hide PID 1 from the agent even as
/// root (`ptrace` access rules); then only the agent's own namespace is refused, which is the
/// node's wherever the agent runs in it, and the log says so once.
fn node_netns() -> Option<NsId> {
    static NODE: std::sync::OnceLock<Option<NsId>> = std::sync::OnceLock::new();
    *NODE.get_or_init(|| match NsId::of_path(NODE_NETNS) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(
                path = NODE_NETNS,
                error = %e,
                "cannot read the node's network namespace: pods' namespaces are checked against the agent's own only"
            );
            None
        }
    })
}

impl fmt::Debug for PodNetns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodNetns")
            .field("path", &self.path)
            .field("inode", &self.id.ino)
            .finish()
    }
}

/// Two handles are equal when they name the same path and hold the same namespace.
impl PartialEq for PodNetns {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.id == other.id
    }
}

impl Eq for PodNetns {}

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

    /// A connection in the pod's namespace.
    pub async fn open(netns: &PodNetns) -> Result<Netlink> {
        let path = netns.path().to_path_buf();
        let failed = |source| Error::Netns {
            path: path.clone(),
            source,
        };
        let fd = netns.as_fd().try_clone_to_owned().map_err(failed)?;
        let runtime = tokio::runtime::Handle::current();
        let opened = std::thread::spawn(move || {
            setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            // The socket registers with the runtime's reactor, which needs its context here.
            let _entered = runtime.enter();
            rtnetlink::new_connection()
        })
        .join()
        .map_err(|_| failed(std::io::Error::other("the namespace thread panicked")))?;
        let (conn, handle, _) = opened.map_err(failed)?;
        tokio::spawn(conn);
        Ok(Netlink {
            handle,
            netns: path.display().to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &str) -> Arc<OwnedFd> {
        Arc::new(OwnedFd::from(std::fs::File::open(path).unwrap()))
    }

    /// A network namespace of its own, made on a thread that leaves it again by ending: the
    /// descriptor keeps it alive, and nothing of the machine's network is touched.
    fn fresh_netns() -> Arc<OwnedFd> {
        std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare (run as root)");
            open("/proc/thread-self/ns/net")
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_agents_own_namespace_is_refused_saying_so() {
        let err = PodNetns::new("/proc/self/ns/net".into(), open(OWN_NETNS)).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::NetnsRefused {
                    why: Refusal::AgentOwn,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("the agent's own"), "{err}");
    }

    #[test]
    fn the_node_is_told_apart_from_the_agent_when_the_agent_runs_elsewhere() {
        // Tests run in the node's namespace, which is then also the agent's own; an agent in a
        // namespace of its own (as in the integration suites) sees them differ.
        let (pod, own, node) = (
            NsId { dev: 4, ino: 10 },
            NsId { dev: 4, ino: 11 },
            NsId { dev: 4, ino: 12 },
        );
        assert_eq!(judge(pod, own, Some(node)), None);
        assert_eq!(judge(own, own, Some(node)), Some(Refusal::AgentOwn));
        assert_eq!(judge(node, own, Some(node)), Some(Refusal::Node));
        // PID 1 hidden from the agent: its own namespace is still refused.
        assert_eq!(judge(pod, own, None), None);
        assert_eq!(judge(own, own, None), Some(Refusal::AgentOwn));
        assert!(Refusal::Node.to_string().contains("PID 1"));
    }

    #[test]
    fn what_is_not_a_network_namespace_is_refused_naming_it() {
        let err = PodNetns::new("/proc/self/ns/mnt".into(), open("/proc/self/ns/mnt")).unwrap_err();
        assert!(err.to_string().contains("not a network namespace"), "{err}");
        assert!(err.to_string().contains("another type"), "{err}");
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = PodNetns::new(file.path().into(), open(&file.path().display().to_string()))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("not a network namespace but a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_namespace_of_its_own_is_accepted_whatever_its_path() {
        let ns = PodNetns::new("/somewhere/only/the/runtime/sees".into(), fresh_netns()).unwrap();
        assert_eq!(ns.path(), Path::new("/somewhere/only/the/runtime/sees"));
    }
}

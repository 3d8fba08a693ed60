//! The `node-lock` cell: one agent per node, settled before anything is touched.
//!
//! - **Owns** the node-wide claims of the agent: its network namespace (an abstract unix
//!   socket, `@cellium-agent`, bound in it), its API socket (a lock file beside it, and no
//!   live agent answering on it) and its BPF root (a flock on the directory, on a bpffs it
//!   mounts there first if needed, serialized with any other agent mounting there).
//! - **Provides** `Arc<NodeLock>`; it invokes itself. What it claims is the value group
//!   `Vec<Arc<NodeClaim>>`: the cell contributes the network namespace, the agent's
//!   composition contributes the paths of its API socket and BPF root (`cellium-agent`'s
//!   `node_lock()` does).
//! - **Depends on** nothing but the hive, so that it comes first.
//! - **Config keys:** none of its own.
//! - **Degraded** never: a claim held by another agent fails the start, with an error that
//!   names what is shared and the other agent's pid.
//!
//! Its start hook must be the first of the agent: a second agent that shares the node but
//! not the state directory would otherwise restore its endpoints and sweep every veth it
//! does not know, the first agent's pods' included, before failing on what they share.
//! Put the cell first in the list of cells: the hive starts hooks in construction order
//! and invokes in declaration order. Every claim is released by the kernel when the
//! process dies, so a crashed agent leaves nothing to clean up.

mod api_socket;
mod bpf_root;
mod error;
mod holder;
mod netns;

use std::fmt;
use std::fs::File;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_hive::{Hook, Jobs, Lifecycle, Module, Reporter};
use nix::fcntl::Flock;

pub use error::{Error, Holder, Result};

/// The abstract socket that claims the network namespace for the agent.
pub const NETNS_SOCKET: &str = "cellium-agent";

/// Something on the node that only one agent may use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeClaim {
    /// The network namespace the agent runs in, claimed by binding the abstract unix
    /// socket with this name in it.
    Netns(String),
    /// The API socket's path.
    ApiSocket(PathBuf),
    /// The BPF root, mounted as bpffs if it is not on one.
    BpfRoot(PathBuf),
}

impl fmt::Display for NodeClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeClaim::Netns(name) => write!(f, "network namespace (@{name})"),
            NodeClaim::ApiSocket(path) => write!(f, "API socket {}", path.display()),
            NodeClaim::BpfRoot(path) => write!(f, "BPF root {}", path.display()),
        }
    }
}

/// What is held for one claim; dropping it releases the claim.
#[derive(Debug)]
enum Held {
    Netns(UnixListener),
    // Never read: held for its drop, which releases the flock.
    Lock(#[allow(dead_code)] Flock<File>),
}

/// The agent's hold on its node.
#[derive(Debug)]
pub struct NodeLock {
    claims: Vec<NodeClaim>,
    held: Mutex<Vec<Held>>,
}

impl NodeLock {
    /// Declares the claims; the `claim-node` start hook takes them, the stop hook releases
    /// them.
    pub fn new(
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        claims: Vec<Arc<NodeClaim>>,
    ) -> Arc<NodeLock> {
        let lock = Arc::new(NodeLock::declared(claims.iter().map(|c| (**c).clone())));
        let (start, stop) = (lock.clone(), lock.clone());
        lc.append(
            Hook::new("claim-node")
                .on_start(move |_| async move {
                    let this = start.clone();
                    tokio::task::spawn_blocking(move || this.take()).await??;
                    start.answer_probes(&jobs)?;
                    let what: Vec<String> = start.claims.iter().map(ToString::to_string).collect();
                    reporter.ok(format!("holding {}", what.join(", ")));
                    Ok(())
                })
                .on_stop(move |_| async move {
                    stop.release();
                    Ok(())
                }),
        );
        lock
    }

    /// Takes `claims` now, outside a hive (tools, tests): every one or none.
    pub fn acquire(claims: impl IntoIterator<Item = NodeClaim>) -> Result<NodeLock> {
        let lock = NodeLock::declared(claims);
        lock.take()?;
        Ok(lock)
    }

    /// What this lock claims, in the order it takes them.
    pub fn claims(&self) -> &[NodeClaim] {
        &self.claims
    }

    /// Releases every claim (also done when the lock is dropped).
    pub fn release(&self) {
        self.held().clear();
    }

    fn declared(claims: impl IntoIterator<Item = NodeClaim>) -> NodeLock {
        // The cheapest checks first: the namespace touches nothing, the API socket a lock
        // file, the BPF root may need a mount.
        let mut claims: Vec<NodeClaim> = claims.into_iter().collect();
        claims.sort();
        claims.dedup();
        NodeLock {
            claims,
            held: Mutex::new(Vec::new()),
        }
    }

    /// Takes every claim in order; on the first refusal, what was taken is dropped.
    fn take(&self) -> Result<()> {
        let mut held = Vec::with_capacity(self.claims.len());
        for claim in &self.claims {
            held.push(match claim {
                NodeClaim::Netns(name) => Held::Netns(netns::claim(name)?),
                NodeClaim::ApiSocket(path) => Held::Lock(api_socket::claim(path)?),
                NodeClaim::BpfRoot(path) => Held::Lock(bpf_root::claim(path)?),
            });
            tracing::info!(%claim, "claimed");
        }
        *self.held() = held;
        Ok(())
    }

    /// Accepts and drops connections to the namespace's socket, so that every rival that
    /// asks learns our pid and none waits in a full backlog.
    fn answer_probes(&self, jobs: &Jobs) -> Result<()> {
        let Some(listener) = self.held().iter().find_map(|h| match h {
            Held::Netns(l) => Some(l.try_clone()),
            Held::Lock(_) => None,
        }) else {
            return Ok(());
        };
        let listener = listener
            .and_then(tokio::net::UnixListener::from_std)
            .map_err(error::io("listen on", "the network namespace's socket"))?;
        let mut listener = Some(listener);
        jobs.one_shot("answer-probes", move |ctx| {
            let listener = listener.take();
            async move {
                let listener = listener.ok_or("the namespace socket is gone")?;
                ctx.reporter().ok("answering other agents' probes");
                loop {
                    tokio::select! {
                        _ = ctx.cancelled() => return Ok(()),
                        accepted = listener.accept() => drop(accepted),
                    }
                }
            }
        })
        .add();
        Ok(())
    }

    fn held(&self) -> MutexGuard<'_, Vec<Held>> {
        // Every update is a single assignment or clear: a poisoned lock is still consistent.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The `node-lock` module, claiming the network namespace; contribute
/// `Arc<NodeClaim>`s for the API socket and the BPF root where the agent is composed.
pub fn cell() -> Module {
    Module::new(
        "node-lock",
        "Claims the node for one agent (network namespace, API socket, BPF root) before any cell starts",
    )
    .contribute(|| Arc::new(NodeClaim::Netns(NETNS_SOCKET.to_string())))
    .provide(NodeLock::new)
    .invoke(|_: Arc<NodeLock>| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_taken_cheapest_first_and_all_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        let name = format!("cellium-test-{}-all-or-none", std::process::id());
        // A holder of the socket only: a rival that also claims the namespace and the
        // socket is refused at the socket, and releases the namespace it took first.
        let holder = NodeLock::acquire([NodeClaim::ApiSocket(socket.clone())]).unwrap();
        let claims = [
            NodeClaim::ApiSocket(socket.clone()),
            NodeClaim::Netns(name.clone()),
        ];
        let err = NodeLock::acquire(claims.clone()).unwrap_err();
        assert!(matches!(err, Error::ApiSocketTaken { .. }), "{err}");
        let netns_only = NodeLock::acquire([NodeClaim::Netns(name.clone())])
            .expect("a refused claim releases what it took before");
        drop(netns_only);
        drop(holder);
        let lock = NodeLock::acquire(claims).unwrap();
        assert_eq!(
            lock.claims(),
            [NodeClaim::Netns(name.clone()), NodeClaim::ApiSocket(socket)]
        );
        lock.release();
        NodeLock::acquire([NodeClaim::Netns(name)]).expect("released");
    }
}

//! One agent per node: a second agent that shares the running agent's network namespace, BPF
//! root or API socket (with a state directory of its own, so the state directory's lock does
//! not stop it) exits before it touches anything, naming what is shared and the running
//! agent's pid; the running agent's pods keep their interfaces and their connectivity. And
//! agents racing for one unmounted BPF root mount bpffs there once, and one of them wins.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test node_lock -- --test-threads=1`.
//!
//! Every test makes its own agents, namespaces and directories and removes them (guards), and
//! sends traffic only to the pods' addresses inside them.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cellium_integration::wait::container_id;
use cellium_integration::{Agent, AgentOptions, NetNs, probe, serial};
use cellium_node_lock::{Error, Holder, NodeClaim, NodeLock};
use nix::mount::{MntFlags, umount2};

/// How long a refused rival may take to give up (it stops before loading anything).
const RIVAL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a rival shares with the running agent; the rest is its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    Netns,
    BpfRoot,
    ApiSocket,
}

/// A second agent's own namespace and directory, removed (and its bpffs unmounted, should it
/// have mounted one) when dropped.
struct Rival {
    netns: NetNs,
    dir: tempfile::TempDir,
}

impl Rival {
    fn new() -> Rival {
        Rival {
            netns: NetNs::new().expect("rival netns"),
            dir: tempfile::Builder::new()
                .prefix("cel-rival-")
                .tempdir()
                .expect("rival dir"),
        }
    }

    fn bpf_root(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    /// Runs `cellium-agent run` sharing `share` with `agent`; returns whether it exited with
    /// success, its output, and how long it ran. A rival still running after the timeout is
    /// killed and fails the test.
    fn run(&self, agent: &Agent, share: Share) -> (bool, String, Duration) {
        let netns = if share == Share::Netns {
            agent.node().path()
        } else {
            self.netns.path()
        };
        let socket = if share == Share::ApiSocket {
            agent.socket()
        } else {
            self.dir.path().join("api.sock")
        };
        let bpf_root = if share == Share::BpfRoot {
            agent.bpf_root()
        } else {
            self.bpf_root()
        };
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(&agent.binaries().agent)
            .arg("run")
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .arg("--api-socket")
            .arg(&socket)
            .arg("--bpf-root")
            .arg(&bpf_root)
            // Not the running agent's port: in a shared namespace that clash alone would stop
            // the rival, though only after its first hooks ran.
            .arg("--metrics-addr")
            .arg("127.0.0.1:9963")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the rival agent");
        let began = Instant::now();
        loop {
            if child.try_wait().expect("wait for the rival").is_some() {
                break;
            }
            if began.elapsed() > RIVAL_TIMEOUT {
                let _ = child.kill();
                let out = child.wait_with_output().expect("rival output");
                panic!(
                    "the rival sharing {share:?} is still running after {RIVAL_TIMEOUT:?}:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = began.elapsed();
        let out = child.wait_with_output().expect("rival output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text, took)
    }
}

impl Drop for Rival {
    fn drop(&mut self) {
        let root = self.bpf_root();
        if is_bpffs(&root) {
            let _ = umount2(&root, MntFlags::MNT_DETACH);
        }
    }
}

fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// The host ends of veth pairs in the node namespace ([`Agent::lxc_links`]).
fn lxc_links(agent: &Agent) -> BTreeSet<String> {
    agent.lxc_links().expect("ip link")
}

fn reach_each_other(pods: &[(NetNs, Ipv4Addr)]) -> bool {
    probe::ping(&pods[0].0, pods[1].1, 1).expect("ping")
        && probe::ping(&pods[1].0, pods[0].1, 1).expect("ping")
}

#[test]
fn a_second_agent_sharing_the_node_stops_before_touching_the_first_ones_pods() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let pid = agent.pid().expect("the agent runs");
    let pods: Vec<(NetNs, Ipv4Addr)> = (0..2)
        .map(|i| {
            let ns = NetNs::new().expect("pod netns");
            let (ip, _) = agent
                .add(&ns, &container_id(&format!("lock{i}")))
                .expect("pod added");
            (ns, ip)
        })
        .collect();
    let links = lxc_links(&agent);
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(reach_each_other(&pods));

    let cases = [
        (
            Share::Netns,
            "already runs in this network namespace".to_string(),
        ),
        (
            Share::BpfRoot,
            format!("BPF root {} is in use", agent.bpf_root().display()),
        ),
        (
            Share::ApiSocket,
            format!("API socket {} is in use", agent.socket().display()),
        ),
    ];
    for (share, what) in cases {
        let rival = Rival::new();
        let (ok, out, took) = rival.run(&agent, share);
        assert!(!ok, "the rival sharing {share:?} started:\n{out}");
        assert!(
            out.contains(&what) && out.contains(&format!("pid {pid}")),
            "the rival sharing {share:?} must name it and pid {pid}:\n{out}"
        );
        // It stopped at its first start hook: nothing restored, loaded, served or swept.
        for later in ["restore", "load-datapath", "serving the API", "leftover"] {
            assert!(
                !out.contains(later),
                "the rival sharing {share:?} got as far as {later:?}:\n{out}"
            );
        }
        assert!(
            !is_bpffs(&rival.bpf_root()),
            "the rival sharing {share:?} mounted its own BPF root"
        );
        assert!(
            agent.cli(&["status"]).is_ok(),
            "the first agent stopped answering:\n{}",
            agent.log()
        );
        assert_eq!(
            lxc_links(&agent),
            links,
            "after the rival sharing {share:?}"
        );
        assert!(
            reach_each_other(&pods),
            "pods lost connectivity after the rival sharing {share:?}"
        );
        assert_eq!(agent.endpoints().expect("endpoint list").len(), 2);
        eprintln!(
            "rival sharing {share:?} refused in {took:?}: {}",
            out.lines().last().unwrap_or_default()
        );
    }
}

/// Threads claiming one BPF root that is not mounted yet, all at once: one holds it, the
/// others are told who does, and bpffs is mounted there exactly once (a second mount would
/// hide the pins made in the first).
#[test]
fn racing_claims_of_an_unmounted_bpf_root_mount_it_once_and_one_wins() {
    let _serial = serial();
    let dir = tempfile::Builder::new()
        .prefix("cel-bpfrace-")
        .tempdir()
        .expect("dir");
    let root = dir.path().join("bpf");
    let _unmount = Unmount(root.clone());
    let barrier = std::sync::Barrier::new(4);
    let results: Vec<Result<NodeLock, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    NodeLock::acquire([NodeClaim::BpfRoot(root.clone())])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("claim thread"))
            .collect()
    });
    let winners = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(winners, 1, "{results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, Error::BpfRootTaken { holder: Holder(Some(p)), .. } if *p == std::process::id()),
                "{e}"
            );
        }
    }
    assert!(is_bpffs(&root));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mounts = mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(root.to_str().expect("utf-8 path")))
        .count();
    assert_eq!(
        mounts,
        1,
        "bpffs mounted {mounts} times on {}",
        root.display()
    );
}

/// Unmounts a test's bpffs when dropped, also when the test fails.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        while is_bpffs(&self.0) {
            if umount2(&self.0, MntFlags::MNT_DETACH).is_err() {
                break;
            }
        }
    }
}

//! Applied objects are durable or refused, on a real agent and a disk that really fails.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test durable_apply -- --test-threads=1`.
//!
//! Each fault test gives the agent a state directory on a file system that fails the way a
//! disk does, then applies and deletes with `cellium`. The call must fail naming the errno
//! and the file, the agent must enforce what it enforced before (`cellium policy get`), the
//! records must be as they were, and an agent started again must come back with the old
//! state:
//!
//! - `ENOSPC`: a 2 MiB tmpfs, filled up.
//! - `EROFS`: the state directory bind-mounted read-only over itself.
//! - `EIO`: this kernel has no device-mapper (no `dm-error`, `dm-flakey`) and no fault
//!   injection. An ext4 file system on a loop device whose backing file is a sealed memfd
//!   does it reliably: once `F_SEAL_WRITE` is set, every write the loop driver passes on
//!   fails with `EPERM`, which the block layer turns into an I/O error, so the next `fsync`
//!   of a file on the ext4 fails with `EIO` while reads keep working. (A backing file on a
//!   full tmpfs gives `ENOSPC`, not `EIO`: the loop driver passes that errno on.)
//!
//! The last test kills the agent (SIGKILL) at many points while it applies or deletes a file
//! of 150 documents: after each restart the whole file is in force or none of it, and no temp
//! file is left in the state directory.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cellium_integration::wait::{CONVERGE, eventually, poll_for};
use cellium_integration::{Agent, AgentOptions, cmd, serial};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

const BASE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: st}\n---\n\
apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: old, namespace: st}\n\
spec: {podSelector: {}, ingress: [{ports: [{port: 80}]}]}\n";

const NEW: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: new, namespace: st}\n\
spec: {podSelector: {}, ingress: [{ports: [{port: 81}]}]}\n---\n\
apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: old, namespace: st}\n\
spec: {podSelector: {}, ingress: [{ports: [{port: 8080}]}]}\n";

/// The origins of the rules the agent enforces (`NetworkPolicy st/old`), and their ports.
fn enforced(agent: &Agent) -> BTreeSet<String> {
    let view = agent.cli_json(&["policy", "get"]).unwrap();
    view["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r["origin"].as_str().unwrap(), r["ports"]))
        .collect()
}

/// Every file under `dir`, with its content, relative paths.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &dir.join("resources"), &mut out);
    out.sort();
    out
}

/// A mount this test made, lazily unmounted on drop (also when an assertion fails).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = cmd::run("umount", &["-l", &self.0.display().to_string()]);
    }
}

/// A loop device, detached on drop.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = cmd::run("losetup", &["-d", &self.0]);
    }
}

/// Moves the (stopped) agent's state directory onto a file system mounted by `mount`, which
/// is given the empty directory to mount on.
fn move_state(agent: &Agent, mount: impl FnOnce(&Path) -> Mount) -> Mount {
    let state = agent.state_dir();
    let aside = state.with_extension("orig");
    std::fs::rename(&state, &aside).unwrap();
    std::fs::create_dir(&state).unwrap();
    let mounted = mount(&state);
    cmd::run(
        "cp",
        &[
            "-a",
            &format!("{}/.", aside.display()),
            &state.display().to_string(),
        ],
    )
    .unwrap();
    mounted
}

/// Applies `BASE`, then checks that `fault` makes apply and delete fail with an errno of
/// `errnos` (the apply with the first) naming a file in the state directory, and that nothing
/// changed, live and on disk.
fn refused_and_unchanged(agent: &mut Agent, errnos: &[&str], fault: impl FnOnce(&Agent)) {
    agent.objects("apply", BASE).unwrap();
    let before = enforced(agent);
    assert_eq!(before.len(), 2, "{before:?}");
    let records = snapshot(&agent.state_dir());
    fault(agent);
    for verb in ["apply", "delete"] {
        let text = if verb == "apply" { NEW } else { BASE };
        let err = agent.objects(verb, text).unwrap_err().to_string();
        assert!(
            err.contains("cannot record the change in the state directory; nothing changed"),
            "{verb}: {err}"
        );
        let expected = if verb == "apply" {
            &errnos[..1]
        } else {
            errnos
        };
        assert!(expected.iter().any(|e| err.contains(e)), "{verb}: {err}");
        let state = agent.state_dir().display().to_string();
        assert!(
            err.contains(&format!("{state}/resources/")),
            "{verb}: the file is named: {err}"
        );
        assert_eq!(enforced(agent), before, "{verb} changed what is enforced");
    }
    assert_eq!(snapshot(&agent.state_dir()), records, "the records changed");
}

#[test]
fn a_full_disk_refuses_apply_and_delete_and_changes_nothing() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).unwrap();
    agent.stop().unwrap();
    let _tmpfs = move_state(&agent, |dir| {
        cmd::run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=2m,mode=0700",
                "cel-state",
                &dir.display().to_string(),
            ],
        )
        .unwrap();
        Mount(dir.to_path_buf())
    });
    agent.start().unwrap();
    let filler = agent.state_dir().join("filler");
    refused_and_unchanged(
        &mut agent,
        &["No space left on device (os error 28)"],
        |agent| {
            // Fill it: the writes fail once no page is left.
            let mut f = File::create(agent.state_dir().join("filler")).unwrap();
            let chunk = vec![0u8; 64 * 1024];
            while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
        },
    );
    let before = enforced(&agent);
    // Space again; a restart shows the old state, and applying works again.
    std::fs::remove_file(&filler).unwrap();
    agent.kill().unwrap();
    agent.start().unwrap();
    assert_eq!(enforced(&agent), before);
    agent.objects("apply", NEW).unwrap();
    assert_eq!(enforced(&agent).len(), 4);
}

#[test]
fn a_read_only_state_directory_refuses_apply_and_delete_and_changes_nothing() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).unwrap();
    let state = agent.state_dir().display().to_string();
    let mut read_only = None;
    refused_and_unchanged(&mut agent, &["Read-only file system (os error 30)"], |_| {
        cmd::run("mount", &["--bind", &state, &state]).unwrap();
        read_only = Some(Mount(state.clone().into()));
        cmd::run("mount", &["-o", "remount,bind,ro", &state]).unwrap();
    });
    let before = enforced(&agent);
    agent.kill().unwrap();
    drop(read_only);
    agent.start().unwrap();
    assert_eq!(enforced(&agent), before);
}

#[test]
fn an_io_error_refuses_apply_and_delete_and_changes_nothing() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).unwrap();
    agent.stop().unwrap();
    // The disk: a memfd the test seals to make every write fail.
    let disk = memfd_create("cel-state-disk", MFdFlags::MFD_ALLOW_SEALING).unwrap();
    nix::unistd::ftruncate(&disk, 64 << 20).unwrap();
    let image = format!("/proc/{}/fd/{}", std::process::id(), disk.as_raw_fd());
    cmd::run("mkfs.ext4", &["-q", "-F", &image]).unwrap();
    let device = Loop(
        cmd::run("losetup", &["-f", "--show", &image])
            .unwrap()
            .trim()
            .to_string(),
    );
    let ext4 = move_state(&agent, |dir| {
        cmd::run(
            "mount",
            &[
                "-o",
                "errors=continue",
                &device.0,
                &dir.display().to_string(),
            ],
        )
        .unwrap();
        Mount(dir.to_path_buf())
    });
    agent.start().unwrap();
    // After the first failed write ext4 may abort its journal: later writes fail as EROFS.
    let errnos = [
        "Input/output error (os error 5)",
        "Read-only file system (os error 30)",
    ];
    refused_and_unchanged(&mut agent, &errnos, |_| {
        fcntl(
            &disk,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK,
            ),
        )
        .unwrap();
    });
    let before = enforced(&agent);
    // What the disk holds: a copy of it (its journal replayed by mounting the copy), copied
    // to a healthy directory, on which an agent started again shows the old state.
    agent.kill().unwrap();
    drop(ext4);
    drop(device);
    let state = agent.state_dir();
    let copy = state.with_extension("disk.img");
    cmd::run(
        "cp",
        &["--sparse=always", &image, &copy.display().to_string()],
    )
    .unwrap();
    let reader = Loop(
        cmd::run("losetup", &["-f", "--show", &copy.display().to_string()])
            .unwrap()
            .trim()
            .to_string(),
    );
    let disk_view = state.with_extension("disk");
    std::fs::create_dir(&disk_view).unwrap();
    cmd::run("mount", &[&reader.0, &disk_view.display().to_string()]).unwrap();
    let view = Mount(disk_view.clone());
    cmd::run(
        "cp",
        &[
            "-a",
            &format!("{}/.", disk_view.display()),
            &state.display().to_string(),
        ],
    )
    .unwrap();
    drop(view);
    drop(reader);
    agent.start().unwrap();
    assert_eq!(enforced(&agent), before);
}

/// The file the agent is killed in the middle of: a namespace and 150 policies.
fn many() -> String {
    let mut docs = vec!["apiVersion: v1\nkind: Namespace\nmetadata: {name: kl}\n".to_string()];
    for i in 0..150 {
        docs.push(format!("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p{i}, namespace: kl}}\nspec: {{podSelector: {{matchLabels: {{app: a{i}}}}}, ingress: [{{ports: [{{port: {}}}]}}]}}\n", 1000 + i));
    }
    docs.join("---\n")
}

fn policies_in_force(agent: &Agent) -> usize {
    let view = agent.cli_json(&["policy", "get"]).unwrap();
    view["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["origin"].as_str())
        .filter(|o| o.starts_with("NetworkPolicy kl/"))
        .collect::<BTreeSet<_>>()
        .len()
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(temp_files(&path));
        } else if path.to_string_lossy().ends_with(".tmp") {
            out.push(path);
        }
    }
    out
}

#[test]
fn an_agent_killed_during_an_apply_restarts_with_all_of_the_file_or_none() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).unwrap();
    let file = agent.state_dir().with_extension("many.yaml");
    std::fs::write(&file, many()).unwrap();
    let file = file.display().to_string();
    // How long an apply and a delete take when nothing interrupts them.
    let began = Instant::now();
    agent.cli(&["apply", "-f", &file]).unwrap();
    // The apply returns once the file is recorded; the policy repository takes it in after.
    eventually("the 150 policies are in force", || {
        policies_in_force(&agent) == 150
    });
    agent.cli(&["delete", "-f", &file]).unwrap();
    let span = began.elapsed() / 2;
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let (mut rounds, mut all, mut none, mut pending) = (0, 0, 0, 0);
    let mut in_force = false;
    for round in 0..10 {
        // Apply when nothing is in force, delete when everything is.
        let verb = if in_force { "delete" } else { "apply" };
        let mut cli = Command::new(&agent.binaries().cli)
            .arg("--socket")
            .arg(agent.socket())
            .args([verb, "-f", &file])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = span.mul_f64((seed % 1000) as f64 / 800.0);
        std::thread::sleep(delay);
        agent.kill().unwrap();
        let _ = cli.wait();
        let journal = agent.state_dir().join("resources/journal");
        pending += usize::from(std::fs::read_dir(&journal).is_ok_and(|mut d| d.next().is_some()));
        agent.start().unwrap();
        // All or none once the repository has taken in what the agent restored; a part of
        // the file left in force stays, and fails here.
        let count = poll_for("all of the file or none in force", CONVERGE, || {
            let count = policies_in_force(&agent);
            (count == 0 || count == 150).then_some(count)
        })
        .unwrap_or_else(|e| {
            panic!(
                "round {round} ({verb} killed after {delay:?}): {} of 150 policies in force: {e}",
                policies_in_force(&agent)
            )
        });
        assert_eq!(
            temp_files(&agent.state_dir()),
            Vec::<PathBuf>::new(),
            "round {round}"
        );
        in_force = count == 150;
        rounds += 1;
        if in_force { all += 1 } else { none += 1 }
    }
    println!(
        "{rounds} kills during an apply or delete (each {span:?} long uninterrupted): all in force {all} times, none {none} times; a journal file was pending at {pending} kills"
    );
}

//! What a test process killed before its guards ran (SIGKILL, a CI job cancelled) leaves
//! behind, removed by the next test process: the agents and other programs it started on
//! its temporary directories `cel-<what>-<pid>-...` (killed), network namespaces
//! `cel-<pid>-<n>` and bpffs mounts in those directories, each named for the process that
//! made it, and removed only when that process is gone. A panicking test needs none of this:
//! its guards run as it unwinds.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

/// Sweeps once per process (the first [`crate::serial`] call).
pub(crate) fn sweep_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        orphans();
        namespaces();
        bpffs_mounts();
    });
}

/// The pid in a name `cel-<pid>-...` or `cel-<what>-<pid>-...`, if that process is gone.
fn dead_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("cel-")?;
    let pid = rest
        .split('-')
        .take(2)
        .find_map(|part| part.parse::<u32>().ok())?;
    let alive = Path::new("/proc").join(pid.to_string()).exists();
    (!alive).then_some(pid)
}

/// The top directory under the temporary directory that `path` is in, if any.
fn tmp_top(path: &Path) -> Option<String> {
    let rest = path.strip_prefix(std::env::temp_dir()).ok()?;
    Some(
        rest.components()
            .next()?
            .as_os_str()
            .to_string_lossy()
            .into_owned(),
    )
}

/// Kills the processes (an agent, an operator, etcd) whose arguments name a directory of an
/// exited test process: orphans that would hold ports and pins.
fn orphans() {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let owner = cmdline
            .split(|b| *b == 0)
            .filter_map(|arg| tmp_top(Path::new(&*String::from_utf8_lossy(arg))))
            .find_map(|top| dead_owner(&top));
        if let Some(owner) = owner {
            eprintln!("killing process {pid}, left by exited test process {owner}");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn namespaces() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = dead_owner(&name) {
            eprintln!("removing network namespace {name} of exited test process {pid}");
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &name])
                .status();
        }
    }
}

fn bpffs_mounts() {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(at), Some("bpf")) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        // `<tmp>/cel-bpf-<pid>-<n>`, or `<tmp>/cel-agent-<pid>-XXXX/bpf`.
        let at = PathBuf::from(at);
        let Some(top) = tmp_top(&at) else {
            continue;
        };
        if let Some(pid) = dead_owner(&top) {
            eprintln!(
                "unmounting bpffs {} of exited test process {pid}",
                at.display()
            );
            let _ = umount2(&at, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&top));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_read_from_both_name_shapes() {
        let me = std::process::id();
        assert_eq!(dead_owner(&format!("cel-{me}-3")), None, "alive");
        assert_eq!(dead_owner(&format!("cel-agent-{me}-x1y2")), None, "alive");
        // Above any pid the kernel hands out (pid_max is at most 2^22).
        assert_eq!(dead_owner("cel-99999999-0"), Some(99999999));
        assert_eq!(dead_owner("cel-agent-99999999-aB3dE"), Some(99999999));
        assert_eq!(dead_owner("cel-bpf-99999999-2"), Some(99999999));
        assert_eq!(dead_owner("cel-podman-x"), None);
        assert_eq!(dead_owner("other-99999999-0"), None);
    }
}

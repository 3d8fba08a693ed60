//! The state directory itself: locking, atomic writes, reads and listings.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use cellium_hive::{Config, Hook, Lifecycle, Reporter};
use nix::fcntl::{Flock, FlockArg};

use crate::config::StateDirConfig;
use crate::error::{Error, Result, io};

const LOCK_FILE: &str = "agent.lock";

/// Temp files are `.<name>.tmp` beside their target; nothing else in the directory is named so.
const TMP_PREFIX: &str = ".";
const TMP_SUFFIX: &str = ".tmp";

/// The agent's state directory.
///
/// Paths given to its methods are relative to the directory and may not leave it. Writes are
/// atomic: a reader (or an agent restarted after a crash) sees the old or the new content,
/// never a torn file. A write that fails leaves nothing behind, and the temp files of a writer
/// that was killed half-way are removed when the directory is opened (and locked) again.
#[derive(Debug)]
pub struct StateDir {
    root: PathBuf,
    lock: Mutex<Option<Flock<File>>>,
}

impl StateDir {
    /// Declares the directory; it is created and locked by the start hook, not here, so that
    /// describing or validating the agent touches nothing on disk.
    pub fn new(cfg: Config<StateDirConfig>, lc: Lifecycle, reporter: Reporter) -> Arc<StateDir> {
        let dir = Arc::new(StateDir {
            root: cfg.state_dir.clone(),
            lock: Mutex::new(None),
        });
        let (start, stop) = (dir.clone(), dir.clone());
        lc.append(
            Hook::new("lock-state-dir")
                .on_start(move |_| async move {
                    let swept = start.open()?;
                    reporter.ok(format!(
                        "{} locked; {swept} temp files of an interrupted write removed",
                        start.root.display()
                    ));
                    Ok(())
                })
                .on_stop(move |_| async move {
                    stop.release();
                    Ok(())
                }),
        );
        dir
    }

    /// Opens a state directory at `root` right away (for tools and tests outside a hive).
    pub fn open_at(root: impl Into<PathBuf>) -> Result<StateDir> {
        let dir = StateDir {
            root: root.into(),
            lock: Mutex::new(None),
        };
        dir.open()?;
        Ok(dir)
    }

    /// The directory's absolute path.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Writes `bytes` to `rel` atomically and durably (flushed to disk before it returns),
    /// creating parent directories.
    pub fn write(&self, rel: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        self.write_atomic(rel.as_ref(), bytes, true)
    }

    /// Writes `bytes` to `rel` atomically, but leaves flushing to the kernel: the new content
    /// is what any process, and an agent restarted after a crash, reads from the moment this
    /// returns; only a crash of the whole node can lose it.
    ///
    /// For records of things that do not outlive the node's kernel either (veth pairs, network
    /// namespaces, bpffs pins): after a reboot there is nothing left for such a record to
    /// describe, so flushing it (two fsyncs, milliseconds on a disk) would buy nothing. On the
    /// default state directory under `/run`, a tmpfs, both kinds of write cost the same.
    pub fn write_volatile(&self, rel: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        self.write_atomic(rel.as_ref(), bytes, false)
    }

    fn write_atomic(&self, rel: &Path, bytes: &[u8], durable: bool) -> Result<()> {
        let path = self.resolve(rel)?;
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        self.make_sub_dir(&parent)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = parent.join(format!("{TMP_PREFIX}{name}{TMP_SUFFIX}"));
        let written = write_file(&tmp, bytes, durable)
            .and_then(|()| fs::rename(&tmp, &path).map_err(io("rename into place", &path)));
        if let Err(e) = written {
            // A full or failing disk must not also collect half-written temp files; if even
            // the removal fails, the next start sweeps it.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if !durable {
            return Ok(());
        }
        // The rename is durable only once the directory entry itself is on disk.
        sync_dir(&parent)
    }

    /// Flushes file `rel` (written with [`write_volatile`](StateDir::write_volatile)) to disk.
    /// With [`sync_dir`](StateDir::sync_dir) of its directory, it then survives a crash of
    /// the node: many volatile writes then one flush each cost less than durable writes.
    pub fn sync_file(&self, rel: impl AsRef<Path>) -> Result<()> {
        let path = self.resolve(rel.as_ref())?;
        File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io("sync", &path))
    }

    /// Flushes directory `rel`'s entries to disk, so that the renames and removals done in it
    /// survive a crash of the node.
    pub fn sync_dir(&self, rel: impl AsRef<Path>) -> Result<()> {
        sync_dir(&self.resolve(rel.as_ref())?)
    }

    /// Reads `rel`, or `None` if it does not exist.
    pub fn read(&self, rel: impl AsRef<Path>) -> Result<Option<Vec<u8>>> {
        let path = self.resolve(rel.as_ref())?;
        let mut file = match no_follow().read(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", &path)(e)),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io("read", &path))?;
        Ok(Some(bytes))
    }

    /// Removes `rel`; removing what does not exist is not an error.
    pub fn remove(&self, rel: impl AsRef<Path>) -> Result<()> {
        let path = self.resolve(rel.as_ref())?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &path)(e)),
            _ => Ok(()),
        }
    }

    /// The names of the regular files directly in directory `rel` (sorted; temp files skipped).
    pub fn list(&self, rel: impl AsRef<Path>) -> Result<Vec<String>> {
        let dir = self.resolve(rel.as_ref())?;
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("list", &dir)(e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io("list", &dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if is_file && !name.starts_with('.') {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Creates and locks the directory, then removes the temp files a writer killed half-way
    /// left (none can be in use: the lock keeps every other agent out). Returns how many.
    fn open(&self) -> Result<usize> {
        make_dir(&self.root)?;
        let path = self.root.join(LOCK_FILE);
        let file = no_follow()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io("open", &path))?;
        let mut locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, _)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(Error::Locked {
                    dir: self.root.clone(),
                    holder: format!("pid {}", holder.trim()),
                });
            }
        };
        locked.set_len(0).map_err(io("truncate", &path))?;
        write!(locked, "{}", std::process::id()).map_err(io("write", &path))?;
        *self.lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(locked);
        let swept = sweep_temp_files(&self.root)?;
        tracing::info!(dir = %self.root.display(), swept, "state directory locked");
        Ok(swept)
    }

    /// Creates `dir`, a directory at or under the root, and checks that no directory between
    /// the root and it is a symbolic link: a link planted there would send the agent's writes
    /// (made as root) anywhere on the node. The root itself may be a link (`/var/run` is one).
    fn make_sub_dir(&self, dir: &Path) -> Result<()> {
        make_dir(dir)?;
        let mut at = self.root.clone();
        for part in dir.strip_prefix(&self.root).unwrap_or(Path::new("")) {
            at.push(part);
            let meta = fs::symlink_metadata(&at).map_err(io("inspect", &at))?;
            if !meta.is_dir() {
                return Err(Error::NotADirectory(at));
            }
        }
        Ok(())
    }

    fn release(&self) {
        // Dropping the Flock unlocks; the lock file stays so its pid helps a later diagnosis.
        self.lock.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn resolve(&self, rel: &Path) -> Result<PathBuf> {
        let plain = rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            return Err(Error::OutsidePath(rel.to_path_buf()));
        }
        Ok(self.root.join(rel))
    }
}

fn write_file(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let mut file = no_follow()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io("create", path))?;
    file.write_all(bytes).map_err(io("write", path))?;
    if durable {
        file.sync_all().map_err(io("sync", path))?;
    }
    Ok(())
}

fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", path))
}

/// Removes every `.<name>.tmp` under `dir`, descending into sub-directories; returns how many.
fn sweep_temp_files(dir: &Path) -> Result<usize> {
    let mut swept = 0;
    for entry in fs::read_dir(dir).map_err(io("list", dir))? {
        let entry = entry.map_err(io("list", dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io("inspect", &path))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if kind.is_dir() {
            swept += sweep_temp_files(&path)?;
        } else if kind.is_file() && name.starts_with(TMP_PREFIX) && name.ends_with(TMP_SUFFIX) {
            fs::remove_file(&path).map_err(io("remove", &path))?;
            tracing::warn!(file = %path.display(), "removed the temp file of an interrupted write");
            swept += 1;
        }
    }
    Ok(swept)
}

/// Options that refuse to open a symbolic link (`ELOOP`): every file the agent opens in the
/// state directory is its own, and one replaced by a link (to `/etc/shadow`, say) would have
/// the agent, as root, truncate, write or read whatever it points to.
fn no_follow() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.custom_flags(nix::libc::O_NOFOLLOW);
    options
}

fn make_dir(path: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io("create", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volatile_writes_replace_atomically_and_leave_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_at(tmp.path().join("state")).unwrap();
        dir.write_volatile("endpoints/7.json", b"{\"v\":1}")
            .unwrap();
        dir.write_volatile("endpoints/7.json", b"{\"v\":2}")
            .unwrap();
        assert_eq!(dir.read("endpoints/7.json").unwrap().unwrap(), b"{\"v\":2}");
        let names: Vec<_> = fs::read_dir(tmp.path().join("state/endpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["7.json"]);
        assert!(dir.write_volatile("../escape", b"x").is_err());
    }

    #[test]
    fn writes_are_read_back_and_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_at(tmp.path().join("state")).unwrap();
        dir.write("endpoints/1.json", b"{\"id\":1}").unwrap();
        dir.write("endpoints/2.json", b"{}").unwrap();
        dir.write("endpoints/1.json", b"{\"id\":1,\"v\":2}")
            .unwrap();
        assert_eq!(
            dir.read("endpoints/1.json").unwrap().unwrap(),
            b"{\"id\":1,\"v\":2}"
        );
        assert_eq!(dir.list("endpoints").unwrap(), vec!["1.json", "2.json"]);
        dir.remove("endpoints/2.json").unwrap();
        dir.remove("endpoints/2.json").unwrap();
        assert_eq!(dir.read("endpoints/2.json").unwrap(), None);
        assert_eq!(dir.list("nothing-here").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn paths_cannot_leave_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_at(tmp.path()).unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../b"] {
            let err = dir.write(bad, b"x").unwrap_err();
            assert!(matches!(err, Error::OutsidePath(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn temp_files_of_an_interrupted_write_are_removed_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        fs::create_dir_all(root.join("resources/journal")).unwrap();
        fs::write(root.join(".identities.json.tmp"), b"half").unwrap();
        fs::write(root.join("resources/journal/.7.json.tmp"), b"half").unwrap();
        fs::write(root.join("resources/kept.yaml"), b"whole").unwrap();
        let dir = StateDir::open_at(&root).unwrap();
        assert!(!root.join(".identities.json.tmp").exists());
        assert!(!root.join("resources/journal/.7.json.tmp").exists());
        assert_eq!(dir.read("resources/kept.yaml").unwrap().unwrap(), b"whole");
    }

    #[test]
    fn a_failed_write_leaves_no_temp_file_and_the_old_content() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_at(tmp.path()).unwrap();
        dir.write("a/x.json", b"old").unwrap();
        // The rename fails: a directory stands where the file would go.
        fs::create_dir(tmp.path().join("a/y.json")).unwrap();
        fs::write(tmp.path().join("a/y.json/inside"), b"").unwrap();
        let err = dir.write("a/y.json", b"new").unwrap_err();
        assert!(err.to_string().contains("a/y.json"), "{err}");
        assert_eq!(dir.list("a").unwrap(), vec!["x.json"]);
        let names: Vec<_> = fs::read_dir(tmp.path().join("a"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
        assert_eq!(dir.read("a/x.json").unwrap().unwrap(), b"old");
    }

    #[test]
    fn a_second_agent_cannot_take_the_same_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let _first = StateDir::open_at(tmp.path()).unwrap();
        let err = StateDir::open_at(tmp.path()).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Locked { .. }), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn links_planted_in_the_directory_are_never_followed() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, b"secret").unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let root = tmp.path().join("state");
        let dir = StateDir::open_at(&root).unwrap();

        // A temp file replaced by a link: the write fails and removes the link, whose target
        // is untouched; the next write goes through.
        symlink(&victim, root.join(".identities.json.tmp")).unwrap();
        assert!(dir.write("identities.json", b"{}").is_err());
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
        dir.write("identities.json", b"{}").unwrap();
        // A record replaced by a link: not read through; a write replaces the link itself.
        symlink(&victim, root.join("ipam.json")).unwrap();
        assert!(dir.read("ipam.json").is_err());
        dir.write("ipam.json", b"{}").unwrap();
        assert!(
            fs::symlink_metadata(root.join("ipam.json"))
                .unwrap()
                .is_file()
        );
        // A sub-directory replaced by a link: nothing is written through it.
        symlink(&outside, root.join("endpoints")).unwrap();
        let err = dir.write_volatile("endpoints/1.json", b"{}").unwrap_err();
        assert!(matches!(err, Error::NotADirectory(_)), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        dir.release();
        // The lock file replaced by a link: the directory is not opened, the target not truncated.
        fs::remove_file(root.join(LOCK_FILE)).unwrap();
        symlink(&victim, root.join(LOCK_FILE)).unwrap();
        assert!(StateDir::open_at(&root).is_err());
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
    }

    #[test]
    fn files_and_directories_are_the_agent_s_alone() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        let dir = StateDir::open_at(&root).unwrap();
        dir.write("endpoints/1.json", b"{}").unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root) & 0o077, 0, "{:o}", mode(&root));
        assert_eq!(mode(&root.join("endpoints")) & 0o077, 0);
        assert_eq!(mode(&root.join("endpoints/1.json")), 0o600);
        assert_eq!(mode(&root.join(LOCK_FILE)), 0o600);
    }
}

//! Reusing the programs an earlier agent loaded from the very same object.
//!
//! Loading the object runs the kernel's verifier over every program: hundreds of
//! milliseconds of CPU, most of what an agent's restart costs. After a load, each program is
//! pinned under `<bpf_root>/programs/<tag>/<name>`, the tag naming what decides the
//! programs' instructions: the object (a hash of its ELF bytes, taken at build time), the
//! map layout version and the libbpf that relocated it. An open that finds the directory of
//! its own tag takes the programs from there instead of loading them, when it can show they
//! are the ones a load would give: every program of the object is pinned there, and every
//! map they use is one of the maps pinned under `maps/` now (a map replaced since, by a
//! migration or by hand, means they are not). Anything else loads afresh and pins anew. A
//! reboot empties bpffs, so the kernel that verified them is always the running one.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::{MapCore, MapHandle, OpenObject};

use crate::abi::LAYOUT_VERSION;
use crate::{pinning, sys};

/// The build-time hash of the compiled object (`build.rs`).
const OBJECT_HASH: u64 = include!(concat!(env!("OUT_DIR"), "/object_hash.rs"));

/// Where the programs came from at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramOrigin {
    /// Taken from the pins of an earlier agent of this build: no verifier run.
    Reused,
    /// Loaded from the object (verified by the kernel).
    Loaded {
        /// Why the pinned ones were not taken.
        reason: String,
    },
}

impl std::fmt::Display for ProgramOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgramOrigin::Reused => f.write_str("reused"),
            ProgramOrigin::Loaded { reason } => write!(f, "loaded ({reason})"),
        }
    }
}

/// The maps and programs of a datapath, by name.
pub(crate) struct Parts {
    pub(crate) maps: BTreeMap<String, MapHandle>,
    pub(crate) progs: BTreeMap<String, OwnedFd>,
}

/// What decides the programs' instructions, as a directory name.
pub(crate) fn tag() -> String {
    let (major, minor) = sys::libbpf_version();
    // bpffs refuses names with a dot.
    format!("{OBJECT_HASH:016x}-layout{LAYOUT_VERSION}-libbpf{major}-{minor}")
}

/// The directory the programs of this build are pinned in.
pub(crate) fn pinned_dir(programs_dir: &Path) -> PathBuf {
    programs_dir.join(tag())
}

/// The pinned programs of this build with the pinned maps they use, if they can be
/// trusted to be what loading `object` would give; otherwise why not.
pub(crate) fn reuse(
    object: &OpenObject,
    programs_dir: &Path,
    maps_dir: &Path,
) -> Result<Parts, String> {
    let dir = pinned_dir(programs_dir);
    if !dir.is_dir() {
        return Err("no programs pinned by this build".into());
    }
    if let Some(v) = pinning::stale_layout_version(maps_dir) {
        return Err(format!("the pinned maps have layout version {v}"));
    }
    let mut maps = BTreeMap::new();
    let mut map_ids = BTreeSet::new();
    for map in object.maps() {
        let name = map.name().to_string_lossy().into_owned();
        let handle = MapHandle::from_pinned_path(maps_dir.join(&name))
            .map_err(|e| format!("map {name}: {e}"))?;
        if !pinning::same_shape(&map, &handle) {
            return Err(format!("map {name} is pinned with another shape"));
        }
        let info = handle.info().map_err(|e| format!("map {name}: {e}"))?;
        map_ids.insert(info.info.id);
        maps.insert(name, handle);
    }
    let mut progs = BTreeMap::new();
    for prog in object.progs() {
        let name = prog.name().to_string_lossy().into_owned();
        let fd = sys::obj_get(&dir.join(&name)).map_err(|e| format!("program {name}: {e}"))?;
        let used = sys::prog_map_ids(fd.as_fd()).map_err(|e| format!("program {name}: {e}"))?;
        if let Some(id) = used.iter().find(|id| !map_ids.contains(id)) {
            return Err(format!(
                "program {name} uses map id {id}, no longer pinned under {}",
                maps_dir.display()
            ));
        }
        progs.insert(name, fd);
    }
    Ok(Parts { maps, progs })
}

/// Pins `progs` as this build's programs, in place of any pinned before. A failure leaves
/// no directory under this build's tag, so the next open loads afresh.
pub(crate) fn pin(programs_dir: &Path, progs: &[(String, BorrowedFd<'_>)]) -> std::io::Result<()> {
    fs::create_dir_all(programs_dir)?;
    // Earlier builds' programs (still attached until replaced: their attachments hold
    // them, not these pins) and what an interrupted pinning left.
    for entry in fs::read_dir(programs_dir)? {
        remove_pinned(&entry?.path())?;
    }
    // Pinned aside first and renamed: the tag's directory, when there, is complete.
    let staging = programs_dir.join("staging");
    fs::create_dir(&staging)?;
    for (name, fd) in progs {
        sys::obj_pin(*fd, &staging.join(name))?;
    }
    fs::rename(&staging, pinned_dir(programs_dir))
}

/// Unpins a directory of programs, or one pin (bpffs has no recursive removal).
fn remove_pinned(dir: &Path) -> std::io::Result<()> {
    if !dir.is_dir() {
        return fs::remove_file(dir);
    }
    for entry in fs::read_dir(dir)? {
        fs::remove_file(entry?.path())?;
    }
    fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_names_the_object_layout_and_libbpf() {
        let tag = tag();
        assert!(tag.starts_with(&format!("{OBJECT_HASH:016x}-")), "{tag}");
        assert!(tag.contains(&format!("-layout{LAYOUT_VERSION}-")), "{tag}");
        assert!(tag.contains("-libbpf1-"), "{tag}");
        assert!(!tag.contains(['/', '.']), "{tag}");
    }
}

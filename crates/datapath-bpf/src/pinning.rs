//! Reusing pinned maps across agent restarts.
//!
//! Before load, every map of the object is compared with its pin under
//! `<bpf_root>/maps`: same type, key and value size, size limit and flags,
//! and the same layout version in `cel_config`, and libbpf reuses the pinned
//! map (conntrack, policy and services survive). A map whose only change is
//! its size limit or flags is recreated and its entries copied over
//! (migrated), as is one pinned by an earlier release whose layout this build knows how to
//! convert ([`crate::abi::releases`]): its entries are converted as they are copied. Any
//! other difference recreates it empty. Each is logged. Under another layout version the
//! endpoints' policy map pins (`cel_policy_<id>`) go too.

use std::fmt;
use std::fs;
use std::path::Path;

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType, OpenMap, OpenObject};

use crate::abi::LAYOUT_VERSION;
use crate::abi::releases::{self, Conversion};
use crate::error::{Error, Result};

/// What happened to one map at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapOrigin {
    /// The pinned map was reused with its contents.
    Reused,
    /// No pin existed: a new, empty map.
    Created,
    /// The pin was incompatible and replaced by an empty map.
    Recreated {
        /// What differed.
        reason: String,
    },
    /// The pin was replaced and its entries copied into the new map.
    Migrated {
        /// What differed.
        reason: String,
        /// Entries copied.
        entries: usize,
    },
}

impl fmt::Display for MapOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapOrigin::Reused => f.write_str("reused"),
            MapOrigin::Created => f.write_str("created"),
            MapOrigin::Recreated { reason } => write!(f, "recreated ({reason})"),
            MapOrigin::Migrated { reason, entries } => {
                write!(f, "migrated {entries} entries ({reason})")
            }
        }
    }
}

/// One map's fate at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapReport {
    /// The map name.
    pub name: String,
    /// What happened.
    pub origin: MapOrigin,
}

/// A map whose entries are copied into the new one after load.
pub(crate) struct Migration {
    pub(crate) name: String,
    pub(crate) old: MapHandle,
    pub(crate) reason: String,
    /// How each entry becomes this build's, when the old map is an earlier release's layout.
    pub(crate) conversion: Option<&'static Conversion>,
}

/// What [`prepare`] decided: a report per map, and the maps to copy after load.
pub(crate) struct Plan {
    pub(crate) reports: Vec<MapReport>,
    pub(crate) migrations: Vec<Migration>,
}

#[derive(Debug, PartialEq, Eq)]
struct Shape {
    ty: MapType,
    key: u32,
    value: u32,
    max: u32,
    flags: u32,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} key {} value {} max {} flags {:#x}",
            self.ty, self.key, self.value, self.max, self.flags
        )
    }
}

impl Shape {
    fn of_object(map: &OpenMap<'_>) -> Self {
        Shape {
            ty: map.map_type(),
            key: map.key_size(),
            value: map.value_size(),
            max: map.max_entries(),
            flags: map.map_flags(),
        }
    }

    fn of_pin(map: &MapHandle) -> Self {
        Shape {
            ty: map.map_type(),
            key: map.key_size(),
            value: map.value_size(),
            max: map.max_entries(),
            flags: map.info().map(|i| i.info.map_flags).unwrap_or(u32::MAX),
        }
    }
}

/// Whether the pinned `map` is what the object's `object_map` would create.
pub(crate) fn same_shape(object_map: &OpenMap<'_>, pinned: &MapHandle) -> bool {
    Shape::of_object(object_map) == Shape::of_pin(pinned)
}

/// A layout version other than this build's stored in the pinned `cel_config` under
/// `maps_dir`: its maps' entries are another layout's. A version of 0 is a config nobody
/// wrote yet: nothing to distrust.
pub(crate) fn stale_layout_version(maps_dir: &Path) -> Option<u32> {
    pinned_layout_version(&maps_dir.join("cel_config")).filter(|v| *v != 0 && *v != LAYOUT_VERSION)
}

/// The layout version stored in a pinned `cel_config`, if there is one.
fn pinned_layout_version(path: &Path) -> Option<u32> {
    let map = MapHandle::from_pinned_path(path).ok()?;
    let value = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).ok()??;
    // layout_version is the first field of every layout.
    let bytes: [u8; 4] = value.get(..4)?.try_into().ok()?;
    Some(u32::from_ne_bytes(bytes))
}

fn migratable(ty: MapType) -> bool {
    matches!(
        ty,
        MapType::Hash | MapType::LruHash | MapType::LpmTrie | MapType::Array
    )
}

/// Decides, for every map of `object`, whether to reuse its pin, and sets
/// the pin paths libbpf loads with.
pub(crate) fn prepare(object: &mut OpenObject, maps_dir: &Path) -> Result<Plan> {
    let stale_version = stale_layout_version(maps_dir);
    if stale_version.is_some() {
        remove_endpoint_policy_pins(maps_dir)?;
    }
    let mut plan = Plan {
        reports: Vec::new(),
        migrations: Vec::new(),
    };

    for mut map in object.maps_mut() {
        let name = map.name().to_string_lossy().into_owned();
        let path = maps_dir.join(&name);
        let wanted = Shape::of_object(&map);

        let origin = if path.exists() {
            let old = MapHandle::from_pinned_path(&path).map_err(|source| Error::OpenPinned {
                path: path.clone(),
                source,
            })?;
            let have = Shape::of_pin(&old);
            let origin = if let Some(v) = stale_version {
                MapOrigin::Recreated {
                    reason: format!("layout version {v}, this build has {LAYOUT_VERSION}"),
                }
            } else if have == wanted {
                MapOrigin::Reused
            } else if let Some((reason, conversion)) = migration(&name, &have, &wanted) {
                plan.migrations.push(Migration {
                    name: name.clone(),
                    old,
                    reason: reason.clone(),
                    conversion,
                });
                MapOrigin::Migrated { reason, entries: 0 }
            } else {
                MapOrigin::Recreated {
                    reason: format!("pinned {have}, object {wanted}"),
                }
            };
            if origin != MapOrigin::Reused {
                // The old map lives on for programs still attached to it
                // (and for the migration), but no longer under this name.
                fs::remove_file(&path).map_err(|source| Error::Unpin {
                    path: path.clone(),
                    source,
                })?;
            }
            origin
        } else {
            MapOrigin::Created
        };

        match &origin {
            MapOrigin::Reused => tracing::info!(map = %name, "reusing pinned map"),
            MapOrigin::Created => tracing::info!(map = %name, "creating map"),
            MapOrigin::Recreated { reason } => {
                tracing::warn!(map = %name, %reason, "recreating pinned map, its entries are lost")
            }
            MapOrigin::Migrated { reason, .. } => {
                tracing::warn!(map = %name, %reason, "recreating pinned map, migrating entries")
            }
        }
        map.set_pin_path(&path)
            .map_err(|source| Error::PreparePin {
                map: name.clone(),
                path: path.clone(),
                source,
            })?;
        plan.reports.push(MapReport { name, origin });
    }
    Ok(plan)
}

/// Whether a pinned map of shape `have` can be copied into the object's `wanted`, and why it
/// must be: the same layout under another size limit or flags, or an earlier release's layout
/// with its conversion.
fn migration(
    name: &str,
    have: &Shape,
    wanted: &Shape,
) -> Option<(String, Option<&'static Conversion>)> {
    if have.ty != wanted.ty || !migratable(have.ty) {
        return None;
    }
    let reason = format!("pinned {have}, object {wanted}");
    if have.key == wanted.key && have.value == wanted.value {
        return Some((reason, None));
    }
    let conversion = releases::conversion(name, have.key, have.value)?;
    Some((
        format!("{reason}: the layout of {}", conversion.release),
        Some(conversion),
    ))
}

/// Removes the pins of the endpoints' policy maps (`cel_policy_<id>`), which are no map of the
/// object: under another layout version their entries are another layout's, and the
/// endpoints' policies are written again at restore.
fn remove_endpoint_policy_pins(maps_dir: &Path) -> Result<()> {
    let prefix = format!("{}_", crate::maps::policy::NAME);
    let Ok(dir) = fs::read_dir(maps_dir) else {
        return Ok(());
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let path = entry.path();
            tracing::warn!(path = %path.display(), "removing an endpoint policy map of another layout");
            fs::remove_file(&path).map_err(|source| Error::Unpin { path, source })?;
        }
    }
    Ok(())
}

/// Copies every entry of the migration's old map into `new`, converted if it is an earlier
/// release's; returns how many were copied.
pub(crate) fn migrate(m: &Migration, new: &MapHandle) -> usize {
    let (name, old) = (&m.name, &m.old);
    let mut copied = 0;
    let mut failed = 0;
    for key in old.keys() {
        let Ok(Some(value)) = old.lookup(&key, MapFlags::ANY) else {
            continue;
        };
        let entry = match m.conversion {
            None => Some((key, value)),
            Some(c) => (c.convert)(&key, &value),
        };
        let Some((key, value)) = entry else {
            failed += 1;
            continue;
        };
        match new.update(&key, &value, MapFlags::ANY) {
            Ok(()) => copied += 1,
            Err(_) => failed += 1,
        }
    }
    if failed > 0 {
        tracing::warn!(map = %name, copied, failed, "some entries did not fit the new map");
    } else {
        tracing::info!(map = %name, copied, "migrated map entries");
    }
    copied
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keyed_maps_migrate() {
        assert!(migratable(MapType::LruHash));
        assert!(migratable(MapType::LpmTrie));
        assert!(!migratable(MapType::RingBuf));
        assert!(!migratable(MapType::PercpuArray));
    }

    #[test]
    fn origins_print_their_reason() {
        let o = MapOrigin::Migrated {
            reason: "max 1 vs 2".into(),
            entries: 3,
        };
        assert_eq!(o.to_string(), "migrated 3 entries (max 1 vs 2)");
    }
}

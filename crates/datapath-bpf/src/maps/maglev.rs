//! `cel_lb_maglev`: the maglev lookup tables of the frontends balanced by maglev, by rev-NAT
//! id (a HASH_OF_MAPS, as Cilium's `cilium_lb{4,6}_maglev`; rev-NAT ids are one space over
//! both families, so one map serves both). Each value is an inner ARRAY of `u32`: entry 0 is
//! the table size M, entries 1..=M the backend ids. The datapath takes entry
//! `1 + hash(5-tuple) % M` for a new connection; a frontend without a table is balanced at
//! random.
//!
//! A table is never written in place: [`MaglevTables::put`] fills a new inner map and swaps it
//! in with one update of the outer map, so a packet reads either the old table or the new
//! one, never a mix (the kernel frees the old one once no program run holds it).

use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use crate::error::{Error, Result};
use crate::maps::TypedMap;

/// The map's name.
pub const MAGLEV: &str = "cel_lb_maglev";

/// The inner maps' flags: `BPF_F_INNER_MAP`, which the template has too (so tables of any
/// size fit the one outer map).
const INNER_FLAGS: u32 = libbpf_sys::BPF_F_INNER_MAP;

/// The maglev tables.
#[derive(Debug)]
pub struct MaglevTables {
    outer: TypedMap<u16, u32>,
}

impl MaglevTables {
    pub(crate) fn new(outer: TypedMap<u16, u32>) -> Self {
        Self { outer }
    }

    /// Puts `table` (backend ids, M of them, M > 0) in force for the frontend of
    /// `rev_nat_id`, replacing its table whole.
    pub fn put(&self, rev_nat_id: u16, table: &[u32]) -> Result<()> {
        let m = u32::try_from(table.len())
            .ok()
            .filter(|m| *m > 0 && *m < u32::MAX)
            .ok_or_else(|| {
                Error::invalid(
                    format!("maglev table of rev-NAT id {rev_nat_id}"),
                    "its size must be between 1 and 2^32-2",
                )
            })?;
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
            map_flags: INNER_FLAGS,
            ..Default::default()
        };
        let inner = MapHandle::create(MapType::Array, Some("cel_maglev_tbl"), 4, 4, m + 1, &opts)
            .map_err(Error::map_op(MAGLEV, "create inner map"))?;
        let keys: Vec<u8> = (0..=m).flat_map(u32::to_ne_bytes).collect();
        let values: Vec<u8> = std::iter::once(m)
            .chain(table.iter().copied())
            .flat_map(u32::to_ne_bytes)
            .collect();
        inner
            .update_batch(&keys, &values, m + 1, MapFlags::ANY, MapFlags::ANY)
            .map_err(Error::map_op(MAGLEV, "fill inner map"))?;
        let fd = inner.as_fd().as_raw_fd();
        // The update takes its own reference: `inner` may close afterwards.
        self.outer.put(&rev_nat_id, &(fd as u32))
    }

    /// The table of `rev_nat_id`, if it has one.
    pub fn get(&self, rev_nat_id: u16) -> Result<Option<Vec<u32>>> {
        let Some(id) = self.outer.get(&rev_nat_id)? else {
            return Ok(None);
        };
        let inner = MapHandle::from_map_id(id).map_err(Error::map_op(MAGLEV, "open inner map"))?;
        let read = |key: u32| -> Result<u32> {
            let raw = inner
                .lookup(&key.to_ne_bytes(), MapFlags::ANY)
                .map_err(Error::map_op(MAGLEV, "lookup inner map"))?
                .unwrap_or_default();
            raw.get(..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
                .ok_or(Error::Layout {
                    map: MAGLEV,
                    len: raw.len(),
                    expected: 4,
                })
        };
        let m = read(0)?;
        (1..=m).map(read).collect::<Result<Vec<_>>>().map(Some)
    }

    /// Removes the table of `rev_nat_id`: its frontend is balanced at random again (or gone).
    /// Returns whether it had one.
    pub fn delete(&self, rev_nat_id: u16) -> Result<bool> {
        self.outer.delete(&rev_nat_id)
    }

    /// The rev-NAT ids that have a table.
    pub fn ids(&self) -> Result<BTreeSet<u16>> {
        Ok(self.outer.keys()?.into_iter().collect())
    }
}

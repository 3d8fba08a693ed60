//! Reading a whole map in batches (`BPF_MAP_LOOKUP_BATCH`): a few hundred entries a
//! syscall, where the walk by `get_next_key` and `lookup` costs two syscalls an entry.
//! At a restart the service takeover reads thousands of entries this way.
//!
//! libbpf-rs's `lookup_batch` iterator ends quietly on any error (a refused batch looks like
//! an empty map, a failure half-way like the end), so the loop here calls libbpf directly
//! and tells the three apart.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::{MapCore, MapHandle};
use nix::errno::Errno;

use crate::error::{Error, Result};

/// How many entries one batch asks for: 16 to 32 KiB of keys and values for the LB maps.
pub const BATCH_ENTRIES: u32 = 512;

/// The kernel's `ENOTSUPP` (not in libc): a map type without batch operations.
const ENOTSUPP: i32 = 524;

/// How a map was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// In batches of at most [`BATCH_ENTRIES`].
    Batched,
    /// An entry at a time: the kernel or the map type has no batched lookup.
    EntryAtATime,
}

/// Calls `each(key, value)` for every entry of `map` (`name` for errors), in batches where
/// the kernel can, else an entry at a time. Entries the datapath adds or removes during the
/// read may or may not be seen; of a map nothing else changes, every entry is seen once.
pub fn for_each_entry(
    map: &MapHandle,
    name: &'static str,
    mut each: impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<ReadMode> {
    // Per-CPU values come one per CPU, in another layout than `value_size`: not read here
    // in batches (no typed map of the datapath is per-CPU and read whole).
    if map.map_type().is_percpu() {
        walk(map, name, &mut each)?;
        return Ok(ReadMode::EntryAtATime);
    }
    match batched(map, name, &mut each)? {
        Some(()) => Ok(ReadMode::Batched),
        None => {
            walk(map, name, &mut each)?;
            Ok(ReadMode::EntryAtATime)
        }
    }
}

/// The batched read; `None` when the first batch is refused (`EINVAL` from a kernel without
/// the command, before 5.6; `ENOTSUPP`/`EOPNOTSUPP` from a map type without it, such as the
/// device map, or the LPM trie before 6.x): nothing was passed to `each` then, and the
/// caller walks instead.
fn batched(
    map: &MapHandle,
    name: &'static str,
    each: &mut impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<Option<()>> {
    let key_size = map.key_size() as usize;
    let value_size = map.value_size() as usize;
    // The position between batches: a bucket index (u32) for hash maps, a key for arrays.
    let token_size = key_size.max(size_of::<u32>());
    let mut want = BATCH_ENTRIES;
    let mut keys = vec![0u8; want as usize * key_size];
    let mut values = vec![0u8; want as usize * value_size];
    let mut in_token: Option<Vec<u8>> = None;
    let mut out_token = vec![0u8; token_size];
    let opts = libbpf_sys::bpf_map_batch_opts {
        sz: size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
        ..Default::default()
    };
    loop {
        let mut count = want;
        let in_ptr = in_token
            .as_mut()
            .map_or(std::ptr::null_mut(), |t| t.as_mut_ptr().cast());
        // SAFETY: `keys` and `values` hold `count` keys and values of the map's sizes, both
        // tokens `token_size` bytes (what the kernel reads and writes for this map type),
        // `opts` is initialised with its size, and the fd is borrowed from `map` for the call.
        let ret = unsafe {
            libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                in_ptr,
                out_token.as_mut_ptr().cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        let errno = if ret < 0 { -ret } else { 0 };
        // ENOENT: the last batch (`count` entries, maybe none).
        let last = errno == Errno::ENOENT as i32;
        if errno == 0 || last {
            let n = (count as usize).min(want as usize);
            for i in 0..n {
                each(
                    &keys[i * key_size..(i + 1) * key_size],
                    &values[i * value_size..(i + 1) * value_size],
                )?;
            }
            if last {
                return Ok(Some(()));
            }
            in_token = Some(out_token.clone());
            continue;
        }
        let max = map.max_entries().max(1);
        if errno == Errno::ENOSPC as i32 && want < max {
            // One hash bucket holds more entries than a batch: ask again for more.
            want = (want * 2).min(max);
            keys.resize(want as usize * key_size, 0);
            values.resize(want as usize * value_size, 0);
        } else if errno == Errno::EINTR as i32 {
            // Asked again from the same position.
        } else if in_token.is_none()
            && [Errno::EINVAL as i32, Errno::EOPNOTSUPP as i32, ENOTSUPP].contains(&errno)
        {
            return Ok(None);
        } else {
            return Err(Error::map_op(name, "lookup batch")(
                libbpf_rs::Error::from_raw_os_error(errno),
            ));
        }
    }
}

/// The walk by key: `get_next_key`, then a lookup of each key (an entry deleted between the
/// two is skipped).
fn walk(
    map: &MapHandle,
    name: &'static str,
    each: &mut impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<()> {
    for key in map.keys() {
        let value = map
            .lookup(&key, libbpf_rs::MapFlags::ANY)
            .map_err(Error::map_op(name, "lookup"))?;
        if let Some(value) = value {
            each(&key, &value)?;
        }
    }
    Ok(())
}

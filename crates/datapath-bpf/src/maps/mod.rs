//! Typed wrappers over the pinned datapath maps: one file per map, each
//! taking and returning Rust types (addresses, enums, ports in host order).

pub mod affinity;
pub mod batch;
pub mod config;
pub mod conntrack;
pub mod endpoints;
pub mod frag;
pub mod ipcache;
pub mod ipmasq;
pub mod lb;
pub mod maglev;
pub mod metrics;
pub mod policy;
pub mod snat;
pub mod source_range;

use std::marker::PhantomData;

use libbpf_rs::{MapCore, MapFlags, MapHandle};

use crate::abi::Plain;
use crate::error::{Error, Result};

/// A map with a Rust key and value type; the kernel object is shared with
/// the programs and outlives this process through its pin.
#[derive(Debug)]
pub(crate) struct TypedMap<K, V> {
    name: &'static str,
    handle: MapHandle,
    _types: PhantomData<fn(K, V)>,
}

impl<K: Plain, V: Plain> TypedMap<K, V> {
    pub(crate) fn new(name: &'static str, handle: MapHandle) -> Self {
        Self {
            name,
            handle,
            _types: PhantomData,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn handle(&self) -> &MapHandle {
        &self.handle
    }

    pub(crate) fn handle_mut(&mut self) -> &mut MapHandle {
        &mut self.handle
    }

    pub(crate) fn get(&self, key: &K) -> Result<Option<V>> {
        let raw = self
            .handle
            .lookup(&key.encode(), MapFlags::ANY)
            .map_err(Error::map_op(self.name, "lookup"))?;
        raw.map(|bytes| self.decode_value(&bytes)).transpose()
    }

    pub(crate) fn put(&self, key: &K, value: &V) -> Result<()> {
        self.handle
            .update(&key.encode(), &value.encode(), MapFlags::ANY)
            .map_err(Error::map_op(self.name, "update"))
    }

    /// Deletes `key`; returns whether it existed.
    pub(crate) fn delete(&self, key: &K) -> Result<bool> {
        match self.handle.delete(&key.encode()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::map_op(self.name, "delete")(e)),
        }
    }

    /// Every entry, read in batches where the kernel can ([`batch`]). Concurrent datapath
    /// updates may add or remove entries during the read; each returned pair was present
    /// when read.
    pub(crate) fn entries(&self) -> Result<Vec<(K, V)>> {
        let mut out = Vec::new();
        batch::for_each_entry(&self.handle, self.name, |key, value| {
            let key = K::decode(key).ok_or(Error::Layout {
                map: self.name,
                len: key.len(),
                expected: K::SIZE,
            })?;
            out.push((key, self.decode_value(value)?));
            Ok(())
        })?;
        Ok(out)
    }

    /// Every key, without reading values: the walk to use before deleting,
    /// since deleting the key a walk stands on restarts it from the start.
    pub(crate) fn keys(&self) -> Result<Vec<K>> {
        self.handle
            .keys()
            .map(|raw| {
                K::decode(&raw).ok_or(Error::Layout {
                    map: self.name,
                    len: raw.len(),
                    expected: K::SIZE,
                })
            })
            .collect()
    }

    fn decode_value(&self, bytes: &[u8]) -> Result<V> {
        V::decode(bytes).ok_or(Error::Layout {
            map: self.name,
            len: bytes.len(),
            expected: V::SIZE,
        })
    }
}

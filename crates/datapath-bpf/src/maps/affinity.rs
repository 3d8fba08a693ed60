//! Session affinity maps. `cel_lb4_affinity` / `cel_lb6_affinity` (LRU, written by the
//! datapath: a client's last choice per frontend) are only read here; `cel_lb_affinity_match`
//! is the agent's: which backends each frontend with session affinity has, so that a client's
//! remembered backend that left the frontend is not chosen again through it.

use std::collections::BTreeSet;

use crate::abi::LbAffinityMatch;
use crate::error::Result;
use crate::maps::TypedMap;

/// The match map's name.
pub const AFFINITY_MATCH: &str = "cel_lb_affinity_match";

/// `cel_lb_affinity_match`.
#[derive(Debug)]
pub struct AffinityMatch {
    map: TypedMap<LbAffinityMatch, u8>,
}

fn key(rev_nat_id: u16, backend_id: u32) -> LbAffinityMatch {
    LbAffinityMatch {
        backend_id,
        rev_nat_id,
        pad: 0,
    }
}

impl AffinityMatch {
    pub(crate) fn new(map: TypedMap<LbAffinityMatch, u8>) -> Self {
        Self { map }
    }

    /// Lists `backend_id` as a backend of the frontend `rev_nat_id`.
    pub fn put(&self, rev_nat_id: u16, backend_id: u32) -> Result<()> {
        self.map.put(&key(rev_nat_id, backend_id), &1)
    }

    /// Removes that pair; returns whether it was there.
    pub fn delete(&self, rev_nat_id: u16, backend_id: u32) -> Result<bool> {
        self.map.delete(&key(rev_nat_id, backend_id))
    }

    /// Every (rev-NAT id, backend id) pair listed (read in batches: the value says nothing,
    /// but a batch costs less than a syscall a key).
    pub fn entries(&self) -> Result<BTreeSet<(u16, u32)>> {
        Ok(self
            .map
            .entries()?
            .into_iter()
            .map(|(k, _)| (k.rev_nat_id, k.backend_id))
            .collect())
    }
}

//! Backend ids and rev-NAT ids: stable while their backend or frontend exists, adopted from
//! the pinned maps at start.
//!
//! Both ids are remembered by the datapath's connections: a service conntrack entry holds its
//! backend's id, every translated connection its frontend's rev-NAT id. So a backend keeps its
//! id as long as it is a backend of any frontend (backends are shared by address, port and
//! protocol, as Cilium shares them), a frontend keeps its rev-NAT id as long as it exists, and
//! after a restart both are taken over from what the maps hold, so established connections
//! keep their backend and their replies keep their cluster IP. New ids are taken round-robin
//! after the last one, so an id freed a moment ago (which connections may still carry) is the
//! last to be handed out again.

use std::collections::{BTreeMap, HashMap};

use cellium_datapath_bpf::{Backend, Frontend};

/// How many entries the backends maps hold at most (`cel_lb4_backends` and
/// `cel_lb6_backends`, 65536 each).
const BACKENDS_CAPACITY: usize = 2 * 65536;

/// The ids in use.
#[derive(Debug, Default)]
pub struct Ids {
    backends: HashMap<Backend, u32>,
    last_backend: u32,
    rev_nats: BTreeMap<Frontend, u16>,
    last_rev_nat: u16,
}

impl Ids {
    /// Takes over the ids the pinned maps hold: every backend (a backend listed twice keeps
    /// its lowest id; the others are left to be removed as stale) and every frontend's rev-NAT
    /// id.
    pub fn adopt(
        &mut self,
        backends: impl IntoIterator<Item = (u32, Backend)>,
        frontends: impl IntoIterator<Item = (Frontend, u16)>,
    ) {
        for (id, backend) in backends {
            let kept = self.backends.entry(backend).or_insert(id);
            *kept = (*kept).min(id);
            self.last_backend = self.last_backend.max(id);
        }
        for (frontend, id) in frontends {
            self.rev_nats.insert(frontend, id);
            self.last_rev_nat = self.last_rev_nat.max(id);
        }
    }

    /// The id of `backend`, if it has one.
    #[cfg(test)]
    pub fn backend(&self, backend: &Backend) -> Option<u32> {
        self.backends.get(backend).copied()
    }

    /// The id of `backend`, taking the next free one (not held here, not `taken`) when it
    /// has none; `None` when every id is in use.
    pub fn backend_or_new(&mut self, backend: Backend, taken: impl Fn(u32) -> bool) -> Option<u32> {
        if let Some(id) = self.backends.get(&backend) {
            return Some(*id);
        }
        let used: std::collections::HashSet<u32> = self.backends.values().copied().collect();
        let mut candidate = self.last_backend;
        // `taken` is what the backends maps hold besides these: at most their capacity, so
        // this many candidates always include a free one unless something is badly wrong.
        for _ in 0..used.len() + 2 * BACKENDS_CAPACITY {
            candidate = candidate.checked_add(1).unwrap_or(1);
            if !used.contains(&candidate) && !taken(candidate) {
                self.backends.insert(backend, candidate);
                self.last_backend = candidate;
                return Some(candidate);
            }
        }
        None
    }

    /// Forgets the backends not in `keep` (their entries were removed from the map).
    pub fn retain_backends(&mut self, keep: impl Fn(&Backend, u32) -> bool) {
        self.backends.retain(|b, id| keep(b, *id));
    }

    /// The rev-NAT id of `frontend`, if it has one.
    pub fn rev_nat(&self, frontend: &Frontend) -> Option<u16> {
        self.rev_nats.get(frontend).copied()
    }

    /// The rev-NAT id of `frontend`, taking the next free one (not held here, not `taken`)
    /// when it has none; `None` when all 65535 are in use.
    pub fn rev_nat_or_new(
        &mut self,
        frontend: Frontend,
        taken: impl Fn(u16) -> bool,
    ) -> Option<u16> {
        if let Some(id) = self.rev_nats.get(&frontend) {
            return Some(*id);
        }
        let used: std::collections::HashSet<u16> = self.rev_nats.values().copied().collect();
        let mut candidate = self.last_rev_nat;
        for _ in 0..u16::MAX {
            candidate = candidate.checked_add(1).unwrap_or(1);
            if !used.contains(&candidate) && !taken(candidate) {
                self.rev_nats.insert(frontend, candidate);
                self.last_rev_nat = candidate;
                return Some(candidate);
            }
        }
        None
    }

    /// Forgets a frontend's rev-NAT id, returning it (its map entry stays until no
    /// connection uses it).
    pub fn release_rev_nat(&mut self, frontend: &Frontend) -> Option<u16> {
        self.rev_nats.remove(frontend)
    }

    /// The frontends that hold a rev-NAT id.
    pub fn frontends(&self) -> Vec<Frontend> {
        self.rev_nats.keys().copied().collect()
    }

    /// Whether `id` is some frontend's rev-NAT id.
    pub fn rev_nat_in_use(&self, id: u16) -> bool {
        self.rev_nats.values().any(|v| *v == id)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use cellium_datapath_bpf::Protocol;

    use super::*;

    fn be(last: u8, port: u16) -> Backend {
        Backend {
            addr: Ipv4Addr::new(10, 244, 0, last).into(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn fe(port: u16) -> Frontend {
        Frontend {
            vip: Ipv4Addr::new(10, 96, 0, 10).into(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    #[test]
    fn adopted_ids_are_kept_and_new_ones_follow_them() {
        let mut ids = Ids::default();
        ids.adopt(
            [(7, be(1, 80)), (3, be(2, 80)), (9, be(1, 80))],
            [(fe(80), 4), (fe(81), 2)],
        );
        assert_eq!(ids.backend(&be(1, 80)), Some(7));
        assert_eq!(ids.backend_or_new(be(2, 80), |_| false), Some(3));
        // After the highest id seen (9, even though its duplicate lost), skipping taken ones.
        assert_eq!(ids.backend_or_new(be(3, 80), |id| id == 10), Some(11));
        assert_eq!(ids.rev_nat(&fe(80)), Some(4));
        assert_eq!(ids.rev_nat_or_new(fe(82), |_| false), Some(5));
    }

    #[test]
    fn freed_ids_are_not_reused_at_once() {
        let mut ids = Ids::default();
        let a = ids.rev_nat_or_new(fe(1), |_| false).unwrap();
        let b = ids.rev_nat_or_new(fe(2), |_| false).unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(ids.release_rev_nat(&fe(1)), Some(1));
        assert!(!ids.rev_nat_in_use(1) && ids.rev_nat_in_use(2));
        assert_eq!(ids.rev_nat_or_new(fe(3), |_| false), Some(3));
        let x = ids.backend_or_new(be(1, 1), |_| false).unwrap();
        ids.retain_backends(|_, id| id != x);
        assert_eq!(ids.backend(&be(1, 1)), None);
        assert_eq!(ids.backend_or_new(be(1, 1), |_| false), Some(x + 1));
    }

    #[test]
    fn rev_nat_ids_wrap_and_run_out() {
        let mut ids = Ids::default();
        ids.adopt([], [(fe(1), u16::MAX)]);
        // Wraps to 1, skipping 0 (which means "no translation") and what is taken.
        assert_eq!(ids.rev_nat_or_new(fe(2), |id| id == 1), Some(2));
        let mut full = Ids::default();
        assert_eq!(full.rev_nat_or_new(fe(2), |_| true), None);
    }
}

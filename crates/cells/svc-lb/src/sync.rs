//! Writing the plans into the datapath's load-balancing maps, and removing what is stale.
//!
//! A pass compares each plan with what the maps hold and writes only what differs: new
//! backends first (a slot must never name a backend that does not exist), then the frontend
//! (`Services::put_service` writes its rev-NAT entry, its slots, then the slot count, so the
//! datapath never picks a missing slot). Only then are frontends that no plan wants removed,
//! and after them the backends no frontend uses any more (a connection pinned to a removed
//! backend chooses again). A draining backend (terminating, not ready) is written but in no
//! slot: connections pinned to it keep it, new ones never choose it. A frontend that fails keeps what the maps hold for it, and so do
//! its backends. A removed frontend's rev-NAT entry stays until no connection carries its id
//! ([`Programmer::collect_rev_nats`]): replies of connections still open are translated to the
//! address their client knows until they end.
//!
//! A frontend balanced by maglev also gets its lookup table, after its slots (its backends
//! exist by then) and before stale backends go (the table in force never names a removed
//! one). A table is computed and written only when the frontend's backends or the table size
//! changed since it was written by this agent (after a restart, once, by the first pass: the
//! same backends give the same table, so no connection moves). Tables of frontends removed,
//! or no longer balanced by maglev, are removed with the stale entries.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};

use cellium_datapath_bpf::{Backend, Datapath, Frontend, IpNet, ServiceEntry, ktime_now_ns};
use cellium_resources::LbAlgorithm;

use crate::config::MaglevTableSize;
use crate::desired::{Plan, PlannedBackend};
use crate::error::{Error, Result};
use crate::ids::Ids;
use crate::maglev;
pub use cellium_hive::error_chain;

/// A frontend as the last pass left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendStatus {
    /// What was planned.
    pub plan: Plan,
    /// Its rev-NAT id; 0 when it never was programmed.
    pub rev_nat_id: u16,
    /// The backends' ids, in the order of `plan.backends`; empty when not programmed.
    pub backend_ids: Vec<u32>,
    /// The draining backends' ids, in the order of `plan.draining`.
    pub draining_ids: Vec<u32>,
    /// Why it is not programmed as planned.
    pub error: Option<String>,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Frontends programmed as planned.
    pub programmed: usize,
    /// Frontends that could not be, with why.
    pub failed: Vec<String>,
    /// Frontends left out because the datapath does not do what they ask (`Plan::unsupported`),
    /// with why: reported, not a fault.
    pub unsupported: Vec<String>,
    /// Frontends written (new or changed).
    pub written: usize,
    /// Stale frontends removed.
    pub removed_frontends: usize,
    /// Stale backends removed.
    pub removed_backends: usize,
    /// Failures removing stale entries (retried by the next pass).
    pub removal_errors: Vec<String>,
}

/// What programming one plan did.
struct Programmed {
    rev_nat_id: u16,
    backend_ids: Vec<u32>,
    draining_ids: Vec<u32>,
    /// Whether the frontend was written.
    written: bool,
}

/// Programs plans into a datapath and remembers what it needs for the next pass: the ids, the
/// rev-NAT ids waiting to be collected, the last statuses. [`ServiceLb`](crate::ServiceLb)
/// holds one; tools and tests can drive one directly.
#[derive(Debug, Default)]
pub struct Programmer {
    ids: Ids,
    /// Rev-NAT ids of removed frontends whose map entries are still there.
    released: BTreeSet<u16>,
    status: Vec<FrontendStatus>,
    /// `bpf-lb-maglev-table-size`.
    maglev_size: MaglevTableSize,
    /// What each maglev table in force was computed from.
    tables: BTreeMap<Frontend, TableSource>,
    /// During a pass: the (rev-NAT id, backend id) pairs of the affinity match map, as read
    /// at its start and written since, and those the frontends with affinity want.
    matches_in_map: BTreeSet<(u16, u32)>,
    matches_wanted: BTreeSet<(u16, u32)>,
    /// During a pass: the (rev-NAT id, client prefix) entries of the source range maps, as
    /// read at its start and written since, and those the frontends want.
    ranges_in_map: BTreeSet<(u16, IpNet)>,
    ranges_wanted: BTreeSet<(u16, IpNet)>,
    /// What [`adopt`](Programmer::adopt) read, for the pass that follows it: at a restart
    /// with thousands of services, reading the maps twice in a row is a good part of the
    /// takeover.
    adopted: Option<Pinned>,
    /// Whether [`adopt`](Programmer::adopt) has succeeded once.
    taken_over: bool,
}

/// What the pinned load-balancing maps hold, read at the start of a pass (in batches: three
/// reads of each family's maps, not a lookup per frontend, slot or rev-NAT id).
struct Pinned {
    backends: BTreeMap<u32, Backend>,
    frontends: BTreeMap<Frontend, ServiceEntry>,
    rev_nats: BTreeMap<u16, (IpAddr, u16)>,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("backends", &self.backends.len())
            .field("frontends", &self.frontends.len())
            .field("rev_nats", &self.rev_nats.len())
            .finish()
    }
}

/// What a maglev table is computed from: equal sources give equal tables.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TableSource {
    rev_nat_id: u16,
    size: u32,
    /// Each backend's name (`address:port`) and id.
    members: Vec<(String, u32)>,
}

impl Programmer {
    /// A programmer whose maglev tables have `size` entries.
    pub fn with_maglev_table_size(size: MaglevTableSize) -> Programmer {
        Programmer {
            maglev_size: size,
            ..Programmer::default()
        }
    }

    /// Takes over the ids the pinned maps hold, so established connections keep their
    /// backends and reverse translation; rev-NAT entries no frontend holds (frontends removed
    /// before a restart) are handed to the collector. Returns (frontends, backends, lingering
    /// rev-NAT entries) found. The next [`sync`](Programmer::sync) starts from what this read
    /// instead of reading the maps again: nothing may write them in between.
    pub fn adopt(&mut self, dp: &Datapath) -> Result<(usize, usize, usize)> {
        let pinned = read_pinned(dp)?;
        let counts = (pinned.frontends.len(), pinned.backends.len());
        self.ids.adopt(
            pinned.backends.iter().map(|(id, b)| (*id, *b)),
            pinned.frontends.iter().map(|(fe, s)| (*fe, s.rev_nat_id)),
        );
        let held: HashSet<u16> = pinned.frontends.values().map(|s| s.rev_nat_id).collect();
        self.released
            .extend(pinned.rev_nats.keys().filter(|id| !held.contains(id)));
        self.adopted = Some(pinned);
        self.taken_over = true;
        Ok((counts.0, counts.1, self.released.len()))
    }

    /// Whether [`adopt`](Programmer::adopt) has succeeded once.
    pub fn taken_over(&self) -> bool {
        self.taken_over
    }

    /// The statuses of the last pass, ordered as the plans.
    pub fn status(&self) -> Vec<FrontendStatus> {
        self.status.clone()
    }

    /// One pass: programs every plan, then removes stale frontends and backends.
    pub fn sync(&mut self, dp: &Datapath, plans: Vec<Plan>) -> Result<SyncReport> {
        let pinned = match self.adopted.take() {
            Some(adopted) => adopted,
            None => read_pinned(dp)?,
        };
        self.matches_in_map = dp
            .affinity_match()
            .entries()
            .map_err(read("affinity match map"))?;
        self.matches_wanted.clear();
        self.ranges_in_map = dp
            .source_ranges()
            .entries()
            .map_err(read("source range maps"))?;
        self.ranges_wanted.clear();
        let mut report = SyncReport::default();
        let wanted: BTreeSet<Frontend> = plans.iter().map(|p| p.frontend).collect();
        let mut status = Vec::with_capacity(plans.len());
        for plan in plans {
            match self.program(dp, &plan, &pinned) {
                Ok(Programmed {
                    rev_nat_id,
                    backend_ids,
                    draining_ids,
                    written,
                }) => {
                    report.programmed += 1;
                    report.written += usize::from(written);
                    status.push(FrontendStatus {
                        plan,
                        rev_nat_id,
                        backend_ids,
                        draining_ids,
                        error: None,
                    });
                }
                Err(e) => {
                    self.keep_matches(&plan.frontend);
                    self.keep_ranges(&plan.frontend);
                    let message = error_chain(&e);
                    tracing::warn!(frontend = %plan.describe(), error = %message, "frontend not programmed");
                    if plan.unsupported {
                        report.unsupported.push(message.clone());
                    } else {
                        report.failed.push(message.clone());
                    }
                    status.push(FrontendStatus {
                        rev_nat_id: self.ids.rev_nat(&plan.frontend).unwrap_or(0),
                        plan,
                        backend_ids: Vec::new(),
                        draining_ids: Vec::new(),
                        error: Some(message),
                    });
                }
            }
        }
        self.status = status;
        self.remove_stale(dp, &wanted, &pinned.frontends, &mut report)?;
        Ok(report)
    }

    /// Writes one plan's backends (draining ones too) and frontend where the maps differ.
    fn program(&mut self, dp: &Datapath, plan: &Plan, pinned: &Pinned) -> Result<Programmed> {
        let backends = &pinned.backends;
        let lb = dp.services();
        let describe = || plan.describe();
        if let Some(reason) = &plan.error {
            return Err(Error::Unprogrammable {
                frontend: describe(),
                reason: reason.clone(),
            });
        }
        let write_err = |source| Error::Program {
            frontend: describe(),
            source,
        };
        let mut write_backends = |planned: &[crate::desired::PlannedBackend]| {
            let mut ids = Vec::with_capacity(planned.len());
            for b in planned {
                // An id the map holds for another backend (a duplicate adopted at start,
                // about to be removed) is not reused in the same pass.
                let id = self
                    .ids
                    .backend_or_new(b.backend, |id| backends.contains_key(&id))
                    .ok_or_else(|| Error::BackendIdsExhausted(describe()))?;
                if backends.get(&id) != Some(&b.backend) {
                    lb.put_backend(id, &b.backend).map_err(write_err)?;
                }
                ids.push(id);
            }
            Ok::<_, Error>(ids)
        };
        let ids = write_backends(&plan.backends)?;
        let draining_ids = write_backends(&plan.draining)?;
        let Programmer {
            ids: table,
            released,
            ..
        } = self;
        let rev_nat_id = table
            .rev_nat_or_new(plan.frontend, |id| {
                // Taken: waiting for collection, or (checked last: a map lookup) present.
                released.contains(&id) || lb.rev_nat(id).ok().flatten().is_some()
            })
            .ok_or_else(|| Error::RevNatExhausted(describe()))?;
        let mut slots = ids.clone();
        slots.sort_unstable();
        let table_written = self.program_table(dp, plan, rev_nat_id, &ids)?;
        let current = pinned.frontends.get(&plan.frontend);
        let affinity = plan.session_affinity.unwrap_or(0);
        // put_service keeps slot 0's timeout: what the map holds until set otherwise.
        let stored_affinity = current.map_or(0, |c| c.affinity_timeout);
        let flags = plan.flags();
        // Before the flag is set: a frontend restricted anew admits its clients at once.
        self.program_ranges(dp, plan, rev_nat_id)?;
        // The rev-NAT entry as read at the start of the pass: only this frontend writes its
        // id's entry, so nothing in the pass has changed it before this point.
        let same = current.is_some_and(|c| {
            c.rev_nat_id == rev_nat_id
                && c.backend_ids == slots
                && c.affinity_timeout == affinity
                && c.flags == flags
        }) && pinned.rev_nats.get(&rev_nat_id)
            == Some(&(plan.frontend.vip, plan.frontend.port));
        if !same {
            lb.put_service_with(&plan.frontend, rev_nat_id, &slots, flags)
                .map_err(write_err)?;
            self.program_affinity(dp, plan, rev_nat_id, &ids, stored_affinity)?;
            tracing::info!(
                frontend = %plan.describe(),
                rev_nat_id,
                backends = slots.len(),
                "frontend programmed"
            );
        }
        if same {
            // Nothing to write, but the pairs are wanted (or the sweep would remove them).
            self.program_affinity(dp, plan, rev_nat_id, &ids, stored_affinity)?;
        }
        Ok(Programmed {
            rev_nat_id,
            backend_ids: ids,
            draining_ids,
            written: !same || table_written,
        })
    }

    /// Session affinity: lists the frontend's backends in the affinity match map (before its
    /// timeout is set, so a remembered backend is never refused for want of its pair), then
    /// sets the timeout in its slot 0 where it differs. Pairs no longer wanted go with the
    /// stale entries of the pass.
    fn program_affinity(
        &mut self,
        dp: &Datapath,
        plan: &Plan,
        rev_nat_id: u16,
        ids: &[u32],
        stored: u32,
    ) -> Result<()> {
        let write_err = |source| Error::Program {
            frontend: plan.describe(),
            source,
        };
        let timeout = plan.session_affinity.unwrap_or(0);
        if timeout > 0 {
            for id in ids {
                let pair = (rev_nat_id, *id);
                if !self.matches_in_map.contains(&pair) {
                    dp.affinity_match()
                        .put(rev_nat_id, *id)
                        .map_err(write_err)?;
                    self.matches_in_map.insert(pair);
                }
                self.matches_wanted.insert(pair);
            }
        }
        if stored != timeout {
            dp.services()
                .set_affinity_timeout(&plan.frontend, timeout)
                .map_err(write_err)?;
        }
        Ok(())
    }

    /// `loadBalancerSourceRanges`: writes the frontend's client prefixes missing from the
    /// source range maps. Those no longer wanted go with the stale entries of the pass, after
    /// the new ones are in: changed ranges never leave a moment with neither.
    fn program_ranges(&mut self, dp: &Datapath, plan: &Plan, rev_nat_id: u16) -> Result<()> {
        for net in plan.source_ranges.iter().flatten() {
            let entry = (rev_nat_id, *net);
            if !self.ranges_in_map.contains(&entry) {
                dp.source_ranges()
                    .put(rev_nat_id, *net)
                    .map_err(|source| Error::Program {
                        frontend: plan.describe(),
                        source,
                    })?;
                self.ranges_in_map.insert(entry);
            }
            self.ranges_wanted.insert(entry);
        }
        Ok(())
    }

    /// A frontend that failed keeps its source ranges, as it keeps the rest.
    fn keep_ranges(&mut self, frontend: &Frontend) {
        if let Some(rev) = self.ids.rev_nat(frontend) {
            let kept: Vec<(u16, IpNet)> = self
                .ranges_in_map
                .iter()
                .filter(|(r, _)| *r == rev)
                .copied()
                .collect();
            self.ranges_wanted.extend(kept);
        }
    }

    /// Removes the source ranges no frontend wants (of frontends removed, or changed).
    fn remove_stale_ranges(&mut self, dp: &Datapath, report: &mut SyncReport) {
        let stale: Vec<(u16, IpNet)> = self
            .ranges_in_map
            .difference(&self.ranges_wanted)
            .copied()
            .collect();
        for (rev, net) in stale {
            match dp.source_ranges().delete(rev, net) {
                Ok(_) => {
                    self.ranges_in_map.remove(&(rev, net));
                }
                Err(source) => report.removal_errors.push(error_chain(&Error::Remove {
                    what: format!("source range {net} of rev-NAT id {rev}"),
                    source,
                })),
            }
        }
    }

    /// A frontend that failed keeps its affinity pairs, as it keeps the rest.
    fn keep_matches(&mut self, frontend: &Frontend) {
        if let Some(rev) = self.ids.rev_nat(frontend) {
            let kept: Vec<(u16, u32)> = self
                .matches_in_map
                .iter()
                .filter(|(r, _)| *r == rev)
                .copied()
                .collect();
            self.matches_wanted.extend(kept);
        }
    }

    /// Removes the affinity pairs no frontend wants.
    fn remove_stale_matches(&mut self, dp: &Datapath, report: &mut SyncReport) {
        let stale: Vec<(u16, u32)> = self
            .matches_in_map
            .difference(&self.matches_wanted)
            .copied()
            .collect();
        for (rev, id) in stale {
            match dp.affinity_match().delete(rev, id) {
                Ok(_) => {
                    self.matches_in_map.remove(&(rev, id));
                }
                Err(source) => report.removal_errors.push(error_chain(&Error::Remove {
                    what: format!("affinity pair of rev-NAT id {rev} and backend {id}"),
                    source,
                })),
            }
        }
    }

    /// Writes the maglev table of a frontend balanced by maglev whose backends (`ids`, in the
    /// order of `plan.backends`) or table size changed since its table was written; forgets
    /// the table of one that is not (the stale pass removes it). Returns whether it wrote.
    fn program_table(
        &mut self,
        dp: &Datapath,
        plan: &Plan,
        rev_nat_id: u16,
        ids: &[u32],
    ) -> Result<bool> {
        if plan.algorithm != LbAlgorithm::Maglev || ids.is_empty() {
            self.tables.remove(&plan.frontend);
            return Ok(false);
        }
        let source = TableSource {
            rev_nat_id,
            size: self.maglev_size.get(),
            members: plan
                .backends
                .iter()
                .map(backend_name)
                .zip(ids.iter().copied())
                .collect(),
        };
        if self.tables.get(&plan.frontend) == Some(&source) {
            return Ok(false);
        }
        let names: Vec<String> = source.members.iter().map(|(n, _)| n.clone()).collect();
        let table: Vec<u32> = maglev::table(&names, source.size)
            .into_iter()
            .map(|i| source.members[i].1)
            .collect();
        dp.maglev()
            .put(rev_nat_id, &table)
            .map_err(|source| Error::Program {
                frontend: plan.describe(),
                source,
            })?;
        tracing::info!(
            frontend = %plan.describe(),
            rev_nat_id,
            backends = ids.len(),
            size = source.size,
            "maglev table written"
        );
        self.tables.insert(plan.frontend, source);
        Ok(true)
    }

    /// Removes the maglev tables no frontend in force is balanced with.
    fn remove_stale_tables(
        &mut self,
        dp: &Datapath,
        wanted: &BTreeSet<Frontend>,
        report: &mut SyncReport,
    ) -> Result<()> {
        self.tables.retain(|fe, _| wanted.contains(fe));
        let keep: HashSet<u16> = self.tables.values().map(|t| t.rev_nat_id).collect();
        let maglev = dp.maglev();
        for id in maglev.ids().map_err(read("maglev map"))? {
            if keep.contains(&id) {
                continue;
            }
            if let Err(source) = maglev.delete(id) {
                report.removal_errors.push(error_chain(&Error::Remove {
                    what: format!("maglev table of rev-NAT id {id}"),
                    source,
                }));
            }
        }
        Ok(())
    }

    /// Removes the frontends no plan wants, then the backends no frontend in the map uses.
    fn remove_stale(
        &mut self,
        dp: &Datapath,
        wanted: &BTreeSet<Frontend>,
        before: &BTreeMap<Frontend, ServiceEntry>,
        report: &mut SyncReport,
    ) -> Result<()> {
        let lb = dp.services();
        for (fe, entry) in before.iter().filter(|(fe, _)| !wanted.contains(fe)) {
            match lb.delete_service(fe) {
                Ok(_) => {
                    report.removed_frontends += 1;
                    tracing::info!(vip = %fe.vip, port = fe.port, protocol = %fe.protocol, "stale frontend removed");
                    self.released.insert(entry.rev_nat_id);
                }
                Err(source) => report.removal_errors.push(error_chain(&Error::Remove {
                    what: format!("frontend {}:{}/{}", fe.vip, fe.port, fe.protocol),
                    source,
                })),
            }
        }
        self.remove_stale_tables(dp, wanted, report)?;
        self.remove_stale_matches(dp, report);
        self.remove_stale_ranges(dp, report);
        let after = lb.services().map_err(read("services map"))?;
        // Ids of frontends gone from the plans and from the map (removed above, or never
        // written because their plan failed) wait for collection.
        for fe in self.ids.frontends() {
            if !wanted.contains(&fe)
                && !after.contains_key(&fe)
                && let Some(id) = self.ids.release_rev_nat(&fe)
            {
                self.released.insert(id);
            }
        }
        let draining = self
            .status
            .iter()
            .flat_map(|s| s.draining_ids.iter().copied());
        let used: HashSet<u32> = after
            .values()
            .flat_map(|s| s.backend_ids.iter().copied())
            .chain(draining)
            .collect();
        for (id, _) in lb
            .backends()
            .map_err(read("backends map"))?
            .into_iter()
            .filter(|(id, _)| !used.contains(id))
        {
            match lb.delete_backend(id) {
                Ok(_) => report.removed_backends += 1,
                Err(source) => report.removal_errors.push(error_chain(&Error::Remove {
                    what: format!("backend {id}"),
                    source,
                })),
            }
        }
        self.ids.retain_backends(|_, id| used.contains(&id));
        Ok(())
    }

    /// Deletes the rev-NAT entries of removed frontends that no live connection carries any
    /// more; returns how many.
    pub fn collect_rev_nats(&mut self, dp: &Datapath) -> Result<usize> {
        // A frontend may have come back with its old id adopted: not ours to delete.
        let ids = &self.ids;
        self.released.retain(|id| !ids.rev_nat_in_use(*id));
        if self.released.is_empty() {
            return Ok(0);
        }
        let now = ktime_now_ns().map_err(read("monotonic clock"))?;
        let carried: HashSet<u16> = dp
            .conntrack()
            .entries()
            .map_err(read("conntrack map"))?
            .into_iter()
            .filter(|(_, e)| e.rev_nat_id != 0 && e.expires_ns > now)
            .map(|(_, e)| e.rev_nat_id)
            .collect();
        let mut deleted = 0;
        for id in self.released.clone() {
            if carried.contains(&id) {
                continue;
            }
            dp.services()
                .delete_rev_nat(id)
                .map_err(|source| Error::Remove {
                    what: format!("rev-NAT entry {id}"),
                    source,
                })?;
            self.released.remove(&id);
            deleted += 1;
        }
        Ok(deleted)
    }

    /// How many rev-NAT entries wait for their connections to end.
    pub fn lingering_rev_nats(&self) -> usize {
        self.released.len()
    }
}

/// The name a backend's maglev permutation is derived from: its address and port, the same
/// on every node.
fn backend_name(b: &PlannedBackend) -> String {
    SocketAddr::new(b.backend.addr, b.backend.port).to_string()
}

/// Every backend, frontend and rev-NAT entry of the pinned maps.
fn read_pinned(dp: &Datapath) -> Result<Pinned> {
    let lb = dp.services();
    Ok(Pinned {
        backends: lb.backends().map_err(read("backends map"))?,
        frontends: lb.services().map_err(read("services map"))?,
        rev_nats: lb.rev_nats().map_err(read("rev-NAT maps"))?,
    })
}

fn read(what: &'static str) -> impl Fn(cellium_datapath_bpf::Error) -> Error {
    move |source| Error::Read { what, source }
}

//! `cel_policy`: endpoint id -> that endpoint's own allow/deny map, an LPM trie over
//! (endpoint, direction, identity, protocol, port prefix) of `bpf-policy-map-max` entries.
//! No endpoint's entries take room from another's, and one endpoint's writes never fail
//! for another's.
//!
//! The entries are the policy model's ([`cellium_policy::PolicyEntry`]); this
//! module encodes them as the map's keys. Trap: within one identity the
//! longest entry decides, so a broad deny written next to a narrower allow
//! loses to it. Build entries with [`compile_policy`], which resolves such
//! overlaps, and write them with [`PolicyMap::sync_endpoint`].

use cellium_policy::{Decision, L4Match, PolicyEntry, PolicyRule, Verdict, block_mask};

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use crate::abi::{Plain, PolicyKey, PolicyValue};
use crate::error::{Error, Result};
use crate::maps::TypedMap;
use crate::types::{Direction, Protocol};

/// The map name: endpoint id -> the endpoint's own map.
pub const NAME: &str = "cel_policy";

/// The size of an endpoint's map until [`PolicyMap::set_endpoint_max`] says otherwise
/// (Cilium's default `bpf-policy-map-max`).
pub const DEFAULT_ENDPOINT_MAX: u32 = 16384;

const PREFIX_ANY_PROTO: u32 = 64;
const PREFIX_ANY_PORT: u32 = 80;
const PREFIX_FULL: u32 = 96;

/// Compiles an endpoint's rules into the entries of its policy map
/// ([`cellium_policy::compile`]), with this crate's error.
pub fn compile_policy(
    endpoint_id: u16,
    rules: &[PolicyRule],
) -> Result<Vec<(PolicyEntry, Verdict)>> {
    cellium_policy::compile(endpoint_id, rules).map_err(Error::Policy)
}

/// The map key of an entry.
fn key_of(entry: &PolicyEntry) -> PolicyKey {
    let (prefixlen, protocol, dport) = match entry.l4 {
        L4Match::Any => (PREFIX_ANY_PROTO, 0, 0),
        L4Match::Protocol(p) => (PREFIX_ANY_PORT, p.number(), 0),
        L4Match::PortBlock {
            protocol,
            port,
            prefix_bits,
        } => (
            PREFIX_ANY_PORT + u32::from(prefix_bits.clamp(1, 16)),
            protocol.number(),
            (port & block_mask(prefix_bits)).to_be(),
        ),
    };
    PolicyKey {
        prefixlen,
        endpoint_id: entry.endpoint_id,
        direction: entry.direction.as_u8(),
        pad1: 0,
        identity: entry.identity,
        protocol,
        pad2: 0,
        dport,
    }
}

/// The entry a map key stands for.
fn entry_of(key: &PolicyKey) -> Result<PolicyEntry> {
    let bad = |why: &str| Error::invalid(format!("policy key {key:?}"), why.to_owned());
    let direction = Direction::from_u8(key.direction).ok_or_else(|| bad("unknown direction"))?;
    let l4 = match key.prefixlen {
        PREFIX_ANY_PROTO => L4Match::Any,
        PREFIX_ANY_PORT => L4Match::Protocol(Protocol::from(key.protocol)),
        n if n > PREFIX_ANY_PORT && n <= PREFIX_FULL => L4Match::PortBlock {
            protocol: Protocol::from(key.protocol),
            port: u16::from_be(key.dport),
            prefix_bits: (n - PREFIX_ANY_PORT) as u8,
        },
        _ => return Err(bad("prefix length outside 64..=96")),
    };
    Ok(PolicyEntry {
        endpoint_id: key.endpoint_id,
        direction,
        identity: key.identity,
        l4,
    })
}

/// `CEL_POLICY_F_AUDIT`.
const F_AUDIT: u8 = 0x01;

fn value_of(v: Verdict) -> PolicyValue {
    PolicyValue {
        deny: u8::from(v != Verdict::Allow),
        flags: if v == Verdict::AuditDeny { F_AUDIT } else { 0 },
        ..PolicyValue::default()
    }
}

fn verdict_of(v: &PolicyValue) -> Verdict {
    match (v.deny != 0, v.flags & F_AUDIT != 0) {
        (false, _) => Verdict::Allow,
        (true, false) => Verdict::Deny,
        (true, true) => Verdict::AuditDeny,
    }
}

/// Counts of a [`PolicyMap::sync_endpoint`] run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Entries written (new or changed verdict).
    pub written: usize,
    /// Entries already as desired.
    pub unchanged: usize,
    /// Stale entries removed.
    pub removed: usize,
}

/// One endpoint's own policy map: an LPM trie of its entries.
type EndpointMap = TypedMap<PolicyKey, PolicyValue>;

impl PolicyWrites for EndpointMap {
    fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()> {
        TypedMap::put(self, &key_of(entry), &value_of(verdict))
    }

    fn delete(&self, entry: &PolicyEntry) -> Result<bool> {
        TypedMap::delete(self, &key_of(entry))
    }
}

/// The policy maps: `cel_policy`, endpoint id -> that endpoint's own map, each pinned as
/// `cel_policy_<id>` beside it so that it outlives a replaced `cel_policy`.
///
/// Every update or removal of a `cel_policy` entry waits for an RCU grace period (the kernel
/// makes sure no program still runs with the inner map it replaced), 8 to 16 ms on a busy
/// node. So a new endpoint's id has an empty map waiting for it, put in beforehand with
/// others in one batch ([`maintain`](PolicyMap::maintain)), and a removed endpoint's map is
/// retired ([`retire_endpoint`](PolicyMap::retire_endpoint)) and taken out later: neither
/// an ADD nor a DEL waits for a grace period.
#[derive(Debug)]
pub struct PolicyMap {
    outer: MapHandle,
    maps_dir: PathBuf,
    endpoint_max: AtomicU32,
    /// Held by whatever changes `cel_policy`, across the grace period: two changes of one id
    /// never interleave.
    changes: Mutex<()>,
    /// Endpoints whose map is retired: unpinned, read as absent, still in `cel_policy` until
    /// [`maintain`](PolicyMap::maintain) takes it out. A new endpoint with such an id gets a
    /// new map.
    retired: Mutex<BTreeSet<u16>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PolicyMap {
    pub(crate) fn new(outer: MapHandle, maps_dir: PathBuf) -> Self {
        Self {
            outer,
            maps_dir,
            endpoint_max: AtomicU32::new(DEFAULT_ENDPOINT_MAX),
            changes: Mutex::default(),
            retired: Mutex::default(),
        }
    }

    /// The size of the endpoint maps created from now on: the most entries one endpoint's
    /// policy may have (`bpf-policy-map-max`).
    pub fn set_endpoint_max(&self, max: u32) {
        self.endpoint_max.store(max.max(1), Ordering::Relaxed);
    }

    fn pin_path(&self, id: u16) -> PathBuf {
        self.maps_dir.join(format!("{NAME}_{id}"))
    }

    /// Endpoint `id`'s map, if it has one.
    fn endpoint_map(&self, id: u16) -> Result<Option<EndpointMap>> {
        let Some(value) = self
            .outer
            .lookup(&u32::from(id).to_ne_bytes(), MapFlags::ANY)
            .map_err(Error::map_op(NAME, "lookup"))?
        else {
            return Ok(None);
        };
        let map_id = value
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
            .ok_or(Error::Layout {
                map: NAME,
                len: value.len(),
                expected: 4,
            })?;
        match MapHandle::from_map_id(map_id) {
            Ok(handle) => Ok(Some(TypedMap::new(NAME, handle))),
            // Removed between the two reads.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::map_op(NAME, "open endpoint map")(e)),
        }
    }

    /// Endpoint `id`'s map, unless it has none or it is retired.
    fn live_map(&self, id: u16) -> Result<Option<EndpointMap>> {
        if lock(&self.retired).contains(&id) {
            return Ok(None);
        }
        self.endpoint_map(id)
    }

    /// Endpoint `id`'s live map if it is sized for the current limit: a diff can go into it.
    fn writable_map(&self, id: u16) -> Result<Option<EndpointMap>> {
        let max = self.endpoint_max.load(Ordering::Relaxed);
        Ok(self
            .live_map(id)?
            .filter(|m| m.handle().max_entries() == max))
    }

    /// A new, empty map for endpoint `id`, not yet in `cel_policy`.
    fn new_endpoint_map(&self, id: u16) -> Result<EndpointMap> {
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: size_of::<libbpf_sys::bpf_map_create_opts>() as u64,
            map_flags: libbpf_sys::BPF_F_NO_PREALLOC,
            ..Default::default()
        };
        let handle = MapHandle::create(
            MapType::LpmTrie,
            Some(format!("cel_pol_{id}")),
            PolicyKey::SIZE as u32,
            PolicyValue::SIZE as u32,
            self.endpoint_max.load(Ordering::Relaxed),
            &opts,
        )
        .map_err(Error::map_op(NAME, "create endpoint map"))?;
        Ok(TypedMap::new(NAME, handle))
    }

    /// Pins endpoint `id`'s `map` and makes it the endpoint's in `cel_policy`; on failure
    /// neither remains. The caller holds `changes`.
    fn install(&self, id: u16, map: &mut EndpointMap) -> Result<()> {
        let path = self.pin_path(id);
        // A pin without an entry is a leftover of an interrupted install.
        let _ = fs::remove_file(&path);
        map.handle_mut()
            .pin(&path)
            .map_err(Error::map_op(NAME, "pin endpoint map"))?;
        let fd = map.handle().as_fd().as_raw_fd() as u32;
        let inserted = self
            .outer
            .update(
                &u32::from(id).to_ne_bytes(),
                &fd.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(Error::map_op(NAME, "insert endpoint map"));
        if inserted.is_err() {
            let _ = fs::remove_file(&path);
        } else {
            lock(&self.retired).remove(&id);
        }
        inserted
    }

    /// Pins a new empty map for each of `ids` and puts them all into `cel_policy` with one
    /// batch update, so one grace period for all. The caller holds `changes`.
    fn install_spares(&self, ids: &[u16]) -> Result<usize> {
        let mut maps = Vec::with_capacity(ids.len());
        let (mut keys, mut fds) = (Vec::new(), Vec::new());
        for &id in ids {
            let mut map = self.new_endpoint_map(id)?;
            let path = self.pin_path(id);
            let _ = fs::remove_file(&path);
            map.handle_mut()
                .pin(&path)
                .map_err(Error::map_op(NAME, "pin endpoint map"))?;
            keys.extend_from_slice(&u32::from(id).to_ne_bytes());
            fds.extend_from_slice(&(map.handle().as_fd().as_raw_fd() as u32).to_ne_bytes());
            maps.push((id, map));
        }
        if maps.is_empty() {
            return Ok(0);
        }
        let batch =
            self.outer
                .update_batch(&keys, &fds, maps.len() as u32, MapFlags::ANY, MapFlags::ANY);
        if batch.is_err() {
            // One by one then: any that fails loses its pin.
            let mut failed = None;
            for (id, map) in &maps {
                let fd = map.handle().as_fd().as_raw_fd() as u32;
                let key = u32::from(*id).to_ne_bytes();
                if let Err(e) = self.outer.update(&key, &fd.to_ne_bytes(), MapFlags::ANY) {
                    let _ = fs::remove_file(self.pin_path(*id));
                    failed.get_or_insert(e);
                }
            }
            if let Some(e) = failed {
                return Err(Error::map_op(NAME, "insert endpoint map")(e));
            }
        }
        let mut retired = lock(&self.retired);
        for (id, _) in &maps {
            retired.remove(id);
        }
        Ok(maps.len())
    }

    /// Pays, off the ADD and DEL paths, the grace periods they skip: gives each of `spares`
    /// (the ids the next endpoints will get) that has no live map a new empty one, pinned
    /// and in `cel_policy` (one batch update for all; an empty map allows nothing, and no
    /// packet looks it up before an endpoint with that id exists), then takes the retired
    /// maps out of `cel_policy` (one grace period each). Returns how many spares were added.
    pub fn maintain(&self, spares: &[u16]) -> Result<usize> {
        let added = {
            let _changes = lock(&self.changes);
            // One lookup per id, no map opened: this runs after every ADD and DEL. (A spare
            // of another size, from an agent with another limit, is replaced at its write.)
            let retired = lock(&self.retired).clone();
            let mut missing = Vec::new();
            for &id in spares {
                let held = self
                    .outer
                    .lookup(&u32::from(id).to_ne_bytes(), MapFlags::ANY)
                    .map_err(Error::map_op(NAME, "lookup"))?;
                if held.is_none() || retired.contains(&id) {
                    missing.push(id);
                }
            }
            self.install_spares(&missing)?
        };
        self.reap()?;
        Ok(added)
    }

    /// Takes the retired maps out of `cel_policy`, one at a time so that an ADD waiting for
    /// `changes` waits for one grace period at most.
    fn reap(&self) -> Result<()> {
        loop {
            let _changes = lock(&self.changes);
            let Some(id) = lock(&self.retired).first().copied() else {
                return Ok(());
            };
            match self.outer.delete(&u32::from(id).to_ne_bytes()) {
                Ok(()) => {}
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::map_op(NAME, "delete")(e)),
            }
            lock(&self.retired).remove(&id);
        }
    }

    /// The endpoints that have a map (retired ones do not).
    pub fn endpoint_ids(&self) -> Result<Vec<u16>> {
        let retired = lock(&self.retired).clone();
        Ok(self
            .outer
            .keys()
            .filter_map(|k| Some(u32::from_ne_bytes(k.get(..4)?.try_into().ok()?)))
            .filter_map(|id| u16::try_from(id).ok())
            .filter(|id| !retired.contains(id))
            .collect())
    }

    /// Puts the pinned endpoint maps that `cel_policy` lacks back into it (after it was
    /// recreated, say for a changed definition) and pins those it holds without a pin (an
    /// interrupted removal: the restore's sweep removes the maps of endpoints gone). Returns
    /// how many were put back.
    pub(crate) fn reconcile_pins(&self) -> Result<usize> {
        let held: BTreeSet<u16> = self.endpoint_ids()?.into_iter().collect();
        let mut restored = 0;
        let prefix = format!("{NAME}_");
        let dir = fs::read_dir(&self.maps_dir).map_err(|source| Error::CreateDir {
            path: self.maps_dir.clone(),
            source,
        })?;
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|n| n.parse::<u16>().ok())
            else {
                continue;
            };
            if held.contains(&id) {
                continue;
            }
            let pinned = match MapHandle::from_pinned_path(entry.path()) {
                Ok(h)
                    if h.map_type() == MapType::LpmTrie
                        && h.key_size() as usize == PolicyKey::SIZE
                        && h.value_size() as usize == PolicyValue::SIZE =>
                {
                    h
                }
                _ => {
                    tracing::warn!(path = %entry.path().display(), "removing an unusable endpoint policy map pin");
                    let _ = fs::remove_file(entry.path());
                    continue;
                }
            };
            let fd = pinned.as_fd().as_raw_fd() as u32;
            self.outer
                .update(
                    &u32::from(id).to_ne_bytes(),
                    &fd.to_ne_bytes(),
                    MapFlags::ANY,
                )
                .map_err(Error::map_op(NAME, "insert endpoint map"))?;
            restored += 1;
        }
        for id in held {
            if !self.pin_path(id).exists()
                && let Some(mut map) = self.endpoint_map(id)?
            {
                map.handle_mut()
                    .pin(self.pin_path(id))
                    .map_err(Error::map_op(NAME, "pin endpoint map"))?;
            }
        }
        Ok(restored)
    }

    /// Writes one entry into its endpoint's map, creating that map (empty, so denying
    /// everything) if the endpoint has none.
    pub fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()> {
        let id = entry.endpoint_id;
        let map = match self.live_map(id)? {
            Some(map) => map,
            None => {
                let _changes = lock(&self.changes);
                match self.live_map(id)? {
                    Some(map) => map,
                    None => {
                        let mut map = self.new_endpoint_map(id)?;
                        self.install(id, &mut map)?;
                        map
                    }
                }
            }
        };
        PolicyWrites::put(&map, entry, verdict)
    }

    /// Removes one entry; returns whether it existed.
    pub fn delete(&self, entry: &PolicyEntry) -> Result<bool> {
        match self.live_map(entry.endpoint_id)? {
            Some(map) => PolicyWrites::delete(&map, entry),
            None => Ok(false),
        }
    }

    /// Every entry of every endpoint's map.
    pub fn entries(&self) -> Result<Vec<(PolicyEntry, Verdict)>> {
        let mut out = Vec::new();
        for id in self.endpoint_ids()? {
            out.extend(self.endpoint_entries(id)?);
        }
        Ok(out)
    }

    /// The entries of one endpoint.
    pub fn endpoint_entries(&self, endpoint_id: u16) -> Result<Vec<(PolicyEntry, Verdict)>> {
        let Some(map) = self.live_map(endpoint_id)? else {
            return Ok(Vec::new());
        };
        map.entries()?
            .iter()
            .map(|(k, v)| Ok((entry_of(k)?, verdict_of(v))))
            .filter(|e| !matches!(e, Ok((e, _)) if e.endpoint_id != endpoint_id))
            .collect()
    }

    /// The number of entries endpoint `id`'s map holds at most, if it has a map.
    pub fn endpoint_map_max(&self, endpoint_id: u16) -> Result<Option<u32>> {
        Ok(self
            .live_map(endpoint_id)?
            .map(|m| m.handle().max_entries()))
    }

    /// Makes the endpoint's entries exactly `desired`, reading its current entries from the
    /// map first. See [`apply_diff`](PolicyMap::apply_diff) for the order of writes.
    pub fn sync_endpoint(
        &self,
        endpoint_id: u16,
        desired: &[(PolicyEntry, Verdict)],
    ) -> Result<SyncStats> {
        let current = self.endpoint_entries(endpoint_id)?;
        self.apply_diff(endpoint_id, &current, desired)
    }

    /// Turns the endpoint's entries from `current` (what the caller knows its map holds)
    /// into `desired`, writing only the differences: no read of the map, so an agent that
    /// remembers what it wrote regenerates thousands of endpoints in milliseconds.
    ///
    /// An endpoint without a map gets a new one, filled before it is put in `cel_policy`:
    /// until then the datapath drops what the endpoint enforces (`NO_POLICY_MAP`), after it
    /// the whole policy applies at once. So does an endpoint whose map was sized for another
    /// limit (`bpf-policy-map-max` changed across a restart): the new map replaces the old
    /// one in a single update of `cel_policy`.
    ///
    /// In an existing map revocations come first: allows the new set denies are turned into
    /// denies and allows it drops are removed; then new denies are written, then new allows,
    /// and revoked denies are removed last. So no state on the way, and none a failure stops
    /// at (the first failing write or removal ends the call), allows what the new set does
    /// not: a map too full for the new entries has already lost the revoked ones. A caller
    /// that sees the error knows the map holds neither set exactly and syncs again.
    pub fn apply_diff(
        &self,
        endpoint_id: u16,
        current: &[(PolicyEntry, Verdict)],
        desired: &[(PolicyEntry, Verdict)],
    ) -> Result<SyncStats> {
        if let Some((e, _)) = desired.iter().find(|(e, _)| e.endpoint_id != endpoint_id) {
            return Err(Error::invalid(
                format!("policy entry {e:?}"),
                format!("belongs to endpoint {}, not {endpoint_id}", e.endpoint_id),
            ));
        }
        // A new endpoint's id usually has a spare map waiting (see `maintain`).
        if let Some(map) = self.writable_map(endpoint_id)? {
            return diff_into(&map, current, desired);
        }
        let _changes = lock(&self.changes);
        if let Some(map) = self.writable_map(endpoint_id)? {
            return diff_into(&map, current, desired);
        }
        // No map, a retired one, or one sized for another limit: a new one takes its place
        // whole.
        let mut map = self.new_endpoint_map(endpoint_id)?;
        let stats = diff_into(&map, &[], desired)?;
        self.install(endpoint_id, &mut map)?;
        Ok(stats)
    }

    /// Removes the endpoint's map; returns how many entries it held. The pin goes first, so
    /// that no open of the datapath meanwhile puts the map back (see `reconcile_pins`); then
    /// the entry in `cel_policy`, after which the datapath drops what the endpoint enforces.
    pub fn clear_endpoint(&self, endpoint_id: u16) -> Result<usize> {
        let _changes = lock(&self.changes);
        let held = self.endpoint_entries(endpoint_id)?.len();
        let path = self.pin_path(endpoint_id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Unpin { path, source }),
        }
        match self.outer.delete(&u32::from(endpoint_id).to_ne_bytes()) {
            Ok(()) => {}
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::map_op(NAME, "delete")(e)),
        }
        lock(&self.retired).remove(&endpoint_id);
        Ok(held)
    }

    /// Removes the endpoint's map as [`clear_endpoint`](PolicyMap::clear_endpoint) does, but
    /// without waiting for the grace period: the map is emptied (so it allows nothing, even to
    /// a later endpoint of the same id whose endpoint-map entry came first), its pin goes and
    /// it reads as absent at once, and [`maintain`](PolicyMap::maintain) takes it out of
    /// `cel_policy` later. (An agent that stops before then finds the map unpinned in
    /// `cel_policy`, pins it again and its restore sweeps it.)
    pub fn retire_endpoint(&self, endpoint_id: u16) -> Result<()> {
        // Not under `changes`, which a reap holds across a grace period: no other change
        // concerns this id while its endpoint goes.
        if let Some(map) = self.endpoint_map(endpoint_id)? {
            for key in map.keys()? {
                map.delete(&key)?;
            }
        }
        let path = self.pin_path(endpoint_id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Unpin { path, source }),
        }
        lock(&self.retired).insert(endpoint_id);
        Ok(())
    }

    /// What the map decides for a new connection of `endpoint_id` in
    /// `direction` with a peer of `identity`: the kernel's two longest-prefix
    /// lookups, combined as the model combines them
    /// ([`Decision::of_lookups`]; the enforcement flag is not consulted). An endpoint
    /// without a map decides as one with an empty map.
    pub fn decide(
        &self,
        endpoint_id: u16,
        direction: Direction,
        identity: u32,
        protocol: Protocol,
        dport: u16,
    ) -> Result<Decision> {
        let dport = if protocol.has_ports() || protocol.is_icmp() {
            dport
        } else {
            0
        };
        let Some(map) = self.live_map(endpoint_id)? else {
            return Ok(Decision::of_lookups(None, None));
        };
        let lookup = |id: u32| -> Result<Option<Verdict>> {
            let key = key_of(&PolicyEntry {
                endpoint_id,
                direction,
                identity: id,
                l4: L4Match::PortBlock {
                    protocol,
                    port: dport,
                    prefix_bits: 16,
                },
            });
            Ok(map.get(&key)?.map(|v| verdict_of(&v)))
        };
        Ok(Decision::of_lookups(lookup(identity)?, lookup(0)?))
    }
}

/// The two writes a diff makes, apart from the map so that their order is tested without one.
trait PolicyWrites {
    fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()>;
    fn delete(&self, entry: &PolicyEntry) -> Result<bool>;
}

/// [`PolicyMap::apply_diff`]'s steps, in its order.
fn diff_into(
    map: &impl PolicyWrites,
    current: &[(PolicyEntry, Verdict)],
    desired: &[(PolicyEntry, Verdict)],
) -> Result<SyncStats> {
    // Sorted copies searched by bisection: an endpoint has tens of entries, for which
    // hashing every key cost more than the comparisons.
    let current = sorted(current);
    let wanted = sorted(desired);
    let mut stats = SyncStats::default();
    revoke(map, &current, &wanted, &mut stats)?;
    write(map, &wanted, &current, Verdict::Deny, &mut stats)?;
    write(map, &wanted, &current, Verdict::Allow, &mut stats)?;
    write(map, &wanted, &current, Verdict::AuditDeny, &mut stats)?;
    remove_denies(map, &current, &wanted, &mut stats)?;
    Ok(stats)
}

/// Takes back what the new set no longer lets through: an allow (or an audited deny, which
/// passes too) it denies becomes a deny, one it drops is removed. First, so that no failure
/// later leaves a revoked allow in force; these writes only change or remove keys the map
/// holds, so a full map cannot refuse them.
fn revoke(
    map: &impl PolicyWrites,
    current: &[(PolicyEntry, Verdict)],
    wanted: &[(PolicyEntry, Verdict)],
    stats: &mut SyncStats,
) -> Result<()> {
    for (entry, _) in current.iter().filter(|(_, v)| *v != Verdict::Deny) {
        match lookup(wanted, entry) {
            Some(Verdict::Allow | Verdict::AuditDeny) => {}
            Some(Verdict::Deny) => {
                map.put(entry, Verdict::Deny)?;
                stats.written += 1;
            }
            None => {
                if map.delete(entry)? {
                    stats.removed += 1;
                }
            }
        }
    }
    Ok(())
}

/// Writes the entries `wanted` has with verdict `pass` that `current` does not hold so (a
/// passing entry turned deny is [`revoke`]'s).
fn write(
    map: &impl PolicyWrites,
    wanted: &[(PolicyEntry, Verdict)],
    current: &[(PolicyEntry, Verdict)],
    pass: Verdict,
    stats: &mut SyncStats,
) -> Result<()> {
    for (entry, _) in wanted.iter().filter(|(_, v)| *v == pass) {
        match lookup(current, entry) {
            Some(held) if held == pass => stats.unchanged += 1,
            Some(held) if pass == Verdict::Deny && held != Verdict::Deny => {}
            _ => {
                map.put(entry, pass)?;
                stats.written += 1;
            }
        }
    }
    Ok(())
}

/// Removes the denies of `current` that `wanted` no longer has: last, as they only loosen.
fn remove_denies(
    map: &impl PolicyWrites,
    current: &[(PolicyEntry, Verdict)],
    wanted: &[(PolicyEntry, Verdict)],
    stats: &mut SyncStats,
) -> Result<()> {
    for (entry, _) in current
        .iter()
        .filter(|(e, v)| *v == Verdict::Deny && lookup(wanted, e).is_none())
    {
        if map.delete(entry)? {
            stats.removed += 1;
        }
    }
    Ok(())
}

fn sorted(entries: &[(PolicyEntry, Verdict)]) -> Vec<(PolicyEntry, Verdict)> {
    let mut out = entries.to_vec();
    out.sort_unstable();
    out
}

/// The verdict of `entry` in `sorted` entries.
fn lookup(sorted: &[(PolicyEntry, Verdict)], entry: &PolicyEntry) -> Option<Verdict> {
    sorted
        .binary_search_by(|(e, _)| e.cmp(entry))
        .ok()
        .map(|i| sorted[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_through_values() {
        assert_eq!(u64::from(F_AUDIT), crate::abi::c::CEL_POLICY_F_AUDIT);
        for v in [Verdict::Allow, Verdict::Deny, Verdict::AuditDeny] {
            assert_eq!(verdict_of(&value_of(v)), v);
        }
        // An audited deny is a deny to a datapath that knows no audit (an older one).
        assert_eq!(value_of(Verdict::AuditDeny).deny, 1);
    }

    #[test]
    fn keys_round_trip() {
        let entries = [
            PolicyEntry {
                endpoint_id: 7,
                direction: Direction::Ingress,
                identity: 0,
                l4: L4Match::Any,
            },
            PolicyEntry {
                endpoint_id: 7,
                direction: Direction::Egress,
                identity: 4242,
                l4: L4Match::Protocol(Protocol::Udp),
            },
            PolicyEntry {
                endpoint_id: 9,
                direction: Direction::Ingress,
                identity: 3,
                l4: L4Match::PortBlock {
                    protocol: Protocol::Tcp,
                    port: 8080,
                    prefix_bits: 16,
                },
            },
            PolicyEntry {
                endpoint_id: 9,
                direction: Direction::Ingress,
                identity: 3,
                l4: L4Match::PortBlock {
                    protocol: Protocol::Tcp,
                    port: 1024,
                    prefix_bits: 6,
                },
            },
        ];
        for e in entries {
            assert_eq!(entry_of(&key_of(&e)).unwrap(), e);
        }
    }

    #[test]
    fn key_prefixes_follow_the_header() {
        let e = PolicyEntry {
            endpoint_id: 1,
            direction: Direction::Egress,
            identity: 5,
            l4: L4Match::PortBlock {
                protocol: Protocol::Tcp,
                port: 80,
                prefix_bits: 16,
            },
        };
        let k = key_of(&e);
        assert_eq!(k.prefixlen, 96);
        assert_eq!(k.dport, 80u16.to_be());
        assert_eq!(k.protocol, 6);
        assert_eq!(k.direction, 1);
        // Host bits of a block are cleared so the LPM key is canonical.
        let b = PolicyEntry {
            l4: L4Match::PortBlock {
                protocol: Protocol::Tcp,
                port: 1030,
                prefix_bits: 6,
            },
            ..e
        };
        assert_eq!(u16::from_be(key_of(&b).dport), 1024);
        assert_eq!(key_of(&b).prefixlen, 86);
    }

    #[test]
    fn bad_prefixes_are_rejected() {
        let mut k = key_of(&PolicyEntry {
            endpoint_id: 1,
            direction: Direction::Egress,
            identity: 0,
            l4: L4Match::Any,
        });
        k.prefixlen = 63;
        assert!(entry_of(&k).is_err());
        k.prefixlen = 97;
        assert!(entry_of(&k).is_err());
    }

    /// An in-memory map that checks, after every write, that what it allows is a subset of the
    /// old set's allows or of the new set's (never their union), and refuses new keys beyond
    /// `capacity`, as a full kernel map does.
    struct Model {
        held: std::cell::RefCell<std::collections::BTreeMap<PolicyEntry, Verdict>>,
        capacity: usize,
        old: Vec<PolicyEntry>,
        new: Vec<PolicyEntry>,
    }

    impl Model {
        fn new(
            current: &[(PolicyEntry, Verdict)],
            desired: &[(PolicyEntry, Verdict)],
            capacity: usize,
        ) -> Model {
            let allows = |set: &[(PolicyEntry, Verdict)]| {
                set.iter()
                    .filter(|(_, v)| *v == Verdict::Allow)
                    .map(|(e, _)| *e)
                    .collect()
            };
            Model {
                held: std::cell::RefCell::new(current.iter().copied().collect()),
                capacity,
                old: allows(current),
                new: allows(desired),
            }
        }

        fn allowed(&self) -> Vec<PolicyEntry> {
            let held = self.held.borrow();
            held.iter()
                .filter(|(_, v)| **v == Verdict::Allow)
                .map(|(e, _)| *e)
                .collect()
        }

        fn check(&self) {
            let allowed = self.allowed();
            let within = |set: &[PolicyEntry]| allowed.iter().all(|e| set.contains(e));
            assert!(
                within(&self.old) || within(&self.new),
                "allows {allowed:?}: beyond both the old {:?} and the new {:?}",
                self.old,
                self.new
            );
        }
    }

    impl PolicyWrites for Model {
        fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()> {
            let mut held = self.held.borrow_mut();
            if !held.contains_key(entry) && held.len() == self.capacity {
                return Err(Error::invalid("policy map", "full"));
            }
            held.insert(*entry, verdict);
            drop(held);
            self.check();
            Ok(())
        }

        fn delete(&self, entry: &PolicyEntry) -> Result<bool> {
            let gone = self.held.borrow_mut().remove(entry).is_some();
            self.check();
            Ok(gone)
        }
    }

    fn peer(identity: u32) -> PolicyEntry {
        PolicyEntry {
            endpoint_id: 1,
            direction: Direction::Ingress,
            identity,
            l4: L4Match::Any,
        }
    }

    #[test]
    fn no_step_of_a_change_allows_the_union_of_old_and_new() {
        // Every old and new verdict (none, allow, deny) of three peers against every other.
        let states = [None, Some(Verdict::Allow), Some(Verdict::Deny)];
        let sets = (0..27).map(|n: usize| {
            (0..3)
                .filter_map(|i| states[n / 3usize.pow(i) % 3].map(|v| (peer(i + 10), v)))
                .collect::<Vec<_>>()
        });
        let sets: Vec<_> = sets.collect();
        for current in &sets {
            for desired in &sets {
                let model = Model::new(current, desired, usize::MAX);
                diff_into(&model, current, desired).unwrap();
                let held: Vec<_> = model.held.borrow().iter().map(|(e, v)| (*e, *v)).collect();
                assert_eq!(held, sorted(desired), "from {current:?}");
            }
        }
    }

    #[test]
    fn a_full_map_has_lost_the_revoked_allows_when_it_refuses_new_entries() {
        let current = [(peer(10), Verdict::Allow), (peer(11), Verdict::Allow)];
        let desired = [
            (peer(11), Verdict::Allow),
            (peer(12), Verdict::Deny),
            (peer(13), Verdict::Allow),
            (peer(14), Verdict::Allow),
        ];
        // Room for the two entries held and one more.
        let model = Model::new(&current, &desired, 3);
        assert!(diff_into(&model, &current, &desired).is_err());
        let allowed = model.allowed();
        assert!(
            !allowed.contains(&peer(10)),
            "the revoked allow is in force"
        );
        assert!(allowed.iter().all(|e| model.new.contains(e)), "{allowed:?}");
    }
}

//! `cel_policy`: per-endpoint allow/deny entries, an LPM trie over
//! (endpoint, direction, identity, protocol, port prefix).
//!
//! The entries are the policy model's ([`cellium_policy::PolicyEntry`]); this
//! module encodes them as the map's keys. Trap: within one identity the
//! longest entry decides, so a broad deny written next to a narrower allow
//! loses to it. Build entries with [`compile_policy`], which resolves such
//! overlaps, and write them with [`PolicyMap::sync_endpoint`].

use cellium_policy::{Decision, L4Match, PolicyEntry, PolicyRule, Verdict, block_mask};

use crate::abi::{PolicyKey, PolicyValue};
use crate::error::{Error, Result};
use crate::maps::TypedMap;
use crate::types::{Direction, Protocol};

/// The map name.
pub const NAME: &str = "cel_policy";

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

fn value_of(v: Verdict) -> PolicyValue {
    PolicyValue {
        deny: u8::from(v == Verdict::Deny),
        pad: [0; 3],
        flags: 0,
    }
}

fn verdict_of(v: &PolicyValue) -> Verdict {
    if v.deny != 0 {
        Verdict::Deny
    } else {
        Verdict::Allow
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

/// The policy map.
#[derive(Debug)]
pub struct PolicyMap {
    map: TypedMap<PolicyKey, PolicyValue>,
}

impl PolicyMap {
    pub(crate) fn new(map: TypedMap<PolicyKey, PolicyValue>) -> Self {
        Self { map }
    }

    /// Writes one entry.
    pub fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()> {
        self.map.put(&key_of(entry), &value_of(verdict))
    }

    /// Removes one entry; returns whether it existed.
    pub fn delete(&self, entry: &PolicyEntry) -> Result<bool> {
        self.map.delete(&key_of(entry))
    }

    /// Every entry of the map.
    pub fn entries(&self) -> Result<Vec<(PolicyEntry, Verdict)>> {
        self.map
            .entries()?
            .iter()
            .map(|(k, v)| Ok((entry_of(k)?, verdict_of(v))))
            .collect()
    }

    /// The entries of one endpoint.
    pub fn endpoint_entries(&self, endpoint_id: u16) -> Result<Vec<(PolicyEntry, Verdict)>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|(e, _)| e.endpoint_id == endpoint_id)
            .collect())
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

    /// Turns the endpoint's entries from `current` (what the caller knows the map holds)
    /// into `desired`, writing only the differences: no read of the map, so an agent that
    /// remembers what it wrote regenerates thousands of endpoints in milliseconds.
    ///
    /// Revocations come first: allows the new set denies are turned into denies and allows it
    /// drops are removed; then new denies are written, then new allows, and revoked denies are
    /// removed last. So no state on the way, and none a failure stops at (the first failing
    /// write or removal ends the call), allows what the new set does not: a map too full for
    /// the new entries has already lost the revoked ones. A caller that sees the error knows
    /// the map holds neither set exactly and syncs again.
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
        diff_into(self, current, desired)
    }

    /// Removes every entry of the endpoint; returns how many.
    pub fn clear_endpoint(&self, endpoint_id: u16) -> Result<usize> {
        Ok(self.sync_endpoint(endpoint_id, &[])?.removed)
    }

    /// What the map decides for a new connection of `endpoint_id` in
    /// `direction` with a peer of `identity`: the kernel's two longest-prefix
    /// lookups, combined as the model combines them
    /// ([`Decision::of_lookups`]; the enforcement flag is not consulted).
    pub fn decide(
        &self,
        endpoint_id: u16,
        direction: Direction,
        identity: u32,
        protocol: Protocol,
        dport: u16,
    ) -> Result<Decision> {
        let dport = if protocol.has_ports() { dport } else { 0 };
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
            Ok(self.map.get(&key)?.map(|v| verdict_of(&v)))
        };
        Ok(Decision::of_lookups(lookup(identity)?, lookup(0)?))
    }
}

/// `entries` sorted by key, for [`lookup`]. Keys are unique in what `compile_policy`
/// produces and in what the map holds for an endpoint.
/// The two writes a diff makes, apart from the map so that their order is tested without one.
trait PolicyWrites {
    fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()>;
    fn delete(&self, entry: &PolicyEntry) -> Result<bool>;
}

impl PolicyWrites for PolicyMap {
    fn put(&self, entry: &PolicyEntry, verdict: Verdict) -> Result<()> {
        PolicyMap::put(self, entry, verdict)
    }

    fn delete(&self, entry: &PolicyEntry) -> Result<bool> {
        PolicyMap::delete(self, entry)
    }
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
    remove_denies(map, &current, &wanted, &mut stats)?;
    Ok(stats)
}

/// Takes back what the new set no longer allows: an allow it denies becomes a deny, an allow
/// it drops is removed. First, so that no failure later leaves a revoked allow in force; these
/// writes only change or remove keys the map holds, so a full map cannot refuse them.
fn revoke(
    map: &impl PolicyWrites,
    current: &[(PolicyEntry, Verdict)],
    wanted: &[(PolicyEntry, Verdict)],
    stats: &mut SyncStats,
) -> Result<()> {
    for (entry, _) in current.iter().filter(|(_, v)| *v == Verdict::Allow) {
        match lookup(wanted, entry) {
            Some(Verdict::Allow) => {}
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

/// Writes the entries `wanted` has with verdict `pass` that `current` does not hold so (an
/// allow turned deny is [`revoke`]'s).
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
            Some(Verdict::Allow) => {}
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

//! Privileged tests of whole-map reads: the batched read (`BPF_MAP_LOOKUP_BATCH`) of maps
//! larger than one batch, its fallback to the walk by key, and the service takeover's read of
//! the load-balancing maps built on it. Run as root.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::IpAddr;

use cellium_datapath_bpf::abi::{Lb4Key, Lb4Service, Plain};
use cellium_datapath_bpf::maps::batch::{BATCH_ENTRIES, ReadMode, for_each_entry};
use cellium_datapath_bpf::{Backend, Datapath, DatapathOptions, Frontend, Protocol};
use cellium_integration::BpffsMount;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

fn map(ty: MapType, key: u32, value: u32, max: u32) -> MapHandle {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as u64,
        // LPM tries must not be preallocated.
        map_flags: if ty == MapType::LpmTrie {
            libbpf_sys::BPF_F_NO_PREALLOC
        } else {
            0
        },
        ..Default::default()
    };
    MapHandle::create(ty, Some(OsStr::new("cel_test")), key, value, max, &opts).expect("create map")
}

/// Raw entries: (key, value) bytes.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads `map` whole; every key with its value, in the order read, and how.
fn read_all(map: &MapHandle) -> (Entries, ReadMode) {
    let mut seen = Vec::new();
    let mode = for_each_entry(map, "cel_test", |k, v| {
        seen.push((k.to_vec(), v.to_vec()));
        Ok(())
    })
    .expect("read map");
    (seen, mode)
}

/// The value stored under key `i`: eight bytes derived from it, so a value read under the
/// wrong key shows.
fn value_of(i: u32) -> [u8; 8] {
    (u64::from(i) * 0x9e37_79b9 + 1).to_ne_bytes()
}

/// Fills a map of u32 keys with `n` entries, reads it back and checks that every entry came
/// once, with its own value.
fn every_entry_once(ty: MapType, n: u32) {
    // Room to spare: an LRU map evicts before it is full (its free lists are per CPU).
    let m = map(ty, 4, 8, 4 * n);
    for i in 0..n {
        m.update(&i.to_ne_bytes(), &value_of(i), MapFlags::ANY)
            .unwrap();
    }
    // What the map holds, looked up key by key: all `n` but for an LRU eviction.
    let held: Vec<u32> = (0..n)
        .filter(|i| m.lookup(&i.to_ne_bytes(), MapFlags::ANY).unwrap().is_some())
        .collect();
    assert!(
        held.len() > 2 * BATCH_ENTRIES as usize,
        "{ty:?}: {} held",
        held.len()
    );
    let (seen, mode) = read_all(&m);
    assert_eq!(mode, ReadMode::Batched, "{ty:?}");
    let mut keys: Vec<u32> = seen
        .iter()
        .map(|(k, v)| {
            let key = u32::from_ne_bytes(k[..].try_into().unwrap());
            assert_eq!(v[..], value_of(key), "{ty:?}: the value of key {key}");
            key
        })
        .collect();
    assert_eq!(keys.len(), held.len(), "{ty:?}: entries read");
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys, held, "{ty:?}: each key once");
}

#[test]
fn a_batched_read_of_a_hash_map_larger_than_a_batch_returns_every_entry_once() {
    every_entry_once(MapType::Hash, 5 * BATCH_ENTRIES + 17);
    every_entry_once(MapType::LruHash, 3 * BATCH_ENTRIES + 1);
}

#[test]
fn a_batched_read_of_an_array_returns_every_slot_once() {
    // An array holds every index; those not written read as zeroes, so fill them all.
    let n = 2 * BATCH_ENTRIES + 5;
    let m = map(MapType::Array, 4, 8, n);
    for i in 0..n {
        m.update(&i.to_ne_bytes(), &value_of(i), MapFlags::ANY)
            .unwrap();
    }
    let (seen, mode) = read_all(&m);
    assert_eq!(mode, ReadMode::Batched);
    let keys: Vec<u32> = seen
        .iter()
        .map(|(k, v)| {
            let key = u32::from_ne_bytes(k[..].try_into().unwrap());
            assert_eq!(v[..], value_of(key));
            key
        })
        .collect();
    assert_eq!(keys, (0..n).collect::<Vec<_>>());
}

#[test]
fn empty_maps_read_as_empty() {
    let m = map(MapType::Hash, 4, 8, 64);
    let (seen, mode) = read_all(&m);
    assert!(seen.is_empty());
    assert_eq!(mode, ReadMode::Batched);
}

#[test]
fn a_map_type_without_batched_lookups_is_walked_instead() {
    // The device map has no batch operations: the kernel refuses the first batch, and every
    // entry is read by the walk. Each slot names the loopback device (ifindex 1).
    let n = BATCH_ENTRIES + 88;
    let m = map(MapType::Devmap, 4, 4, n);
    for i in 0..n {
        m.update(&i.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
            .unwrap();
    }
    let (seen, mode) = read_all(&m);
    assert_eq!(mode, ReadMode::EntryAtATime);
    let want: Entries = (0..n)
        .map(|i| (i.to_ne_bytes().to_vec(), 1u32.to_ne_bytes().to_vec()))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn an_lpm_trie_is_read_whole() {
    let m = map(MapType::LpmTrie, 8, 8, 2048);
    let mut want = BTreeMap::new();
    for i in 0..(BATCH_ENTRIES + 100) {
        let mut key = 32u32.to_ne_bytes().to_vec();
        key.extend_from_slice(&(0x0a00_0000 + i).to_be_bytes());
        m.update(&key, &value_of(i), MapFlags::ANY).unwrap();
        want.insert(key, value_of(i).to_vec());
    }
    let (seen, _) = read_all(&m);
    assert_eq!(seen.len(), want.len());
    assert_eq!(seen.into_iter().collect::<BTreeMap<_, _>>(), want);
}

#[test]
fn the_service_maps_read_whole_match_what_was_written() {
    let bpf = BpffsMount::new().unwrap();
    let dp = Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..Default::default()
    })
    .expect("open");
    let svc = dp.services();
    // More frontends, slots, backends and rev-NAT entries than one batch holds, of both
    // families.
    let mut backends = BTreeMap::new();
    for id in 1..=3 * BATCH_ENTRIES {
        let addr: IpAddr = if id % 5 == 0 {
            format!("fd00:244::{id:x}").parse().unwrap()
        } else {
            format!("10.244.{}.{}", id / 250, id % 250).parse().unwrap()
        };
        let b = Backend {
            addr,
            port: 8080,
            protocol: Protocol::Tcp,
        };
        svc.put_backend(id, &b).unwrap();
        backends.insert(id, b);
    }
    let mut frontends = BTreeMap::new();
    for n in 1..=(BATCH_ENTRIES as u16 + 300) {
        let v6 = n % 5 == 0;
        let fe = Frontend {
            vip: if v6 {
                format!("fd00:96::{n:x}").parse().unwrap()
            } else {
                format!("10.96.{}.{}", n / 250, n % 250).parse().unwrap()
            },
            port: 80 + n % 3,
            protocol: if n % 2 == 0 {
                Protocol::Tcp
            } else {
                Protocol::Udp
            },
        };
        // Backends of the frontend's family only: ids of that family, 1 to 4 of them.
        let ids: Vec<u32> = backends
            .iter()
            .filter(|(_, b)| b.addr.is_ipv6() == v6)
            .map(|(id, _)| *id)
            .skip(usize::from(n) % 50)
            .take(usize::from(n % 4) + 1)
            .collect();
        svc.put_service_with(&fe, n, &ids, (n % 4) as u8).unwrap();
        frontends.insert(fe, (n, ids));
    }
    // One frontend shrunk to one backend, with a slot past its count left over (as between
    // a shrinking write's slot 0 and its removal of the slots past the new count): not one of
    // its backends.
    let shrunk = *frontends.keys().next().unwrap();
    let (rev, ids) = frontends[&shrunk].clone();
    svc.put_service(&shrunk, rev, &ids[..1]).unwrap();
    frontends.insert(shrunk, (rev, ids[..1].to_vec()));
    let IpAddr::V4(vip) = shrunk.vip else {
        panic!("the first frontend is IPv4")
    };
    let leftover = Lb4Key {
        vip: u32::from_ne_bytes(vip.octets()),
        dport: shrunk.port.to_be(),
        slot: 2,
        protocol: shrunk.protocol.number(),
        pad: [0; 3],
    };
    let slot = Lb4Service {
        backend_id: ids[0],
        ..Default::default()
    };
    MapHandle::from_pinned_path(bpf.path().join("maps/cel_lb4_services"))
        .unwrap()
        .update(&leftover.encode(), &slot.encode(), MapFlags::ANY)
        .unwrap();

    assert_eq!(svc.backends().unwrap(), backends);
    let read = svc.services().unwrap();
    assert_eq!(read.len(), frontends.len());
    for (fe, (rev, ids)) in &frontends {
        let entry = &read[fe];
        assert_eq!(entry.rev_nat_id, *rev, "{fe:?}");
        assert_eq!(&entry.backend_ids, ids, "{fe:?}");
        // The whole read agrees with the lookups of one frontend's slots.
        assert_eq!(Some(entry), svc.service(fe).unwrap().as_ref(), "{fe:?}");
    }
    let rev_nats = svc.rev_nats().unwrap();
    assert_eq!(rev_nats.len(), frontends.len());
    for (fe, (rev, _)) in &frontends {
        assert_eq!(rev_nats[rev], (fe.vip, fe.port));
    }
}

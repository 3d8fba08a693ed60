//! Privileged tests of pinned-map reuse: what `Datapath::open` does with pins
//! left by an older or different build. Run as root.

use std::ffi::OsStr;

use cellium_datapath_bpf::{
    Backend, Datapath, DatapathOptions, Decision, Direction, L4Match, MapOrigin, PolicyEntry,
    ProgramOrigin, Protocol, Verdict,
};
use cellium_integration::BpffsMount;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

fn origin(dp: &Datapath, map: &str) -> MapOrigin {
    dp.maps_report()
        .iter()
        .find(|r| r.name == map)
        .map(|r| r.origin.clone())
        .expect("map in report")
}

fn open(bpf: &BpffsMount) -> Datapath {
    Datapath::open(DatapathOptions {
        bpf_root: bpf.path().to_owned(),
        ..Default::default()
    })
    .expect("open")
}

fn pin_map(bpf: &BpffsMount, name: &str, ty: MapType, key: u32, value: u32, max: u32) -> MapHandle {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as u64,
        ..Default::default()
    };
    let mut map =
        MapHandle::create(ty, Some(OsStr::new(name)), key, value, max, &opts).expect("create map");
    std::fs::create_dir_all(bpf.path().join("maps")).unwrap();
    map.pin(bpf.path().join("maps").join(name))
        .expect("pin map");
    map
}

#[test]
fn pins_of_another_shape_are_migrated_or_recreated() {
    let bpf = BpffsMount::new().unwrap();
    // An older build's backends map: same key and value, fewer entries.
    let old = pin_map(&bpf, "cel_lb4_backends", MapType::Hash, 4, 8, 1024);
    let backend = [10u8, 244, 0, 12, 0x1f, 0x90, 6, 0]; // 10.244.0.12:8080 TCP
    old.update(&7u32.to_ne_bytes(), &backend, MapFlags::ANY)
        .unwrap();
    // A map of the wrong type under the ipcache's name.
    let _wrong = pin_map(&bpf, "cel_ipcache", MapType::Hash, 24, 8, 16);

    let dp = open(&bpf);
    assert!(
        matches!(
            origin(&dp, "cel_lb4_backends"),
            MapOrigin::Migrated { entries: 1, .. }
        ),
        "{:?}",
        dp.maps_report()
    );
    assert!(matches!(
        origin(&dp, "cel_ipcache"),
        MapOrigin::Recreated { .. }
    ));
    assert_eq!(origin(&dp, "cel_ct4"), MapOrigin::Created);
    let b = dp.services().backend(7).unwrap().expect("migrated backend");
    assert_eq!(
        b,
        Backend {
            addr: "10.244.0.12".parse().unwrap(),
            port: 8080,
            protocol: Protocol::Tcp
        }
    );
    drop(dp);

    // Everything now matches: a second open reuses every map.
    let dp = open(&bpf);
    assert!(
        dp.maps_report()
            .iter()
            .all(|r| r.origin == MapOrigin::Reused),
        "{:?}",
        dp.maps_report()
    );
    assert!(dp.services().backend(7).unwrap().is_some());
}

/// An endpoints map of a release's layout is converted; one of a layout no release had (a
/// value of another size) is recreated, never read as this build's.
#[test]
fn a_release_layout_is_converted_and_an_unknown_one_recreated() {
    use cellium_datapath_bpf::abi::Plain;
    use cellium_datapath_bpf::abi::releases::v0_1_0;

    let bpf = BpffsMount::new().unwrap();
    let old = pin_map(&bpf, "cel_endpoints", MapType::Hash, 20, 24, 1024);
    let released = v0_1_0::EndpointInfo {
        ifindex: 9,
        id: 4,
        identity: 70000,
        ..Default::default()
    };
    let mut key = [0u8; 20];
    key[..4].copy_from_slice(&[10, 244, 0, 9]);
    key[16] = 4; // CEL_FAMILY_IPV4
    old.update(&key, &released.encode(), MapFlags::ANY).unwrap();
    drop(old);
    let dp = open(&bpf);
    match origin(&dp, "cel_endpoints") {
        MapOrigin::Migrated { entries: 1, reason } => {
            assert!(reason.contains("the layout of v0.1.0"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let e = dp
        .endpoints()
        .get("10.244.0.9".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        (e.ifindex, e.id, e.identity, e.cluster_identity),
        (9, 4, 70000, 70000)
    );
    drop(dp);

    let bpf = BpffsMount::new().unwrap();
    let unknown = pin_map(&bpf, "cel_endpoints", MapType::Hash, 20, 32, 1024);
    unknown.update(&key, &[1u8; 32], MapFlags::ANY).unwrap();
    let dp = open(&bpf);
    assert!(
        matches!(origin(&dp, "cel_endpoints"), MapOrigin::Recreated { .. }),
        "{:?}",
        dp.maps_report()
    );
    assert!(dp.endpoints().entries().unwrap().is_empty());
}

#[test]
fn a_different_layout_version_recreates_every_map() {
    let bpf = BpffsMount::new().unwrap();
    let dp = open(&bpf);
    dp.services()
        .put_backend(
            1,
            &Backend {
                addr: "10.244.0.12".parse().unwrap(),
                port: 80,
                protocol: Protocol::Tcp,
            },
        )
        .unwrap();
    dp.policy().sync_endpoint(5, &[allow_42(5)]).unwrap();
    drop(dp);

    // Stamp the pinned config with another layout version.
    let cfg = MapHandle::from_pinned_path(bpf.path().join("maps/cel_config")).unwrap();
    let mut value = cfg
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .unwrap();
    value[..4].copy_from_slice(&99u32.to_ne_bytes());
    cfg.update(&0u32.to_ne_bytes(), &value, MapFlags::ANY)
        .unwrap();

    let dp = open(&bpf);
    assert!(
        loaded_because(&dp).contains("layout version 99"),
        "{:?}",
        dp.program_origin()
    );
    for r in dp.maps_report() {
        match &r.origin {
            MapOrigin::Recreated { reason } => {
                assert!(reason.contains("layout version 99"), "{reason}")
            }
            other => panic!("{} was {other}", r.name),
        }
    }
    assert!(
        dp.services().backend(1).unwrap().is_none(),
        "entries of another layout must not be read"
    );
    assert!(
        dp.policy().endpoint_ids().unwrap().is_empty(),
        "nor an endpoint's policy map"
    );
    assert!(!bpf.path().join("maps/cel_policy_5").exists());
    assert_eq!(
        dp.config().get().unwrap().layout_version,
        cellium_datapath_bpf::LAYOUT_VERSION
    );
}

fn programs(dp: &Datapath) -> &ProgramOrigin {
    dp.program_origin()
}

/// The directories under `<bpf>/programs`, by name.
fn program_dirs(bpf: &BpffsMount) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(bpf.path().join("programs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn the_program_dir(bpf: &BpffsMount) -> std::path::PathBuf {
    let dirs = program_dirs(bpf);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    bpf.path().join("programs").join(&dirs[0])
}

fn loaded_because(dp: &Datapath) -> String {
    match programs(dp) {
        ProgramOrigin::Loaded { reason } => reason.clone(),
        ProgramOrigin::Reused => panic!("the pinned programs were reused"),
    }
}

#[test]
fn a_second_open_of_the_same_build_reuses_the_programs_it_pinned() {
    let bpf = BpffsMount::new().unwrap();
    let first = open(&bpf);
    assert!(loaded_because(&first).contains("no programs pinned"));
    let ids = first.program_ids().unwrap();
    drop(first);

    let second = open(&bpf);
    assert_eq!(programs(&second), &ProgramOrigin::Reused);
    assert_eq!(second.program_ids().unwrap(), ids);
    assert!(
        second
            .maps_report()
            .iter()
            .all(|r| r.origin == MapOrigin::Reused)
    );
    // Every pinned map of the object is there, by the handles the programs use.
    let pinned = std::fs::read_dir(bpf.path().join("maps")).unwrap().count();
    assert_eq!(second.maps_report().len(), pinned);
}

/// Programs that cannot be pinned (here `<bpf>/programs` is a symlink to nowhere, which no
/// directory can be made through) are loaded all the same, and loaded again, verified, at the
/// next open; once pinning works again, the open after the one that pinned reuses them.
#[test]
fn programs_that_cannot_be_pinned_are_loaded_and_verified_again_next_time() {
    let bpf = BpffsMount::new().unwrap();
    let programs_dir = bpf.path().join("programs");
    std::os::unix::fs::symlink("/nonexistent/cellium", &programs_dir).unwrap();
    for open_number in 1..=2 {
        let dp = open(&bpf);
        assert!(dp.program_ids().is_ok(), "open {open_number}: loaded");
        let reason = loaded_because(&dp);
        assert!(
            reason.contains("no programs pinned"),
            "open {open_number}: {reason}"
        );
    }
    std::fs::remove_file(&programs_dir).unwrap();
    assert!(loaded_because(&open(&bpf)).contains("no programs pinned"));
    assert_eq!(programs(&open(&bpf)), &ProgramOrigin::Reused);
}

#[test]
fn programs_whose_maps_were_replaced_are_loaded_afresh() {
    let bpf = BpffsMount::new().unwrap();
    let first = open(&bpf);
    let ids = first.program_ids().unwrap();
    drop(first);

    // Another map of the very same shape pinned under the ipcache's name: the pinned
    // programs still use the old one, which no handle of the agent would reach.
    let path = bpf.path().join("maps/cel_ipcache");
    let old = MapHandle::from_pinned_path(&path).unwrap();
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as u64,
        map_flags: old.info().unwrap().info.map_flags,
        ..Default::default()
    };
    let mut new = MapHandle::create(
        old.map_type(),
        Some(OsStr::new("cel_ipcache")),
        old.key_size(),
        old.value_size(),
        old.max_entries(),
        &opts,
    )
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    new.pin(&path).unwrap();

    let second = open(&bpf);
    let reason = loaded_because(&second);
    assert!(reason.contains("no longer pinned"), "{reason}");
    assert_ne!(second.program_ids().unwrap(), ids);
    assert_eq!(origin(&second, "cel_ipcache"), MapOrigin::Reused);
    drop(second);
    // Pinned anew: the next open takes them.
    assert_eq!(programs(&open(&bpf)), &ProgramOrigin::Reused);
}

#[test]
fn a_missing_program_pin_or_another_builds_programs_load_afresh() {
    let bpf = BpffsMount::new().unwrap();
    drop(open(&bpf));
    let dir = the_program_dir(&bpf);
    std::fs::remove_file(dir.join("cel_to_container")).unwrap();
    let dp = open(&bpf);
    let reason = loaded_because(&dp);
    assert!(reason.contains("cel_to_container"), "{reason}");
    drop(dp);

    // Another build's directory and what an interrupted pinning left are removed when
    // this build pins its own.
    let tag = program_dirs(&bpf).remove(0);
    let programs = bpf.path().join("programs");
    std::fs::rename(
        programs.join(&tag),
        programs.join("0123456789abcdef-layout0-libbpf1-0"),
    )
    .unwrap();
    std::fs::create_dir(programs.join("staging")).unwrap();
    let dp = open(&bpf);
    assert!(loaded_because(&dp).contains("no programs pinned"));
    assert_eq!(program_dirs(&bpf), vec![tag]);
}

/// An allow of anything into endpoint `id` from identity 42.
fn allow_42(id: u16) -> (PolicyEntry, Verdict) {
    let entry = PolicyEntry {
        endpoint_id: id,
        direction: Direction::Ingress,
        identity: 42,
        l4: L4Match::Any,
    };
    (entry, Verdict::Allow)
}

fn decides(dp: &Datapath, id: u16) -> Decision {
    dp.policy()
        .decide(id, Direction::Ingress, 42, Protocol::Tcp, 80)
        .unwrap()
}

#[test]
fn the_shared_policy_map_of_an_older_build_gives_way_to_per_endpoint_maps() {
    let bpf = BpffsMount::new().unwrap();
    // The older build's single LPM trie of every endpoint's entries.
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: size_of::<libbpf_sys::bpf_map_create_opts>() as u64,
        map_flags: libbpf_sys::BPF_F_NO_PREALLOC,
        ..Default::default()
    };
    let mut old = MapHandle::create(
        MapType::LpmTrie,
        Some(OsStr::new("cel_policy")),
        16,
        8,
        262_144,
        &opts,
    )
    .unwrap();
    std::fs::create_dir_all(bpf.path().join("maps")).unwrap();
    old.pin(bpf.path().join("maps/cel_policy")).unwrap();

    let dp = open(&bpf);
    assert!(
        matches!(origin(&dp, "cel_policy"), MapOrigin::Recreated { .. }),
        "{:?}",
        dp.maps_report()
    );
    dp.policy().sync_endpoint(3, &[allow_42(3)]).unwrap();
    assert_eq!(decides(&dp, 3), Decision::Allowed);
    assert!(bpf.path().join("maps/cel_policy_3").exists());
    drop(dp);
    // And the next start reuses it all.
    let dp = open(&bpf);
    assert_eq!(origin(&dp, "cel_policy"), MapOrigin::Reused);
    assert_eq!(decides(&dp, 3), Decision::Allowed);
}

#[test]
fn endpoint_policy_maps_outlive_a_recreated_outer_map_through_their_pins() {
    let bpf = BpffsMount::new().unwrap();
    let dp = open(&bpf);
    dp.policy().sync_endpoint(7, &[allow_42(7)]).unwrap();
    dp.policy().sync_endpoint(8, &[]).unwrap();
    assert_eq!(dp.policy().endpoint_ids().unwrap().len(), 2);
    drop(dp);

    // Another definition under the outer map's name: it is recreated empty.
    let path = bpf.path().join("maps/cel_policy");
    std::fs::remove_file(&path).unwrap();
    let _other = pin_map(&bpf, "cel_policy", MapType::Hash, 4, 4, 16);
    let dp = open(&bpf);
    assert!(
        matches!(origin(&dp, "cel_policy"), MapOrigin::Recreated { .. }),
        "{:?}",
        dp.maps_report()
    );
    // The endpoints' own maps are put back from their pins, the empty one too.
    let mut ids = dp.policy().endpoint_ids().unwrap();
    ids.sort_unstable();
    assert_eq!(ids, [7, 8]);
    assert_eq!(decides(&dp, 7), Decision::Allowed);

    // Removing one takes its pin: the next open does not bring it back.
    assert_eq!(dp.policy().clear_endpoint(7).unwrap(), 1);
    assert!(!bpf.path().join("maps/cel_policy_7").exists());
    drop(dp);
    let dp = open(&bpf);
    assert_eq!(dp.policy().endpoint_ids().unwrap(), [8]);
    assert_eq!(decides(&dp, 7), Decision::NoMatch);
}

#[test]
fn an_endpoint_map_sized_for_another_limit_is_replaced_whole_at_its_next_write() {
    let bpf = BpffsMount::new().unwrap();
    let dp = open(&bpf);
    dp.policy().set_endpoint_max(64);
    dp.policy().sync_endpoint(4, &[allow_42(4)]).unwrap();
    assert_eq!(dp.policy().endpoint_map_max(4).unwrap(), Some(64));
    // The limit raised (an agent restarted with another bpf-policy-map-max).
    dp.policy().set_endpoint_max(128);
    let more: Vec<_> = (0..100u32)
        .map(|i| {
            let (mut entry, verdict) = allow_42(4);
            entry.identity = 1000 + i;
            (entry, verdict)
        })
        .chain([allow_42(4)])
        .collect();
    dp.policy().sync_endpoint(4, &more).unwrap();
    assert_eq!(dp.policy().endpoint_map_max(4).unwrap(), Some(128));
    assert_eq!(dp.policy().endpoint_entries(4).unwrap().len(), 101);
    assert_eq!(decides(&dp, 4), Decision::Allowed);
    // Its pin is the new map's: the next start finds it.
    drop(dp);
    let dp = open(&bpf);
    assert_eq!(dp.policy().endpoint_map_max(4).unwrap(), Some(128));
}

/// The kernel id of the map `cel_policy` holds for `endpoint`: what the datapath looks up.
fn inner_map_id(bpf: &BpffsMount, endpoint: u16) -> Option<u32> {
    let outer = MapHandle::from_pinned_path(bpf.path().join("maps/cel_policy")).unwrap();
    outer
        .lookup(&u32::from(endpoint).to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .map(|v| u32::from_ne_bytes(v[..4].try_into().unwrap()))
}

#[test]
fn spare_endpoint_maps_serve_the_next_endpoints_and_retired_maps_allow_nothing() {
    let bpf = BpffsMount::new().unwrap();
    let dp = open(&bpf);
    // Spares for the next ids: empty, pinned, in cel_policy.
    assert_eq!(dp.policy().maintain(&[5, 6]).unwrap(), 2);
    let spare = inner_map_id(&bpf, 5).expect("a spare for 5");
    assert!(bpf.path().join("maps/cel_policy_5").exists());
    assert_eq!(decides(&dp, 5), Decision::NoMatch);
    assert_eq!(dp.policy().maintain(&[5, 6]).unwrap(), 0, "already there");
    // The endpoint that gets id 5 writes into its spare: cel_policy does not change.
    dp.policy().apply_diff(5, &[], &[allow_42(5)]).unwrap();
    assert_eq!(inner_map_id(&bpf, 5), Some(spare));
    assert_eq!(decides(&dp, 5), Decision::Allowed);

    // Retired: emptied and unpinned at once, read as gone, still in cel_policy.
    dp.policy().retire_endpoint(5).unwrap();
    assert!(!bpf.path().join("maps/cel_policy_5").exists());
    assert!(!dp.policy().endpoint_ids().unwrap().contains(&5));
    assert_eq!(inner_map_id(&bpf, 5), Some(spare));
    let held = MapHandle::from_map_id(spare).unwrap();
    assert_eq!(held.keys().count(), 0, "the retired map allows nothing");
    // A new endpoint with that id before the map is out gets a map of its own.
    dp.policy().apply_diff(5, &[], &[]).unwrap();
    assert_ne!(inner_map_id(&bpf, 5), Some(spare));
    assert!(dp.policy().endpoint_ids().unwrap().contains(&5));
    assert!(bpf.path().join("maps/cel_policy_5").exists());

    // The next pass takes retired maps out of cel_policy.
    dp.policy().retire_endpoint(5).unwrap();
    dp.policy().retire_endpoint(6).unwrap();
    assert_eq!(dp.policy().maintain(&[]).unwrap(), 0);
    assert_eq!(inner_map_id(&bpf, 5), None);
    assert_eq!(inner_map_id(&bpf, 6), None);
    drop(dp);
    assert!(open(&bpf).policy().endpoint_ids().unwrap().is_empty());
}

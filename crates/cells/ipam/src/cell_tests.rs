//! The cell in a hive with a real state directory: what survives a restart, and what a
//! broken or unreadable record does.

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cellium_hive::{ConfigSources, Hive, Level, Module};

use crate::{Error, Ipam, RECORD_FILE};

/// A started agent of two cells (statedir, ipam) on `dir`, and its allocator.
async fn agent(dir: &Path, quarantine: &str) -> (Hive, Arc<Ipam>) {
    let slot: Arc<Mutex<Option<Arc<Ipam>>>> = Arc::default();
    let s = slot.clone();
    let mut hive = Hive::new([
        cellium_statedir::cell().into(),
        crate::cell().into(),
        Module::new("user", "x")
            .invoke(move |ipam: Arc<Ipam>| *s.lock().unwrap() = Some(ipam))
            .into(),
    ])
    .with_config(
        ConfigSources::new()
            .flag("state-dir", dir)
            .flag("pod-cidr", vec!["10.7.0.0/29"])
            .flag("ipam-release-quarantine", quarantine),
    );
    hive.start().await.unwrap();
    let ipam = slot.lock().unwrap().clone().unwrap();
    (hive, ipam)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn health(hive: &Hive) -> (Level, String) {
    let n = hive.health().node("ipam").unwrap();
    (n.status.level, n.status.message)
}

#[tokio::test]
async fn the_cursor_and_the_quarantine_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut hive, ipam) = agent(tmp.path(), "1h").await;
    assert_eq!(health(&hive).0, Level::Ok, "{:?}", health(&hive));
    let got: Vec<IpAddr> = (0..3)
        .map(|_| ipam.allocate_next(4, "pod").unwrap().ip)
        .collect();
    assert_eq!(got, [ip("10.7.0.2"), ip("10.7.0.3"), ip("10.7.0.4")]);
    ipam.release(ip("10.7.0.3"));
    let Err(Error::Quarantined {
        released, until, ..
    }) = ipam.allocate(ip("10.7.0.3"), "p")
    else {
        panic!("not in quarantine");
    };
    hive.stop().await.unwrap();

    let (mut hive, ipam) = agent(tmp.path(), "1h").await;
    let (level, message) = health(&hive);
    assert_eq!(level, Level::Ok);
    assert!(
        message.contains("1 cursors and 1 addresses in quarantine restored"),
        "{message}"
    );
    // The endpoints that held .2 and .4 re-reserve them, whatever the quarantine.
    ipam.restore(ip("10.7.0.2"), "pod").unwrap();
    ipam.restore(ip("10.7.0.4"), "pod").unwrap();
    // Round robin goes on after .4, not from the start, and skips .3.
    assert_eq!(ipam.allocate_next(4, "new").unwrap().ip, ip("10.7.0.5"));
    assert_eq!(ipam.allocate_next(4, "new").unwrap().ip, ip("10.7.0.6"));
    let err = ipam.allocate_next(4, "new").unwrap_err();
    assert!(
        matches!(err, Error::Exhausted { quarantined: 1, .. }),
        "{err}"
    );
    // Same release time as before the restart (to the millisecond it is recorded with).
    let Err(Error::Quarantined {
        released: again,
        until: until_again,
        ..
    }) = ipam.allocate(ip("10.7.0.3"), "p")
    else {
        panic!("the quarantine was lost in the restart");
    };
    let ms = |t: Option<std::time::SystemTime>| {
        t.map(|t| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis())
    };
    assert_eq!(ms(again), ms(released));
    assert_eq!(ms(Some(until_again)), ms(Some(until)));
    hive.stop().await.unwrap();
}

#[tokio::test]
async fn a_write_that_fails_fails_the_call_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut hive, ipam) = agent(tmp.path(), "1h").await;
    let held = ipam.allocate_next(4, "pod").unwrap().ip;
    // A directory where the record goes: every atomic replace of it fails (EISDIR), as
    // a full or read-only disk would make it fail.
    let record = tmp.path().join(RECORD_FILE);
    std::fs::remove_file(&record).unwrap();
    std::fs::create_dir(&record).unwrap();
    std::fs::write(record.join("keep"), b"x").unwrap();

    let err = ipam.allocate_next(4, "pod-2").unwrap_err();
    assert!(matches!(err, Error::Record { .. }), "{err}");
    assert_eq!(ipam.pools()[0].used, 1, "nothing allocated");
    let err = ipam.try_release(held).unwrap_err();
    assert!(matches!(err, Error::Record { .. }), "{err}");
    assert_eq!(ipam.owner(held).as_deref(), Some("pod"), "nothing released");
    let (level, message) = health(&hive);
    assert_eq!(level, Level::Degraded);
    assert!(message.contains("cannot write ipam.json"), "{message}");
    // A requested address changes no cursor and no quarantine: no write, no failure.
    ipam.allocate(ip("10.7.0.6"), "pod-3").unwrap();

    std::fs::remove_dir_all(&record).unwrap();
    assert_eq!(ipam.allocate_next(4, "pod-2").unwrap().ip, ip("10.7.0.3"));
    assert_eq!(health(&hive).0, Level::Ok, "{:?}", health(&hive));
    hive.stop().await.unwrap();
}

#[tokio::test]
async fn an_unreadable_record_degrades_and_keeps_every_free_address_in_quarantine() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join(RECORD_FILE),
        b"{\"version\": 1, \"cursors\"",
    )
    .unwrap();
    let (mut hive, ipam) = agent(tmp.path(), "1h").await;
    let (level, message) = health(&hive);
    assert_eq!(level, Level::Degraded);
    assert!(
        message.contains("ipam.json cannot be decoded")
            && message.contains("ipam.json.corrupt")
            && message.contains("in quarantine until"),
        "{message}"
    );
    assert!(tmp.path().join("ipam.json.corrupt").exists());
    // Restored endpoints get their addresses back...
    ipam.restore(ip("10.7.0.4"), "endpoint 1").unwrap();
    // ...but nothing else is handed out until the period is over.
    let err = ipam.allocate_next(4, "new").unwrap_err();
    assert!(
        matches!(err, Error::Exhausted { quarantined: 4, .. }),
        "{err}"
    );
    let err = ipam.allocate(ip("10.7.0.2"), "new").unwrap_err();
    assert!(
        matches!(err, Error::Quarantined { released: None, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("could not be read at start"),
        "{err}"
    );
    hive.stop().await.unwrap();

    // The blanket is recorded: a restart within the period keeps it, and says why.
    let (mut hive, ipam) = agent(tmp.path(), "1h").await;
    assert_eq!(health(&hive).0, Level::Degraded);
    assert!(ipam.allocate(ip("10.7.0.2"), "new").is_err());
    hive.stop().await.unwrap();
}

#[tokio::test]
async fn without_a_quarantine_an_unreadable_record_blocks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(RECORD_FILE), b"not json").unwrap();
    let (mut hive, ipam) = agent(tmp.path(), "0s").await;
    ipam.allocate(ip("10.7.0.2"), "new").unwrap();
    let a = ipam.allocate_next(4, "new").unwrap();
    ipam.release(a.ip);
    ipam.allocate(a.ip, "again").unwrap();
    hive.stop().await.unwrap();
}

#[tokio::test]
async fn a_hostile_record_cannot_block_addresses_for_long_or_move_the_cursor_out() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join(RECORD_FILE),
        br#"{"version": 1,
             "cursors": {"10.7.0.0/29": "10.7.0.7", "10.99.0.0/24": "10.99.0.9"},
             "quarantine": {"10.7.0.2": 99999999999999, "192.0.2.1": 1},
             "all-until": 99999999999999}"#,
    )
    .unwrap();
    let (mut hive, ipam) = agent(tmp.path(), "1m").await;
    let now = std::time::SystemTime::now();
    for (addr, until) in ipam.quarantined() {
        assert!(addr == ip("10.7.0.2"), "{addr}");
        let left = until.duration_since(now).unwrap_or_default();
        assert!(left <= std::time::Duration::from_secs(60), "{left:?}");
    }
    let err = ipam.allocate(ip("10.7.0.5"), "x").unwrap_err();
    let Error::Quarantined { until, .. } = err else {
        panic!("{err}");
    };
    assert!(until.duration_since(now).unwrap_or_default() <= std::time::Duration::from_secs(60));
    hive.stop().await.unwrap();
}

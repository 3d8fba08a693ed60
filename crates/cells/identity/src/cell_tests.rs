//! The cell in a hive: restore at start, the persist job, the final write at stop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellium_hive::{ConfigSources, Hive, Module};
use cellium_labels::Labels;

use crate::Identities;

fn hive(dir: &std::path::Path, slot: Arc<Mutex<Option<Arc<Identities>>>>) -> Hive {
    Hive::new([
        cellium_statedir::cell().into(),
        crate::cell().into(),
        Module::new("probe", "Takes the identities")
            .invoke(move |ids: Arc<Identities>| *slot.lock().unwrap() = Some(ids))
            .into(),
    ])
    .with_config(ConfigSources::new().flag("state-dir", dir))
}

fn labels(s: &str) -> Labels {
    s.parse().unwrap()
}

#[tokio::test]
async fn numbers_survive_an_agent_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let slot = Arc::new(Mutex::new(None));
    let mut first = hive(tmp.path(), slot.clone());
    first.start().await.unwrap();
    let ids = slot.lock().unwrap().take().unwrap();
    let web = ids.allocate(&labels("k8s:app=web")).unwrap();
    let db = ids.allocate(&labels("k8s:app=db")).unwrap();
    ids.release(web.id);
    // The persist job writes soon after the change, without waiting for the stop.
    let mut written = None;
    for _ in 0..200 {
        written = std::fs::read_to_string(tmp.path().join("identities.json")).ok();
        if written
            .as_deref()
            .is_some_and(|t| t.contains("k8s:app=db") && !t.contains("web"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let written = written.unwrap_or_default();
    assert!(
        written.contains("k8s:app=db") && !written.contains("web"),
        "{written}"
    );
    let later = ids.allocate(&labels("k8s:app=later")).unwrap();
    // The stop hook writes what the job has not yet.
    first.stop().await.unwrap();

    let mut second = hive(tmp.path(), slot.clone());
    second.start().await.unwrap();
    let ids = slot.lock().unwrap().take().unwrap();
    assert_eq!(ids.lookup(&labels("k8s:app=db")).unwrap().id, db.id);
    assert_eq!(ids.allocate(&labels("k8s:app=later")).unwrap().id, later.id);
    assert!(ids.lookup(&labels("k8s:app=web")).is_none());
    assert_eq!(ids.release_unclaimed(), vec![db.id]);
    let health = second.health();
    let node = health.node("identity").unwrap();
    assert_eq!(node.status.message, "2 identities restored");
    second.stop().await.unwrap();
}

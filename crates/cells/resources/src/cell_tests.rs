//! The cell in a hive: restore at start and the module's health.

use std::sync::{Arc, Mutex};

use cellium_hive::{ConfigSources, Hive, Level, Module};

use crate::Resources;

fn hive(dir: &std::path::Path, slot: Arc<Mutex<Option<Arc<Resources>>>>) -> Hive {
    Hive::new([
        cellium_statedir::cell().into(),
        crate::cell().into(),
        Module::new("probe", "Takes the resources")
            .invoke(move |r: Arc<Resources>| *slot.lock().unwrap() = Some(r))
            .into(),
    ])
    .with_config(ConfigSources::new().flag("state-dir", dir))
}

const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n";
const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\nspec: {containers: [{name: c}]}\n";

#[tokio::test]
async fn restored_objects_report_ok_and_records_that_do_not_load_degraded() {
    let tmp = tempfile::tempdir().unwrap();
    let slot = Arc::new(Mutex::new(None));
    let mut first = hive(tmp.path(), slot.clone());
    first.start().await.unwrap();
    let r = slot.lock().unwrap().take().unwrap();
    r.apply("app.yaml", &format!("{NS}---\n{POD}")).unwrap();
    let node = first.health().node("resources").unwrap();
    assert_eq!(node.status.level, Level::Ok);
    assert_eq!(node.status.message, "5 objects in force, all recorded");
    first.stop().await.unwrap();

    // The namespace's record is lost: the pod's no longer loads, and says so.
    std::fs::remove_file(tmp.path().join("resources/Namespace~~shop.yaml")).unwrap();
    let mut second = hive(tmp.path(), slot.clone());
    second.start().await.unwrap();
    let r = slot.lock().unwrap().take().unwrap();
    let node = second.health().node("resources").unwrap();
    assert_eq!(node.status.level, Level::Degraded);
    assert!(
        node.status.message.starts_with("3 objects in force; 1 records kept on disk but not in force: resources/Pod~shop~web.yaml: 1 invalid document(s)"),
        "{}",
        node.status.message
    );
    assert!(tmp.path().join("resources/Pod~shop~web.yaml").exists());
    // Applying the namespace and the pod again puts them back in force.
    r.apply("app.yaml", &format!("{NS}---\n{POD}")).unwrap();
    let node = second.health().node("resources").unwrap();
    assert_eq!(node.status.level, Level::Ok, "{}", node.status.message);
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_change_that_cannot_be_recorded_is_degraded_until_one_is() {
    let tmp = tempfile::tempdir().unwrap();
    let slot = Arc::new(Mutex::new(None));
    let mut h = hive(tmp.path(), slot.clone());
    h.start().await.unwrap();
    let r = slot.lock().unwrap().take().unwrap();
    // The journal's directory cannot be made: a file stands in its way.
    std::fs::create_dir_all(tmp.path().join("resources")).unwrap();
    std::fs::write(tmp.path().join("resources/journal"), b"").unwrap();
    assert!(r.apply("ns.yaml", NS).is_err());
    let node = h.health().node("resources").unwrap();
    assert_eq!(node.status.level, Level::Degraded);
    assert!(
        node.status
            .message
            .contains("last change refused: ns.yaml: cannot record the change"),
        "{}",
        node.status.message
    );
    std::fs::remove_file(tmp.path().join("resources/journal")).unwrap();
    r.apply("ns.yaml", NS).unwrap();
    let node = h.health().node("resources").unwrap();
    assert_eq!(node.status.level, Level::Ok, "{}", node.status.message);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_record_directory_that_cannot_be_read_is_degraded() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("resources"), b"not a directory").unwrap();
    let slot = Arc::new(Mutex::new(None));
    let mut h = hive(tmp.path(), slot.clone());
    h.start().await.unwrap();
    let node = h.health().node("resources").unwrap();
    assert_eq!(node.status.level, Level::Degraded);
    assert!(
        node.status.message.contains("resources/: list ")
            && node
                .status
                .message
                .contains("Not a directory (os error 20)"),
        "{}",
        node.status.message
    );
    assert_eq!(
        std::fs::read(tmp.path().join("resources")).unwrap(),
        b"not a directory",
        "kept"
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn the_policy_directory_feeds_the_tables_through_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    let policies = tmp.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::write(policies.join("0-ns.yaml"), NS).unwrap();
    std::fs::write(policies.join("1-pod.yaml"), POD).unwrap();
    let slot = Arc::new(Mutex::new(None));
    let mut h = hive(tmp.path(), slot.clone()).with_config(
        ConfigSources::new()
            .flag("state-dir", tmp.path())
            .flag("policy-dir", &policies),
    );
    h.start().await.unwrap();
    let r = slot.lock().unwrap().take().unwrap();
    for _ in 0..500 {
        if r.pods.len() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(r.pods.len(), 1);
    assert!(tmp.path().join("resources/Pod~shop~web.yaml").exists());
    // The objects are in the tables a moment before the job's run ends and reports.
    let mut job = h.health().node("resources.policy-dir").unwrap();
    for _ in 0..500 {
        if job.status.level != Level::Unknown {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        job = h.health().node("resources.policy-dir").unwrap();
    }
    assert_eq!(job.status.level, Level::Ok, "{}", job.status.message);
    h.stop().await.unwrap();
}

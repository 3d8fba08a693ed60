//! An apply killed (SIGKILL) at any point: after the restart, every object of the file is in
//! force or none is, and no temp file is left.
//!
//! The test runs itself as a child process (the ignored test below, selected with `--exact`)
//! that applies and deletes one multi-document file in a loop on a state directory, kills it
//! after a random delay, and restores the directory in a fresh hive, many times over. Each
//! kill lands somewhere in decoding, the journal write, the merge or the table writes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cellium_hive::{ConfigSources, Hive, Module};
use cellium_resources::{ObjectKey, Resources};

const STATE_DIR_VAR: &str = "RESOURCES_KILL_TEST_STATE_DIR";
const ROUNDS: usize = 60;
const POLICIES: usize = 20;
const SERVICES: usize = 5;

fn file() -> String {
    let mut docs = vec!["apiVersion: v1\nkind: Namespace\nmetadata: {name: kill}\n".to_string()];
    for i in 0..POLICIES {
        docs.push(format!("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p{i}, namespace: kill}}\nspec: {{podSelector: {{matchLabels: {{app: a{i}}}}}, ingress: [{{ports: [{{port: {}}}]}}]}}\n", 1000 + i));
    }
    for i in 0..SERVICES {
        docs.push(format!("apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: kill}}\nspec: {{ports: [{{port: 80}}]}}\n"));
    }
    docs.join("---\n")
}

fn hive(dir: &Path, slot: Arc<Mutex<Option<Arc<Resources>>>>) -> Hive {
    Hive::new([
        cellium_statedir::cell().into(),
        cellium_resources::cell().into(),
        Module::new("probe", "Takes the resources")
            .invoke(move |r: Arc<Resources>| *slot.lock().unwrap() = Some(r))
            .into(),
    ])
    .with_config(ConfigSources::new().flag("state-dir", dir))
}

#[tokio::test]
#[ignore = "the child process of killed_at_any_point_a_file_is_in_force_whole_or_not_at_all"]
async fn child_applies_and_deletes_until_killed() {
    let Some(dir) = std::env::var_os(STATE_DIR_VAR) else {
        return;
    };
    let slot = Arc::new(Mutex::new(None));
    let mut h = hive(Path::new(&dir), slot.clone());
    h.start().await.unwrap();
    let r = slot.lock().unwrap().take().unwrap();
    let text = file();
    println!("ready");
    loop {
        r.apply("kill.yaml", &text).unwrap();
        r.delete("kill.yaml", &text).unwrap();
    }
}

/// What the objects of the file are after a restart: how many are in force.
async fn in_force(dir: &Path) -> usize {
    let slot = Arc::new(Mutex::new(None));
    let mut h = hive(dir, slot.clone());
    h.start().await.unwrap();
    let r = slot.lock().unwrap().take().unwrap();
    let ns = usize::from(r.namespaces.get(&ObjectKey::cluster("kill")).is_some());
    let count = ns
        + r.network_policies.list_namespace("kill").len()
        + r.services.list_namespace("kill").len();
    let health = h.health().node("resources").unwrap().status;
    assert_eq!(health.level, cellium_hive::Level::Ok, "{}", health.message);
    h.stop().await.unwrap();
    count
}

fn files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path.display().to_string());
        }
    }
}

#[tokio::test]
async fn killed_at_any_point_a_file_is_in_force_whole_or_not_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let exe = std::env::current_exe().unwrap();
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let (mut all, mut none, mut journal_at_kill, mut temp_at_kill) = (0, 0, 0, 0);
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "child_applies_and_deletes_until_killed",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STATE_DIR_VAR, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.ends_with("ready"));
        assert!(ready, "the child never got ready");
        // xorshift: a delay of 0 to 40 ms into the loop of applies and deletes.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 40_000));
        child.kill().unwrap();
        child.wait().unwrap();

        let mut left = Vec::new();
        files(&dir, &mut left);
        journal_at_kill += usize::from(
            left.iter()
                .any(|f| f.contains("/journal/") && f.ends_with(".json")),
        );
        temp_at_kill += usize::from(left.iter().any(|f| f.ends_with(".tmp")));

        let count = in_force(&dir).await;
        let whole = 1 + POLICIES + SERVICES;
        assert!(
            count == 0 || count == whole,
            "round {round}: {count} of the file's {whole} objects are in force"
        );
        if count == 0 {
            none += 1
        } else {
            all += 1
        }
        let mut after = Vec::new();
        files(&dir, &mut after);
        assert!(
            !after.iter().any(|f| f.ends_with(".tmp")),
            "round {round}: temp files left: {after:?}"
        );
    }
    println!(
        "{ROUNDS} kills: the file in force {all} times, not at all {none} times; a journal file was pending at {journal_at_kill} kills, a temp file at {temp_at_kill}"
    );
    assert!(
        all > 0 && none > 0,
        "every kill landed on the same side: {all} all, {none} none"
    );
}

//! `Agent.Status` of a running hive: the notes cells contribute and the readiness the health
//! tree implies, read through the real socket as `cellium status` and the CNI plugin read them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cellium_api::v1::StatusRequest;
use cellium_api::v1::agent_client::AgentClient;
use cellium_api::{DatapathModules, StatusNote};
use cellium_hive::{ConfigSources, Hive, Module, Reporter};

/// A cell that contributes a note while `on` holds, and reports itself degraded.
fn noisy(on: Arc<AtomicBool>) -> Module {
    Module::new("noisy", "Contributes a note and reports trouble")
        .contribute(move || {
            let on = on.clone();
            Arc::new(StatusNote::new(move || {
                on.load(Ordering::Relaxed).then(|| {
                    "every endpoint is locked down: a recorded policy does not load".to_string()
                })
            }))
        })
        .invoke(|reporter: Reporter| reporter.degraded("cannot reach something"))
}

#[tokio::test]
async fn notes_and_readiness_come_from_the_cells() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let on = Arc::new(AtomicBool::new(true));
    let cells = [
        cellium_api_server::cell()
            .provide(|| Arc::new(DatapathModules::new(["noisy"])))
            .into(),
        noisy(on.clone()).into(),
    ];
    let mut hive = Hive::new(cells).with_config(ConfigSources::new().flag("api-socket", &socket));
    hive.start().await.unwrap();

    let mut client = AgentClient::new(cellium_api::connect(&socket).await.unwrap());
    let status = client.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(
        status.notes,
        ["every endpoint is locked down: a recorded policy does not load"]
    );
    let readiness = status.readiness.unwrap();
    assert!(!readiness.serves_add);
    assert!(readiness.running_pods_affected);
    let causes: Vec<(&str, &str)> = readiness
        .causes
        .iter()
        .map(|c| (c.id.as_str(), c.message.as_str()))
        .collect();
    assert_eq!(causes, [("noisy", "cannot reach something")]);

    // A note is asked on every call: once its condition ends, it is gone.
    on.store(false, Ordering::Relaxed);
    let status = client.status(StatusRequest {}).await.unwrap().into_inner();
    assert!(status.notes.is_empty(), "{:?}", status.notes);
    hive.stop().await.unwrap();
}

/// An idle client that keeps its connection open and never reads it (a suspended CLI, a
/// process whose runtime is busy elsewhere) does not hold the agent's stop: calls get a short
/// grace, then the connections are cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_does_not_hold_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let cells = [cellium_api_server::cell()
        .provide(|| Arc::new(DatapathModules::new(["none"])))
        .into()];
    let mut hive = Hive::new(cells).with_config(ConfigSources::new().flag("api-socket", &socket));
    hive.start().await.unwrap();
    // The client lives on a runtime of its own that, after one call, is never driven again.
    let (called, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let path = socket.clone();
    let client = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let mut c = AgentClient::new(cellium_api::connect(&path).await.unwrap());
            c.status(StatusRequest {}).await.unwrap();
            c
        });
        called.0.send(()).unwrap();
        let _ = release.1.recv();
        drop(client);
    });
    called.1.recv().unwrap();
    let began = std::time::Instant::now();
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(15), hive.stop()).await;
    let took = began.elapsed();
    release.0.send(()).unwrap();
    client.join().unwrap();
    assert!(
        stopped.is_ok(),
        "the stop waited more than 15 s for an idle client"
    );
    stopped.unwrap().unwrap();
    assert!(
        took < std::time::Duration::from_secs(5),
        "the stop took {took:?}"
    );
}

//! A recorded policy that no longer loads at a restart locks down every endpoint of its
//! namespace: the agent cannot tell whom that policy restricted, so it fails closed there, says
//! why, and lifts the lockdown once the record is applied again or deleted.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test lockdown -- --test-threads=1`.

use std::time::Duration;

use cellium_integration::AgentOptions;
use cellium_integration::NetNs;
use cellium_integration::lab::{Lab, fixture};
use cellium_integration::reach::{self, Outcome, Probe};
use cellium_integration::serial;

/// Only `shop/web` may reach `shop/db`, on 5432.
const DB_POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
metadata: { name: db, namespace: shop }\n\
spec:\n  podSelector: { matchLabels: { app: db } }\n  \
ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]\n";

/// A new TCP connection from `from` to `to` on `port`.
fn connect(lab: &Lab, from: &str, to: &str, port: u16) -> Outcome {
    let (from, to) = (lab.place(from).unwrap(), lab.place(to).unwrap());
    reach::probe(
        &NetNs::existing(&from.netns),
        None,
        to.ip,
        Probe::Tcp(port),
        Duration::from_millis(700),
    )
    .unwrap()
}

fn status(lab: &Lab) -> serde_json::Value {
    lab.agent().cli_json(&["status"]).expect("cellium status")
}

#[test]
fn a_recorded_policy_that_no_longer_loads_locks_its_namespace_down_until_it_is_fixed() {
    let _serial = serial();
    let mut lab = fixture::lab(AgentOptions::default()).expect("the lab");
    lab.serve(&[Probe::Tcp(80), Probe::Tcp(5432), Probe::Tcp(8080)])
        .unwrap();
    lab.apply_policy(DB_POLICY).unwrap();
    assert_eq!(
        connect(&lab, "shop/web", "shop/db", 5432),
        Outcome::Answered
    );
    assert_eq!(connect(&lab, "dev/tool", "shop/db", 5432), Outcome::Dropped);
    assert_eq!(
        connect(&lab, "dev/tool", "shop/web", 8080),
        Outcome::Answered
    );

    // The policy's record is damaged while the agent is down.
    lab.agent_mut().stop().unwrap();
    let record = lab
        .agent()
        .state_dir()
        .join("resources/NetworkPolicy~shop~db.yaml");
    std::fs::write(
        &record,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n{{{\n",
    )
    .unwrap();
    lab.agent_mut().start().unwrap();
    lab.settle().unwrap();

    // Nobody can tell whom the lost policy restricted: every endpoint of its namespace is
    // locked down, also the ones no policy in force selects, and the agent says why, naming
    // the file. Other namespaces keep their policies.
    assert_eq!(
        connect(&lab, "dev/tool", "shop/web", 8080),
        Outcome::Dropped
    );
    assert_eq!(connect(&lab, "dev/tool", "shop/db", 5432), Outcome::Dropped);
    assert_eq!(connect(&lab, "shop/web", "dev/web", 80), Outcome::Dropped);
    assert_eq!(connect(&lab, "dev/tool", "dev/web", 80), Outcome::Answered);
    // The node still reaches its pods (health checks), as under any ingress policy.
    assert_eq!(connect(&lab, "node", "shop/web", 8080), Outcome::Answered);
    let text = status(&lab).to_string();
    assert!(text.contains("Degraded"), "{text}");
    assert!(text.contains("NetworkPolicy~shop~db.yaml"), "{text}");
    assert!(text.contains("locked down"), "{text}");
    assert!(
        record.exists(),
        "the record is kept for a person to look at"
    );

    // Applying the policy again replaces the record and lifts the lockdown.
    lab.apply_policy(DB_POLICY).unwrap();
    assert_eq!(
        connect(&lab, "dev/tool", "shop/web", 8080),
        Outcome::Answered
    );
    assert_eq!(
        connect(&lab, "shop/web", "shop/db", 5432),
        Outcome::Answered
    );
    assert_eq!(connect(&lab, "dev/tool", "shop/db", 5432), Outcome::Dropped);
    let text = status(&lab).to_string();
    assert!(!text.contains("locked down"), "{text}");
}

#[test]
fn deleting_the_object_of_a_record_that_no_longer_loads_lifts_the_lockdown() {
    let _serial = serial();
    let mut lab = fixture::lab(AgentOptions::default()).expect("the lab");
    lab.serve(&[Probe::Tcp(8080)]).unwrap();
    lab.apply_policy(DB_POLICY).unwrap();
    lab.agent_mut().stop().unwrap();
    let record = lab
        .agent()
        .state_dir()
        .join("resources/NetworkPolicy~shop~db.yaml");
    std::fs::write(&record, [0xff, 0xfe, 0x00]).unwrap();
    lab.agent_mut().start().unwrap();
    lab.settle().unwrap();
    assert_eq!(
        connect(&lab, "dev/tool", "shop/web", 8080),
        Outcome::Dropped
    );

    lab.delete_policy(DB_POLICY).unwrap();
    assert!(!record.exists(), "the delete removes the record");
    assert_eq!(
        connect(&lab, "dev/tool", "shop/web", 8080),
        Outcome::Answered
    );
}

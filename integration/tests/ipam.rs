//! Pod addresses through the real agent and CNI plugin: a released address is not handed out
//! again for `ipam-release-quarantine`, not even to a pod that asks for it, and not after a
//! restart either; a restarted agent goes on where its round robin stood; pod CIDRs that
//! cannot serve pods stop the agent naming the key and the value.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test ipam -- --test-threads=1`.
//!
//! Every test makes its own agent, node and pod namespaces and removes them (guards).

use std::net::Ipv4Addr;

use cellium_integration::wait::container_id;
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use serde_json::Value;

/// ADD asking for `ip` with `IP=`; returns (success, plugin output).
fn add_asking(agent: &Agent, pod: &NetNs, container: &str, ip: Ipv4Addr) -> (bool, Value) {
    let call = CniCall::new("ADD", container)
        .netns(pod.path())
        .args(&format!("IgnoreUnknown=1;IP={ip}"));
    let (status, out) = agent.cni(&call).expect("run cellium-cni");
    (status.success(), out)
}

#[test]
fn a_released_address_stays_in_quarantine_for_requests_and_across_a_restart() {
    let _serial = serial();
    let mut agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let pods: Vec<NetNs> = (0..4).map(|_| NetNs::new().expect("pod netns")).collect();
    let (first, _) = agent.add(&pods[0], &container_id("q0")).expect("first pod");
    let (second, _) = agent
        .add(&pods[1], &container_id("q1"))
        .expect("second pod");
    assert_eq!(
        (first, second),
        (Ipv4Addr::new(10, 244, 0, 2), Ipv4Addr::new(10, 244, 0, 3))
    );
    agent
        .del(&container_id("q1"), &pods[1].path())
        .expect("second pod deleted");

    // Asking for the address a moment after its release is refused, saying until when.
    let (ok, out) = add_asking(&agent, &pods[2], &container_id("q2"), second);
    assert!(!ok, "got the just-released address: {out}");
    let msg = out["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("10.244.0.3") && msg.contains("in quarantine until"),
        "{out}"
    );
    assert!(
        pods[2].ip(&["link", "show", "eth0"]).is_err(),
        "a refused ADD left an interface"
    );
    // `cellium ipam list` shows it held back, with until when.
    let pools = agent.pools().expect("ipam list");
    let held_back = &pools[0]["quarantined"];
    assert_eq!(held_back[0]["ip"], "10.244.0.3", "{pools:?}");
    assert!(held_back[0]["until"].as_str().is_some(), "{pools:?}");

    let (status, _) = agent.stop().expect("stop");
    assert!(status.success());
    let record = std::fs::read_to_string(agent.state_dir().join("ipam.json")).expect("ipam.json");
    assert!(record.contains("10.244.0.3"), "{record}");
    agent.start().expect("restart");

    // Still refused after the restart, and round robin goes on after the released address
    // instead of starting over (which would hand it out at once, the first pod holding .2).
    let (ok, out) = add_asking(&agent, &pods[2], &container_id("q3"), second);
    assert!(!ok, "got the just-released address after a restart: {out}");
    let (next, _) = agent.add(&pods[3], &container_id("q4")).expect("a new pod");
    assert_eq!(next, Ipv4Addr::new(10, 244, 0, 4));
    assert_eq!(agent.endpoints().expect("endpoint list").len(), 2);
}

#[test]
fn without_a_quarantine_an_address_can_be_asked_for_again_at_once() {
    let _serial = serial();
    let opts = AgentOptions {
        env: vec![("CELLIUM_IPAM_RELEASE_QUARANTINE".into(), "0s".into())],
        ..AgentOptions::default()
    };
    let agent = Agent::start_new(opts).expect("start the agent");
    let pods: Vec<NetNs> = (0..2).map(|_| NetNs::new().expect("pod netns")).collect();
    let ip = Ipv4Addr::new(10, 244, 0, 40);
    let (ok, out) = add_asking(&agent, &pods[0], &container_id("z0"), ip);
    assert!(ok, "{out}");
    agent
        .del(&container_id("z0"), &pods[0].path())
        .expect("deleted");
    let (ok, out) = add_asking(&agent, &pods[1], &container_id("z1"), ip);
    assert!(ok, "{out}");
}

#[test]
fn pod_cidrs_that_cannot_serve_pods_stop_the_agent_naming_key_and_value() {
    let _serial = serial();
    for (cidr, why) in [
        ("0.0.0.0/0", "shorter than /8"),
        ("127.0.0.0/24", "loopback"),
        ("169.254.0.0/24", "link-local"),
        ("224.0.0.0/24", "multicast"),
        ("fe80::/64", "link-local"),
    ] {
        let err = Agent::start_new(AgentOptions::with_pod_cidr(cidr))
            .expect_err("started with a pod CIDR that cannot serve pods")
            .to_string();
        assert!(
            err.contains("pod-cidr") && err.contains(cidr) && err.contains(why),
            "{cidr}: {err}"
        );
    }
}

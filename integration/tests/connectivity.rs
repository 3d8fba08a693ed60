//! `cellium connectivity test` against a real agent: it passes on a working node, fails
//! (naming the check) where the node cannot do what a check asks, and leaves nothing behind
//! either way, nor when it is stopped half-way.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test connectivity -- --test-threads=1`.

use std::net::SocketAddrV4;
use std::process::{Command, Output};

use cellium_integration::lab::External;
use cellium_integration::lab::external::EXT_ADDRS;
use cellium_integration::probe::TcpServer;
use cellium_integration::wait::{CONVERGE, poll_until};
use cellium_integration::{Agent, AgentOptions, serial};

fn cellium(agent: &Agent, args: &[&str]) -> Command {
    let mut cmd = Command::new(&agent.binaries().cli);
    cmd.arg("--socket").arg(agent.socket()).args(args);
    cmd
}

/// `cellium connectivity test` with this build's plugin and `external` as the world.
fn connectivity_test(agent: &Agent, external: SocketAddrV4) -> Command {
    let dir = agent.binaries().dir().display().to_string();
    let target = external.to_string();
    cellium(
        agent,
        &[
            "connectivity",
            "test",
            "--cni-bin-dir",
            &dir,
            "--external-target",
            &target,
            "--timeout",
            "10s",
        ],
    )
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run cellium")
}

/// The lines of the result table, by check name: `(result, the rest)`.
fn table(out: &Output) -> Vec<(String, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?.to_string();
            Some((name, words.next()?.to_string()))
        })
        .collect()
}

/// The test's namespaces still on the host.
fn test_namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("cellium-conn-"))
        .map(str::to_string)
        .collect()
}

/// Nothing of the test is left: no endpoint, no namespace, no Service, no policy.
fn nothing_left(agent: &Agent) {
    assert!(
        agent.endpoints().unwrap().is_empty(),
        "{:?}",
        agent.endpoints()
    );
    assert!(test_namespaces().is_empty(), "{:?}", test_namespaces());
    let services = agent.cli(&["service", "list", "-o", "json"]).unwrap();
    assert!(!services.contains("cellium-test"), "{services}");
    let policy = agent.cli(&["policy", "get", "-o", "json"]).unwrap();
    assert!(!policy.contains("cellium-test"), "{policy}");
}

#[test]
fn a_working_node_passes_every_check_and_keeps_nothing() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).expect("agent");
    let external = External::attach(agent.node(), &["10.244.0.0/24".into()]).unwrap();
    let world = SocketAddrV4::new(EXT_ADDRS[0].1, 443);
    let _server = TcpServer::start(external.netns(), world, "world").unwrap();

    let out = run(connectivity_test(&agent, world));
    let text = format!(
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        agent.log()
    );
    assert!(out.status.success(), "{text}");
    let results = table(&out);
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "pod-to-pod",
            "pod-to-service",
            "pod-to-nodeport",
            "pod-to-world",
            "pod-to-pod-other-node",
            "policy-deny",
            "policy-allow"
        ],
        "{text}"
    );
    for (name, result) in &results {
        let want = if name == "pod-to-pod-other-node" {
            "skipped"
        } else {
            "pass"
        };
        assert_eq!(result, want, "{name}: {text}");
    }
    nothing_left(&agent);

    // Where the world does not answer, that check fails, the command says so and fails, and
    // it still removes what it made.
    let nowhere = SocketAddrV4::new(EXT_ADDRS[1].1, 443);
    let out = run(connectivity_test(&agent, nowhere));
    assert!(!out.status.success());
    let results = table(&out);
    assert!(
        results.contains(&("pod-to-world".into(), "FAIL".into())),
        "{results:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 7 checks failed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    nothing_left(&agent);

    // Stopped half-way (SIGTERM once its pods exist): it removes what it made.
    let mut child = connectivity_test(&agent, nowhere).spawn().unwrap();
    poll_until("the test's pods exist", CONVERGE, || {
        test_namespaces().len() == 3
    })
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    nothing_left(&agent);
}

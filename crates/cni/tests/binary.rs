//! The built `cellium-cni` binary, run as a runtime runs it (environment + stdin), for what
//! needs no agent: VERSION, input errors, version gates, and an agent that is not running or
//! does not answer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// What one run of the plugin printed and returned.
struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }

    /// Asserts a CNI error with `code` and returns its message.
    fn error(&self, code: u64) -> String {
        assert_ne!(
            self.status, 0,
            "a failure must exit non-zero: {}",
            self.stdout
        );
        let err = self.json();
        assert_eq!(err["code"], code, "{err}");
        for key in ["cniVersion", "msg", "details"] {
            assert!(err.get(key).is_some(), "{key} missing from {err}");
        }
        err["msg"].as_str().unwrap_or_default().to_string()
    }
}

fn run(env: &[(&str, &str)], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellium-cni"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cellium-cni");
    // Dropping the handle closes stdin, as a runtime does after writing the configuration.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for cellium-cni");
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The environment of an attachment verb for container `c1`, interface `eth0`. Its netns is one
/// the plugin can open (its own); no agent would accept it, and none answers here.
fn attachment_env(verb: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("CNI_COMMAND", verb),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/proc/self/ns/net"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        ),
    ]
}

fn config(version: &str, socket: &Path) -> String {
    json!({
        "cniVersion": version,
        "name": "cellium",
        "type": "cellium-cni",
        "socket": socket,
        "timeout": 5,
    })
    .to_string()
}

/// A socket path in a fresh directory, where no agent listens.
fn no_agent() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("agent.sock");
    (dir, socket)
}

const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

#[test]
fn version_echoes_each_requested_version() {
    for v in SUPPORTED {
        let out = run(
            &[("CNI_COMMAND", "VERSION")],
            &format!(r#"{{"cniVersion": "{v}"}}"#),
        );
        assert_eq!(out.status, 0, "{}", out.stdout);
        assert_eq!(
            out.json(),
            json!({"cniVersion": v, "supportedVersions": SUPPORTED})
        );
    }
}

#[test]
fn version_without_input_answers_1_1_0() {
    let out = run(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(out.status, 0);
    assert_eq!(out.json()["cniVersion"], "1.1.0");
    assert_eq!(out.json()["supportedVersions"], json!(SUPPORTED));
}

#[test]
fn malformed_json_is_code_6_with_the_position() {
    let out = run(
        &attachment_env("ADD"),
        "{\n  \"cniVersion\": \"1.1.0\",\n  \"name\": cellium\n}",
    );
    let msg = out.error(6);
    assert!(msg.contains("not valid JSON at line 3 column 11"), "{msg}");
}

#[test]
fn missing_variables_are_code_4_and_all_named() {
    let (_dir, socket) = no_agent();
    let out = run(&[("CNI_COMMAND", "ADD")], &config("1.1.0", &socket));
    let msg = out.error(4);
    assert!(
        msg.starts_with("CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME are not set"),
        "{msg}"
    );
    let out = run(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ],
        &config("1.1.0", &socket),
    );
    let msg = out.error(4);
    assert_eq!(
        msg,
        "CNI_NETNS is not set: the runtime must pass the pod's network namespace path for ADD"
    );
    let out = run(
        &[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c1")],
        &config("1.1.0", &socket),
    );
    assert!(out.error(4).starts_with("CNI_IFNAME is not set"));
}

#[test]
fn a_missing_command_is_code_4_and_introduces_the_plugin() {
    let out = run(&[], "");
    let msg = out.error(4);
    assert!(msg.starts_with("CNI_COMMAND is not set"), "{msg}");
    assert!(
        out.stderr.contains("CNI plugin cellium-cni"),
        "{}",
        out.stderr
    );
    let out = run(&[("CNI_COMMAND", "UP")], "");
    assert!(out.error(4).contains("CNI_COMMAND=\"UP\""));
}

#[test]
fn an_unsupported_version_is_code_1_naming_it_and_the_supported_ones() {
    let (_dir, socket) = no_agent();
    for bad in ["0.2.0", "2.0.0"] {
        let out = run(&attachment_env("ADD"), &config(bad, &socket));
        let msg = out.error(1);
        assert!(msg.contains(&format!("\"{bad}\"")), "{msg}");
        assert!(msg.contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"), "{msg}");
        // No version in use: the error is written in the newest.
        assert_eq!(out.json()["cniVersion"], "1.1.0");
    }
}

#[test]
fn check_on_0_3_1_is_refused_in_0_3_1() {
    let (_dir, socket) = no_agent();
    let out = run(&attachment_env("CHECK"), &config("0.3.1", &socket));
    let msg = out.error(1);
    assert!(
        msg.contains("CHECK does not exist in cniVersion 0.3.1"),
        "{msg}"
    );
    assert_eq!(out.json()["cniVersion"], "0.3.1");
    for verb in ["STATUS", "GC"] {
        let out = run(&[("CNI_COMMAND", verb)], &config("1.0.0", &socket));
        assert!(
            out.error(1)
                .contains(&format!("{verb} does not exist in cniVersion 1.0.0"))
        );
    }
}

#[test]
fn unknown_cni_args_are_code_2_without_ignore_unknown() {
    let (_dir, socket) = no_agent();
    let mut env = attachment_env("ADD");
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push(("CNI_ARGS", "K8S_POD_NAME=web-0;COLOR=blue"));
    let msg = run(&env, &config("1.1.0", &socket)).error(2);
    assert!(msg.contains("COLOR=blue"), "{msg}");
}

#[test]
fn add_without_an_agent_is_try_again_later_and_says_the_agent_is_down() {
    let (_dir, socket) = no_agent();
    for version in SUPPORTED {
        let out = run(&attachment_env("ADD"), &config(version, &socket));
        let msg = out.error(11);
        assert!(msg.contains("the Cellium agent is not running at"), "{msg}");
        assert!(msg.contains(&socket.display().to_string()), "{msg}");
        assert_eq!(out.json()["cniVersion"], version);
    }
}

#[test]
fn a_netns_that_does_not_exist_is_code_102_before_the_agent_is_asked() {
    let (_dir, socket) = no_agent();
    let mut env = attachment_env("ADD");
    env.retain(|(k, _)| *k != "CNI_NETNS");
    env.push(("CNI_NETNS", "/run/netns/cellium-test-absent"));
    let msg = run(&env, &config("1.0.0", &socket)).error(102);
    assert!(
        msg.contains("CNI_NETNS=/run/netns/cellium-test-absent"),
        "{msg}"
    );
}

#[test]
fn a_socket_that_is_not_a_socket_is_code_5_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("agent.sock");
    std::fs::write(&file, "").expect("write");
    for (path, found) in [
        (file, "a regular file"),
        (dir.path().to_path_buf(), "a directory"),
    ] {
        for verb in ["ADD", "DEL"] {
            let msg = run(&attachment_env(verb), &config("1.0.0", &path)).error(5);
            assert!(msg.contains("\"socket\""), "{msg}");
            assert!(msg.contains(found), "{msg}");
            assert!(msg.contains(&path.display().to_string()), "{msg}");
        }
    }
}

#[test]
fn del_without_an_agent_is_try_again_later() {
    let (_dir, socket) = no_agent();
    let out = run(&attachment_env("DEL"), &config("0.4.0", &socket));
    assert!(out.error(11).contains("not running"));
    // The podman case: no netns left, no prevResult; still code 11, not an input error.
    let mut env = attachment_env("DEL");
    env.retain(|(k, _)| *k != "CNI_NETNS");
    let out = run(&env, &config("1.0.0", &socket));
    assert!(out.error(11).contains("not running"));
}

#[test]
fn status_without_an_agent_is_not_available() {
    let (_dir, socket) = no_agent();
    let out = run(&[("CNI_COMMAND", "STATUS")], &config("1.1.0", &socket));
    let msg = out.error(50);
    assert!(msg.contains("cannot serve ADD"), "{msg}");
    assert!(msg.contains("not running"), "{msg}");
}

#[test]
fn gc_without_an_agent_is_try_again_later_and_without_a_list_refuses() {
    let (_dir, socket) = no_agent();
    let mut conf: Value = serde_json::from_str(&config("1.1.0", &socket)).unwrap();
    let out = run(&[("CNI_COMMAND", "GC")], &conf.to_string());
    assert!(out.error(7).contains("cni.dev/valid-attachments"));
    conf["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
    let out = run(&[("CNI_COMMAND", "GC")], &conf.to_string());
    out.error(11);
}

#[test]
fn a_wedged_agent_fails_within_the_timeout() {
    // Accepts connections and never answers: the plugin must give up, not hang the runtime.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let mut conf: Value = serde_json::from_str(&config("1.1.0", &socket)).unwrap();
    conf["timeout"] = json!("500ms");
    let started = Instant::now();
    let out = run(&attachment_env("ADD"), &conf.to_string());
    let msg = out.error(11);
    assert!(started.elapsed() < Duration::from_secs(5), "{msg}");
    assert!(msg.contains("did not answer"), "{msg}");
    assert!(msg.contains("500ms"), "{msg}");
}

#[test]
fn each_call_is_logged_when_a_log_file_is_configured() {
    let (dir, socket) = no_agent();
    let log = dir.path().join("cni.log");
    let mut conf: Value = serde_json::from_str(&config("1.1.0", &socket)).unwrap();
    conf["log-file"] = json!(log);
    run(&attachment_env("ADD"), &conf.to_string()).error(11);
    run(&attachment_env("DEL"), &conf.to_string()).error(11);
    let text = std::fs::read_to_string(&log).expect("log written");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(" ADD container=c1 ifname=eth0 error 11 in "),
        "{text}"
    );
    assert!(
        lines[1].contains(" DEL container=c1 ifname=eth0 error 11 in "),
        "{text}"
    );
    assert!(lines[0].contains("not running"), "{text}");
}

//! The CNI protocol against the real agent: each specification version's result, requested
//! addresses, chaining after another plugin, CHECK, STATUS and GC, and how the agent's
//! refusals reach the runtime.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test cni_protocol -- --test-threads=1`.

use cellium_integration::wait::container_id as cid;
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs, serial};
use serde_json::{Value, json};

fn agent(cidr: &str) -> Agent {
    Agent::start_new(AgentOptions::with_pod_cidr(cidr)).expect("start the agent")
}

/// Runs `call` with `conf` on stdin; returns (success, output JSON).
fn run(agent: &Agent, call: CniCall, conf: &Value) -> (bool, Value) {
    let (status, out) = agent.cni(&call.conf(conf)).expect("run cellium-cni");
    (status.success(), out)
}

/// The error's code and message; fails the test if the call succeeded.
fn refused(result: (bool, Value)) -> (u64, String) {
    let (ok, out) = result;
    assert!(!ok, "expected an error, got {out}");
    (
        out["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {out}")),
        out["msg"].as_str().unwrap_or_default().to_string(),
    )
}

fn succeeded(result: (bool, Value)) -> Value {
    let (ok, out) = result;
    assert!(ok, "expected success, got {out}");
    out
}

fn endpoint_ids(agent: &Agent) -> Vec<String> {
    agent
        .endpoints()
        .expect("endpoint list")
        .iter()
        .map(|e| e["container_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn every_version_gets_its_own_result_shape() {
    let _serial = serial();
    let agent = agent("10.61.0.0/24");
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let pod = NetNs::new().expect("pod netns");
        let id = cid(&format!("v{}", version.replace('.', "")));
        let mut conf = agent.net_conf(version);
        conf["mtu"] = json!(1400);
        conf["dns"] = json!({"nameservers": ["10.96.0.10"]});
        let result = succeeded(run(
            &agent,
            CniCall::new("ADD", &id).netns(pod.path()),
            &conf,
        ));
        assert_eq!(result["cniVersion"], version);
        let ifaces = result["interfaces"].as_array().expect("interfaces");
        assert_eq!(ifaces.len(), 2, "{result}");
        assert!(
            ifaces[0]["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("lxc")
        );
        assert_eq!(ifaces[1]["name"], "eth0");
        assert_eq!(ifaces[1]["sandbox"], pod.path().display().to_string());
        let ip = &result["ips"][0];
        assert_eq!(ip["interface"], 1);
        assert_eq!(ip["gateway"], "10.61.0.1");
        assert!(ip["address"].as_str().unwrap_or_default().ends_with("/32"));
        assert_eq!(
            result["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "10.61.0.1"}])
        );
        assert_eq!(result["dns"]["nameservers"], json!(["10.96.0.10"]));
        if version.starts_with("0.") {
            assert_eq!(ip["version"], "4", "{version}: {result}");
            assert!(ifaces[1].get("mtu").is_none(), "{version}: {result}");
        } else {
            assert!(ip.get("version").is_none(), "{version}: {result}");
            assert_eq!(ifaces[1]["mtu"], 1400, "{version}: {result}");
        }
        // The pod really has the MTU it was given.
        let link = pod.ip(&["-o", "link", "show", "eth0"]).expect("ip link");
        assert!(link.contains("mtu 1400"), "{link}");
        succeeded(run(
            &agent,
            CniCall::new("DEL", &id).netns(pod.path()),
            &conf,
        ));
    }
    assert!(endpoint_ids(&agent).is_empty());
}

#[test]
fn requested_addresses_follow_the_runtimes_precedence() {
    let _serial = serial();
    let agent = agent("10.62.0.0/24");
    let conf = agent.net_conf("1.1.0");
    let pod = NetNs::new().expect("pod netns");
    let result = succeeded(run(
        &agent,
        CniCall::new("ADD", &cid("ip-arg"))
            .netns(pod.path())
            .args("IgnoreUnknown=1;IP=10.62.0.77"),
        &conf,
    ));
    assert_eq!(result["ips"][0]["address"], "10.62.0.77/32");

    // The `ips` capability of runtimeConfig wins over IP= in CNI_ARGS.
    let other = NetNs::new().expect("pod netns");
    let mut with_capability = conf.clone();
    with_capability["runtimeConfig"] = json!({"ips": ["10.62.0.88/32"]});
    let result = succeeded(run(
        &agent,
        CniCall::new("ADD", &cid("ip-cap"))
            .netns(other.path())
            .args("IgnoreUnknown=1;IP=10.62.0.99"),
        &with_capability,
    ));
    assert_eq!(result["ips"][0]["address"], "10.62.0.88/32");

    // A requested address already held is refused, naming its holder, and nothing changes.
    let third = NetNs::new().expect("pod netns");
    let before = endpoint_ids(&agent);
    let (code, msg) = refused(run(
        &agent,
        CniCall::new("ADD", &cid("ip-taken"))
            .netns(third.path())
            .args("IgnoreUnknown=1;IP=10.62.0.77"),
        &conf,
    ));
    assert_eq!(code, 104, "{msg}");
    assert!(
        msg.contains("10.62.0.77") && msg.contains("held by"),
        "{msg}"
    );
    assert_eq!(endpoint_ids(&agent), before);
    assert!(
        third.ip(&["link", "show", "eth0"]).is_err(),
        "no eth0 was left"
    );
}

#[test]
fn in_a_chain_the_result_is_appended_to_the_previous_plugins() {
    let _serial = serial();
    let agent = agent("10.63.0.0/24");
    let pod = NetNs::new().expect("pod netns");
    let mut conf = agent.net_conf("1.1.0");
    // A 0.4.0 result from an earlier plugin: converted, kept first, indices shifted.
    conf["prevResult"] = json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "net0", "sandbox": pod.path()}],
        "ips": [{"version": "4", "interface": 0, "address": "192.168.5.5/24"}],
        "dns": {"nameservers": ["192.168.5.1"]}
    });
    let result = succeeded(run(
        &agent,
        CniCall::new("ADD", &cid("chain")).netns(pod.path()),
        &conf,
    ));
    assert_eq!(result["cniVersion"], "1.1.0");
    let names: Vec<&str> = result["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names.len(), 3, "{result}");
    assert_eq!((names[0], names[2]), ("net0", "eth0"));
    assert_eq!(
        result["ips"][0],
        json!({"interface": 0, "address": "192.168.5.5/24"})
    );
    assert_eq!(result["ips"][1]["interface"], 2);

    // A malformed prevResult fails before the agent is asked for anything.
    let other = NetNs::new().expect("pod netns");
    let mut bad = agent.net_conf("1.0.0");
    bad["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "nope"}]});
    let before = endpoint_ids(&agent);
    let (code, msg) = refused(run(
        &agent,
        CniCall::new("ADD", &cid("bad-prev")).netns(other.path()),
        &bad,
    ));
    assert_eq!(code, 6, "{msg}");
    assert!(msg.contains("ips[0].address"), "{msg}");
    assert_eq!(endpoint_ids(&agent), before);
}

#[test]
fn check_compares_the_runtimes_result_with_the_agents_record() {
    let _serial = serial();
    let agent = agent("10.64.0.0/24");
    let pod = NetNs::new().expect("pod netns");
    let id = cid("check");
    let conf = agent.net_conf("1.0.0");
    let added = succeeded(run(
        &agent,
        CniCall::new("ADD", &id).netns(pod.path()),
        &conf,
    ));
    let mut check = conf.clone();
    check["prevResult"] = added.clone();
    assert_eq!(
        succeeded(run(
            &agent,
            CniCall::new("CHECK", &id).netns(pod.path()),
            &check
        )),
        Value::Null
    );

    let mut wrong = added.clone();
    wrong["ips"][0]["address"] = json!("10.64.0.250/32");
    check["prevResult"] = wrong;
    let (code, msg) = refused(run(
        &agent,
        CniCall::new("CHECK", &id).netns(pod.path()),
        &check,
    ));
    assert_eq!(code, 105, "{msg}");
    assert!(msg.contains("is not in prevResult"), "{msg}");

    // The pod's default route removed behind the agent's back.
    check["prevResult"] = added;
    pod.ip(&["route", "del", "default"])
        .expect("remove the default route");
    let (code, msg) = refused(run(
        &agent,
        CniCall::new("CHECK", &id).netns(pod.path()),
        &check,
    ));
    assert_eq!(code, 105, "{msg}");
    assert!(msg.contains("route"), "{msg}");

    let (code, msg) = refused(run(
        &agent,
        CniCall::new("CHECK", &id).netns(pod.path()),
        &conf,
    ));
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("prevResult"), "{msg}");
}

#[test]
fn status_reports_a_full_pool_and_gc_keeps_only_valid_attachments() {
    let _serial = serial();
    // A /30: the router and a single pod. Its address is handed out again right after GC
    // frees it, which needs the release quarantine off.
    let agent = Agent::start_new(AgentOptions {
        env: vec![("CELLIUM_IPAM_RELEASE_QUARANTINE".into(), "0s".into())],
        ..AgentOptions::with_pod_cidr("10.65.0.0/30")
    })
    .expect("start the agent");
    let conf = agent.net_conf("1.1.0");
    let status = || {
        run(
            &agent,
            CniCall::new("STATUS", "-")
                .unset("CNI_CONTAINERID")
                .unset("CNI_IFNAME"),
            &conf,
        )
    };
    assert_eq!(succeeded(status()), Value::Null);

    let keep = NetNs::new().expect("pod netns");
    succeeded(run(
        &agent,
        CniCall::new("ADD", &cid("keep")).netns(keep.path()),
        &conf,
    ));
    let (code, msg) = refused(status());
    assert_eq!(code, 50, "{msg}");
    assert!(msg.contains("exhausted"), "{msg}");

    // GC removes what the runtime no longer knows (a leftover the runtime never deleted).
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    succeeded(run(
        &agent,
        CniCall::new("GC", "-")
            .unset("CNI_CONTAINERID")
            .unset("CNI_IFNAME"),
        &gc,
    ));
    assert!(endpoint_ids(&agent).is_empty());
    assert_eq!(
        succeeded(status()),
        Value::Null,
        "the address is free again"
    );

    let again = NetNs::new().expect("pod netns");
    succeeded(run(
        &agent,
        CniCall::new("ADD", &cid("again")).netns(again.path()),
        &conf,
    ));
    gc["cni.dev/valid-attachments"] = json!([{"containerID": cid("again"), "ifname": "eth0"}]);
    succeeded(run(
        &agent,
        CniCall::new("GC", "-")
            .unset("CNI_CONTAINERID")
            .unset("CNI_IFNAME"),
        &gc,
    ));
    assert_eq!(endpoint_ids(&agent), [cid("again")]);
}

//! Flows end to end: the real agent reading its datapath's events, `cellium observe` asking
//! it, pods of the lab talking through the datapath.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test flows -- --test-threads=1`.
//!
//! The lab is `lab::fixture`'s: pods `shop/web`, `shop/db`, `dev/web`, `dev/tool`, `ops/dns`
//! with fixed addresses; every test starts its own agent and removes everything (guards).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use cellium_integration::lab::{Lab, fixture};
use cellium_integration::probe;
use cellium_integration::reach::Probe::Tcp;
use cellium_integration::wait::wait_for;
use cellium_integration::{Agent, AgentOptions, serial};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(2);
/// Shorter than TCP's first SYN retransmission (1 s): a refused connect sends one SYN.
const SHORT: Duration = Duration::from_millis(500);

/// shop/db takes connections on 5432 from app=web pods only.
const DB_FROM_WEB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db-from-web, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  policyTypes: [ Ingress ]
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
"#;

fn lab_with(env: Vec<(String, String)>) -> Lab {
    let opts = AgentOptions {
        env,
        ..fixture::dual_stack()
    };
    fixture::lab(opts).expect("the lab")
}

fn addr(lab: &Lab, pod: &str, port: u16) -> SocketAddr {
    SocketAddr::new(lab.pod(pod).expect("pod").ip.into(), port)
}

/// `cellium observe -o json <args>`: one response per line.
fn observe(agent: &Agent, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["observe", "-o", "json"];
    all.extend_from_slice(args);
    agent
        .cli(&all)
        .expect("cellium observe")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// `cellium observe --all <args>`, one flow a line.
fn compact(agent: &Agent, args: &[&str]) -> String {
    let mut all = vec!["observe", "--all"];
    all.extend_from_slice(args);
    agent.cli(&all).expect("cellium observe")
}

/// A `cellium observe --follow` running in the background, its lines timed as they come.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Follower {
    fn start(agent: &Agent, args: &[&str]) -> Follower {
        let mut child = Command::new(agent.binaries().dir().join("cellium"))
            .arg("--socket")
            .arg(agent.socket())
            .args(["observe", "--follow", "-o", "json"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cellium observe --follow");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Follower { child, lines }
    }

    fn next(&self, within: Duration) -> Option<(Instant, Value)> {
        let (at, line) = self.lines.recv_timeout(within).ok()?;
        Some((at, serde_json::from_str(&line).expect("a JSON line")))
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_policy_drop_names_both_pods_and_the_reason_and_an_allowed_connection_its_match() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.apply_policy(DB_FROM_WEB).unwrap();
    lab.settle().unwrap();
    lab.serve(&[Tcp(5432)]).unwrap();
    let ids = lab.identities().unwrap();
    // The reader says it works (a job is Unknown until it does).
    let status = lab.agent().cli(&["status", "--verbose"]).unwrap();
    let reader = status.lines().find(|l| l.contains("read-events"));
    assert!(reader.is_some_and(|l| l.contains(" OK ")), "{status}");

    let tool = &lab.pod("dev/tool").unwrap().netns;
    assert!(probe::tcp_connect(tool, addr(&lab, "shop/db", 5432), SHORT).is_err());
    let drops = wait_for("the drop's flow", || {
        let f = observe(
            lab.agent(),
            &["--all", "--verdict", "DROPPED", "--to-pod", "shop/db"],
        );
        (!f.is_empty()).then_some(f)
    });
    assert_eq!(drops.len(), 1, "{drops:#?}");
    let f = &drops[0]["flow"];
    assert_eq!(f["verdict"], "DROPPED");
    assert_eq!(f["drop_reason_desc"], "POLICY_DENIED", "{f:#}");
    assert_eq!(f["traffic_direction"], "INGRESS");
    assert_eq!(f["source"]["namespace"], "dev");
    assert_eq!(f["source"]["pod_name"], "tool");
    assert_eq!(f["destination"]["namespace"], "shop");
    assert_eq!(f["destination"]["pod_name"], "db");
    assert_eq!(
        f["source"]["identity"].as_u64(),
        ids.get("dev/tool").copied()
    );
    assert_eq!(
        f["destination"]["identity"].as_u64(),
        ids.get("shop/db").copied()
    );
    assert_eq!(f["l4"]["TCP"]["destination_port"], 5432);
    assert!(
        f["source"]["labels"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "k8s:app=tool"),
        "{f:#}"
    );
    // The one-line form says the same at a glance.
    let line = compact(
        lab.agent(),
        &["--verdict", "DROPPED", "--to-pod", "shop/db"],
    );
    assert!(
        line.contains("dev/tool:") && line.contains("-> shop/db:5432"),
        "{line}"
    );
    assert!(line.contains("DROPPED"), "{line}");
    // The drop counts against shop/db, whose ingress policy decided: in `endpoint get` and
    // in the metrics.
    let db_id = lab.endpoints().unwrap()["shop/db"]["id"].as_u64().unwrap();
    let ep = lab
        .agent()
        .cli_json(&["endpoint", "get", &db_id.to_string()])
        .unwrap();
    assert_eq!(ep["drops"]["POLICY_DENIED"], 1, "{ep:#}");
    let metrics = lab.agent().metrics().unwrap();
    let series =
        format!("cellium_endpoint_drops_total{{endpoint=\"{db_id}\",reason=\"POLICY_DENIED\"}} 1");
    assert!(metrics.contains(&series), "{series} not in:\n{metrics}");

    let web = &lab.pod("shop/web").unwrap().netns;
    probe::tcp_request(web, addr(&lab, "shop/db", 5432), TIMEOUT).expect("web -> db allowed");
    let traces = wait_for("the allowed connection's trace", || {
        let f = observe(
            lab.agent(),
            &[
                "--all",
                "--type",
                "trace",
                "--from-pod",
                "shop/web",
                "--to-pod",
                "shop/db",
            ],
        );
        (!f.is_empty()).then_some(f)
    });
    assert_eq!(traces.len(), 1, "{traces:#?}");
    let f = &traces[0]["flow"];
    assert_eq!(f["verdict"], "FORWARDED");
    assert_eq!(f["is_reply"], false);
    // shop/web's egress is not enforced (all); shop/db's ingress allowed it by identity and
    // port (L3-L4), as the compact form says.
    assert_eq!(f["policy_match_type"], 4, "{f:#}");
    let compact = lab
        .agent()
        .cli(&["observe", "--all", "--type", "trace", "--to-pod", "shop/db"])
        .unwrap();
    assert!(compact.contains("ingress L3-L4"), "{compact}");

    // IPv6 alike: the denied one dropped, the allowed one traced, both named.
    let db6 = SocketAddr::new(lab.pod("shop/db").unwrap().ip6.unwrap().into(), 5432);
    assert!(probe::tcp_connect(tool, db6, SHORT).is_err());
    probe::tcp_request(web, db6, TIMEOUT).expect("web -> db over IPv6");
    let v6 = wait_for("the IPv6 flows", || {
        let f = observe(lab.agent(), &["--all", "--to-ip", &db6.ip().to_string()]);
        (f.len() >= 2).then_some(f)
    });
    let verdicts: Vec<&str> = v6
        .iter()
        .map(|f| f["flow"]["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["DROPPED", "FORWARDED"], "{v6:#?}");
    assert_eq!(v6[0]["flow"]["IP"]["ipVersion"], "IPv6");
    assert_eq!(v6[0]["flow"]["source"]["pod_name"], "tool");
    assert_eq!(v6[1]["flow"]["source"]["pod_name"], "web");
    assert_eq!(v6[1]["flow"]["destination"]["pod_name"], "db");

    // A denied ping says what it was: ICMP's type and code, both families.
    let db = lab.pod("shop/db").unwrap();
    let (db4, db6) = (db.ip, db.ip6.unwrap());
    assert!(!probe::ping(tool, db4, 1).unwrap(), "ping is not allowed");
    assert!(!probe::ping(tool, db6, 1).unwrap(), "ping6 is not allowed");
    let pings = wait_for("the pings' drops", || {
        let f = observe(
            lab.agent(),
            &[
                "--all",
                "--verdict",
                "DROPPED",
                "--protocol",
                "icmp",
                "--protocol",
                "icmpv6",
            ],
        );
        (f.len() >= 2).then_some(f)
    });
    let l4: Vec<&Value> = pings.iter().map(|f| &f["flow"]["l4"]).collect();
    assert!(
        l4.iter()
            .any(|l| l["ICMPv4"]["type"] == 8 && l["ICMPv4"]["code"] == 0),
        "{l4:#?}"
    );
    assert!(l4.iter().any(|l| l["ICMPv6"]["type"] == 128), "{l4:#?}");
    let compact = lab
        .agent()
        .cli(&[
            "observe",
            "--all",
            "--verdict",
            "DROPPED",
            "--protocol",
            "icmp",
        ])
        .unwrap();
    assert!(compact.contains("ICMPv4 EchoRequest"), "{compact}");
}

/// No pod called `tool` reaches shop/db on 5432, whatever shop's own policies allow.
const NO_TOOL_TO_DB: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: no-tool-to-db }
spec:
  endpointSelector: { matchLabels: { app: db } }
  log: { value: "tools stay off the database" }
  enableDefaultDeny: { ingress: false }
  ingressDeny: [ { fromEndpoints: [ { matchLabels: { app: tool } } ], toPorts: [ { ports: [ { port: "5432" } ] } ] } ]
"#;

/// Every policy drop and verdict names the object that decided it: a default deny the
/// objects that switched it on, a deny rule its object, an allowed connection its allow
/// rule's; `observe` shows it, in Hubble's fields, and a metric counts drops per policy.
#[test]
fn a_drop_and_a_verdict_name_the_policy_that_decided() {
    let _serial = serial();
    let mut lab = lab_with(vec![(
        "CELLIUM_BPF_EVENTS_POLICY_VERDICT_ENABLED".into(),
        "true".into(),
    )]);
    lab.apply_policy(DB_FROM_WEB).unwrap();
    lab.settle().unwrap();
    lab.serve(&[Tcp(5432)]).unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    let web = &lab.pod("shop/web").unwrap().netns;

    // Default deny: the NetworkPolicy that put shop/db's ingress into it.
    assert!(probe::tcp_connect(tool, addr(&lab, "shop/db", 5432), SHORT).is_err());
    let by_default = wait_for("the default deny's drop", || {
        let f = observe(
            lab.agent(),
            &["--all", "--type", "drop", "--to-pod", "shop/db"],
        );
        (!f.is_empty()).then_some(f)
    });
    let f = &by_default[0]["flow"];
    assert_eq!(f["drop_reason_desc"], "POLICY_DENIED", "{f:#}");
    assert_eq!(
        f["ingress_denied_by"],
        serde_json::json!([{"kind": "NetworkPolicy", "namespace": "shop", "name": "db-from-web"}]),
        "{f:#}"
    );

    // Allowed: the allow rule's object, on the policy verdict.
    probe::tcp_request(web, addr(&lab, "shop/db", 5432), TIMEOUT).expect("web -> db allowed");
    let allowed = wait_for("the allowed verdict", || {
        let f = observe(
            lab.agent(),
            &[
                "--all",
                "--type",
                "policy-verdict",
                "--from-pod",
                "shop/web",
                "--to-pod",
                "shop/db",
            ],
        );
        f.into_iter()
            .find(|f| f["flow"]["traffic_direction"] == "INGRESS")
    });
    assert_eq!(
        allowed["flow"]["ingress_allowed_by"][0]["name"], "db-from-web",
        "{allowed:#}"
    );

    // A deny rule: its object alone, not the default deny's.
    lab.apply_policy(NO_TOOL_TO_DB).unwrap();
    lab.settle().unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    assert!(probe::tcp_connect(tool, addr(&lab, "shop/db", 5432), SHORT).is_err());
    let denied = wait_for("the deny rule's drop", || {
        observe(
            lab.agent(),
            &["--all", "--type", "drop", "--to-pod", "shop/db"],
        )
        .into_iter()
        .find(|f| f["flow"]["drop_reason_desc"] == "POLICY_DENY")
    });
    assert_eq!(
        denied["flow"]["ingress_denied_by"],
        serde_json::json!([{"kind": "CiliumClusterwideNetworkPolicy", "namespace": "", "name": "no-tool-to-db"}]),
        "{denied:#}"
    );
    // Its rule's log value goes with it (Cilium 1.18's policy log field).
    assert_eq!(
        denied["flow"]["policy_log"],
        serde_json::json!(["tools stay off the database"]),
        "{denied:#}"
    );
    let lines = compact(
        lab.agent(),
        &["--verdict", "DROPPED", "--to-pod", "shop/db"],
    );
    assert!(
        lines.contains("DROPPED by NetworkPolicy shop/db-from-web")
            && lines.contains("DROPPED by CiliumClusterwideNetworkPolicy no-tool-to-db"),
        "{lines}"
    );
    let metrics = lab.agent().metrics().unwrap();
    for series in [
        r#"cellium_policy_drops_total{kind="NetworkPolicy",namespace="shop",name="db-from-web",direction="ingress"} 1"#,
        r#"cellium_policy_drops_total{kind="CiliumClusterwideNetworkPolicy",namespace="",name="no-tool-to-db",direction="ingress"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} not in:\n{metrics}");
    }
}

/// DB_FROM_WEB in audit mode.
const DB_FROM_WEB_AUDITED: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db-from-web, namespace: shop, annotations: { policy.cellium.io/audit-mode: "true" } }
spec:
  podSelector: { matchLabels: { app: db } }
  policyTypes: [ Ingress ]
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
"#;

/// The first AUDIT flow to shop/db, once there is one.
fn audit_to_db(agent: &Agent) -> Value {
    wait_for("an audit verdict", || {
        observe(
            agent,
            &["--all", "--verdict", "AUDIT", "--to-pod", "shop/db"],
        )
        .into_iter()
        .next()
    })
}

/// A policy in audit mode (its annotation, or the agent's `policy-audit-mode`) lets through
/// what it alone would drop and reports it as an AUDIT verdict naming it; beside an enforced
/// policy, the enforced one's drops stay drops.
#[test]
fn a_policy_in_audit_mode_lets_through_what_it_would_drop_and_names_itself() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.apply_policy(DB_FROM_WEB_AUDITED).unwrap();
    lab.settle().unwrap();
    lab.serve(&[Tcp(5432)]).unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    probe::tcp_request(tool, addr(&lab, "shop/db", 5432), TIMEOUT)
        .expect("what only an audited policy denies passes");
    let audit = audit_to_db(lab.agent());
    let f = &audit["flow"];
    assert_eq!(f["verdict"], "AUDIT", "{f:#}");
    assert_eq!(f["source"]["pod_name"], "tool");
    assert_eq!(f["ingress_denied_by"][0]["name"], "db-from-web", "{f:#}");
    let line = compact(lab.agent(), &["--verdict", "AUDIT"]);
    assert!(
        line.contains("INGRESS AUDIT (policy default deny) by NetworkPolicy shop/db-from-web"),
        "{line}"
    );
    let metrics = lab.agent().metrics().unwrap();
    assert!(
        metrics.contains(
            r#"cellium_policy_verdicts_total{direction="ingress",match="none",action="audit"}"#
        ),
        "{metrics}"
    );
    // An enforced policy beside it: its default deny drops, naming only itself; the audited
    // policy's allow does not widen it.
    lab.apply_policy(
        &DB_FROM_WEB
            .replace("db-from-web", "db-enforced")
            .replace("app: web", "app: nobody"),
    )
    .unwrap();
    lab.settle().unwrap();
    let web = &lab.pod("shop/web").unwrap().netns;
    assert!(probe::tcp_connect(web, addr(&lab, "shop/db", 5432), SHORT).is_err());
    let dropped = wait_for("the enforced drop", || {
        observe(
            lab.agent(),
            &["--all", "--type", "drop", "--to-pod", "shop/db"],
        )
        .into_iter()
        .next()
    });
    assert_eq!(
        dropped["flow"]["ingress_denied_by"],
        serde_json::json!([{"kind": "NetworkPolicy", "namespace": "shop", "name": "db-enforced"}]),
        "{dropped:#}"
    );
    drop(lab);

    // The agent's audit mode: every policy audited.
    let mut lab = lab_with(vec![("CELLIUM_POLICY_AUDIT_MODE".into(), "true".into())]);
    lab.apply_policy(DB_FROM_WEB).unwrap();
    lab.settle().unwrap();
    lab.serve(&[Tcp(5432)]).unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    probe::tcp_request(tool, addr(&lab, "shop/db", 5432), TIMEOUT)
        .expect("policy-audit-mode drops nothing");
    assert_eq!(
        audit_to_db(lab.agent())["flow"]["ingress_denied_by"][0]["name"],
        "db-from-web"
    );
}

#[test]
fn a_cluster_ip_connection_names_the_service() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.apply(
        r#"
apiVersion: v1
kind: Service
metadata: { name: web-svc, namespace: shop }
spec: { selector: { app: web }, ports: [ { name: http, port: 80, targetPort: http } ] }
"#,
    )
    .unwrap();
    lab.serve(&[Tcp(8080)]).unwrap();
    let vip = wait_for("the service's frontend", || {
        let list = lab.agent().cli_json(&["service", "list"]).ok()?;
        list.as_array()?
            .iter()
            .find(|f| {
                f["service"] == "shop/web-svc" && f["vip"].as_str().is_some_and(|v| v.contains('.'))
            })
            .and_then(|f| {
                let ip: std::net::IpAddr = f["vip"].as_str()?.parse().ok()?;
                Some(SocketAddr::new(ip, 80))
            })
    });
    let tool = &lab.pod("dev/tool").unwrap().netns;
    probe::tcp_request(tool, vip, TIMEOUT).expect("tool -> the service");
    let flows = wait_for("the translated connection's trace", || {
        let f = observe(lab.agent(), &["--all", "--service", "shop/web-svc"]);
        (!f.is_empty()).then_some(f)
    });
    let f = &flows[0]["flow"];
    assert_eq!(f["destination_service"]["name"], "web-svc", "{f:#}");
    assert_eq!(f["destination_service"]["namespace"], "shop");
    assert_eq!(f["destination"]["pod_name"], "web");
    assert_eq!(f["source"]["pod_name"], "tool");
    let compact = lab
        .agent()
        .cli(&["observe", "--all", "--service", "shop/web-svc"])
        .unwrap();
    assert!(compact.contains("[svc shop/web-svc]"), "{compact}");
}

#[test]
fn a_follower_sees_a_new_flow_within_100_ms() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.serve(&[Tcp(5432)]).unwrap();
    let follower = Follower::start(
        lab.agent(),
        &["--from-pod", "shop/web", "--to-pod", "shop/db"],
    );
    let web = &lab.pod("shop/web").unwrap().netns;
    let db = addr(&lab, "shop/db", 5432);
    // The first flow proves the follow is in place.
    wait_for("the follower's first flow", || {
        probe::tcp_request(web, db, TIMEOUT).ok()?;
        follower.next(Duration::from_millis(500))
    });
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let sent = Instant::now();
        probe::tcp_request(web, db, TIMEOUT).expect("web -> db");
        let (at, f) = follower
            .next(Duration::from_secs(2))
            .expect("a followed flow");
        assert_eq!(f["flow"]["destination"]["pod_name"], "db");
        worst = worst.max(at.duration_since(sent));
        // Drain anything else of this connection.
        while follower.next(Duration::from_millis(50)).is_some() {}
    }
    eprintln!("follow latency, worst of 5: {worst:?}");
    assert!(worst < Duration::from_millis(100), "{worst:?}");
}

#[test]
fn each_filter_and_its_negation_split_the_flows() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.apply_policy(DB_FROM_WEB).unwrap();
    lab.settle().unwrap();
    lab.serve(&[Tcp(5432), Tcp(8080)]).unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    let web = &lab.pod("shop/web").unwrap().netns;
    assert!(probe::tcp_connect(tool, addr(&lab, "shop/db", 5432), SHORT).is_err());
    probe::tcp_request(web, addr(&lab, "shop/db", 5432), TIMEOUT).unwrap();
    probe::tcp_request(tool, addr(&lab, "shop/web", 8080), TIMEOUT).unwrap();
    let dns = &lab.pod("ops/dns").unwrap().netns;
    probe::tcp_request(dns, addr(&lab, "dev/web", 8080), TIMEOUT).ok();
    // The last flow read means every earlier one is: the events come through one ring.
    wait_for("ops/dns's flow read", || {
        (!observe(lab.agent(), &["--all", "--from-namespace", "ops"]).is_empty()).then_some(())
    });
    // Every query sees the same flows: those until now.
    let until = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
    let count = |args: &[&str]| {
        let mut all = vec!["--all", "--until", until.as_str()];
        all.extend_from_slice(args);
        observe(lab.agent(), &all).len()
    };
    let total = count(&[]);
    assert!(total >= 4, "{total} flows");
    for filter in [
        &["--verdict", "DROPPED"][..],
        &["--drop-reason-desc", "POLICY_DENIED"],
        &["--type", "trace"],
        &["--pod", "shop/db"],
        &["--from-pod", "dev/tool"],
        &["--to-pod", "shop/"],
        &["--namespace", "ops"],
        &["--from-namespace", "dev"],
        &["--to-namespace", "shop"],
        &["--label", "app=db"],
        &["--from-label", "app in (web,tool)"],
        &["--to-label", "k8s:app=web"],
        &["--ip", "10.244.0.11"],
        &["--to-ip", "10.244.0.0/28"],
        &["--port", "5432"],
        &["--to-port", "8080"],
        &["--protocol", "tcp"],
        &["--traffic-direction", "ingress"],
    ] {
        let yes = count(filter);
        let mut negated = vec!["--not"];
        negated.extend_from_slice(filter);
        let no = count(&negated);
        assert_eq!(yes + no, total, "{filter:?}: {yes} + {no} != {total}");
        if filter != ["--protocol", "tcp"] {
            assert!(yes > 0 && no > 0, "{filter:?}: {yes} and {no} of {total}");
        }
    }
    // Combined: dropped flows to shop, except those from dev.
    let combined = count(&[
        "--verdict",
        "DROPPED",
        "--to-namespace",
        "shop",
        "--not",
        "--from-namespace",
        "dev",
    ]);
    assert_eq!(combined, 0);
    assert_eq!(
        count(&["--verdict", "DROPPED", "--to-namespace", "shop"]),
        1
    );
    // A filter that cannot be read is refused with its name.
    let err = lab
        .agent()
        .cli(&["observe", "--to-ip", "10.0.0/8"])
        .unwrap_err();
    assert!(err.to_string().contains("destination_ip"), "{err}");
}

#[test]
fn the_ring_keeps_exactly_n_and_lost_events_are_counted() {
    let _serial = serial();
    let mut lab = lab_with(vec![(
        "CELLIUM_HUBBLE_EVENT_BUFFER_CAPACITY".into(),
        "5".into(),
    )]);
    lab.serve(&[Tcp(8080)]).unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    for _ in 0..8 {
        probe::tcp_request(tool, addr(&lab, "shop/web", 8080), TIMEOUT).unwrap();
    }
    wait_for("a full ring", || {
        let s = lab.agent().cli(&["observe", "--status"]).ok()?;
        s.contains("Current/Max Flows: 5/5").then_some(())
    });
    assert_eq!(observe(lab.agent(), &["--all"]).len(), 5);
    assert_eq!(observe(lab.agent(), &["--last", "3"]).len(), 3);

    // The agent stopped while the datapath reports: its ring buffer (256 KiB, about 3000
    // events) fills and the rest is lost, counted by the datapath and reported.
    let pid = Pid::from_raw(lab.agent().pid().unwrap() as i32);
    let db = addr(&lab, "shop/db", 9);
    kill(pid, Signal::SIGSTOP).unwrap();
    let sent = tool
        .run(move || {
            let mut n = 0;
            for _ in 0..6000 {
                // A new socket each time: a new source port, a new connection, a new trace.
                if let Ok(s) = UdpSocket::bind("0.0.0.0:0")
                    && s.send_to(b"x", db).is_ok()
                {
                    n += 1;
                }
            }
            n
        })
        .unwrap();
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(sent > 5000, "{sent} datagrams sent");
    let lost = wait_for("lost events counted", || {
        let s = lab.agent().cli(&["observe", "--status"]).ok()?;
        let line = s.lines().find(|l| l.starts_with("Lost events:"))?;
        let n: u64 = line.split_whitespace().nth(2)?.parse().ok()?;
        (n > 0).then_some(n)
    });
    eprintln!("{sent} new connections while stopped, {lost} events lost");
    let metrics = lab.agent().metrics().unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("cellium_flows_lost_events_total{source=\"datapath\"}"))
        .expect("the lost events metric");
    let exported: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(exported, lost, "{line}");
}

#[test]
fn a_follower_gets_a_clear_error_when_the_agent_restarts() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.serve(&[Tcp(8080)]).unwrap();
    let mut follower = Follower::start(lab.agent(), &[]);
    // A flow through the follower proves it is following before the agent stops: stopped
    // earlier, the follower would fail to connect instead, which is another test's error.
    let tool = &lab.pod("dev/tool").unwrap().netns;
    let web = addr(&lab, "shop/web", 8080);
    wait_for("the follower's first flow", || {
        probe::tcp_request(tool, web, TIMEOUT).ok()?;
        follower.next(Duration::from_millis(500))
    });
    lab.agent_mut().stop().unwrap();
    let began = Instant::now();
    let status = loop {
        if let Some(s) = follower.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the follower kept waiting"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(follower.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("broke off"),
        "the follower ended with {status}, stderr {stderr:?}"
    );
    assert!(
        stderr.contains("stopping") || stderr.contains("restarted"),
        "{stderr}"
    );
    lab.agent_mut().start().unwrap();
    // The restarted agent observes again.
    let status = lab.agent().cli(&["observe", "--status"]).unwrap();
    assert!(status.contains("Current/Max Flows:"), "{status}");
}

/// A reader that stops reading (`cellium observe | head -1`) ends the CLI quietly and with
/// success; the CLI is never killed by SIGPIPE, which it leaves ignored so that a write to an
/// agent that went away is an error it can report.
#[test]
fn a_reader_that_closes_the_pipe_ends_the_cli_quietly() {
    let _serial = serial();
    let lab = lab_with(Vec::new());
    for args in [
        &["status"][..],
        &["observe", "--status"],
        &["endpoint", "list"],
    ] {
        let mut child = Command::new(lab.agent().binaries().dir().join("cellium"))
            .arg("--socket")
            .arg(lab.agent().socket())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cellium");
        // The read end is closed before the CLI can have written: its first line meets EPIPE.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("cellium ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "cellium {args:?} ended with {}, stderr {stderr:?}",
            out.status
        );
        assert!(stderr.is_empty(), "cellium {args:?}: {stderr:?}");
    }
}

#[test]
fn hubble_s_method_path_answers_with_the_same_flows() {
    let _serial = serial();
    let mut lab = lab_with(Vec::new());
    lab.serve(&[Tcp(8080)]).unwrap();
    let tool = &lab.pod("dev/tool").unwrap().netns;
    probe::tcp_request(tool, addr(&lab, "shop/web", 8080), TIMEOUT).unwrap();
    wait_for("a flow", || {
        (!observe(lab.agent(), &["--all"]).is_empty()).then_some(())
    });
    let socket = lab.agent().socket();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let flows = rt.block_on(async {
        let channel = cellium_api::connect(&socket).await.expect("the API");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let req = cellium_api::v1::GetFlowsRequest {
            number: 10,
            ..Default::default()
        };
        let mut stream = grpc
            .server_streaming(
                tonic::Request::new(req),
                http::uri::PathAndQuery::from_static("/observer.Observer/GetFlows"),
                tonic_prost::ProstCodec::<
                    cellium_api::v1::GetFlowsRequest,
                    cellium_api::v1::GetFlowsResponse,
                >::default(),
            )
            .await
            .expect("observer.Observer/GetFlows")
            .into_inner();
        let mut out = Vec::new();
        while let Some(r) = stream.message().await.unwrap() {
            out.push(r);
        }
        out
    });
    let pods: Vec<String> = flows
        .iter()
        .filter_map(|r| match &r.response_types {
            Some(cellium_api::v1::get_flows_response::ResponseTypes::Flow(f)) => {
                Some(f.destination.as_ref()?.pod_name.clone())
            }
            _ => None,
        })
        .collect();
    assert!(pods.iter().any(|p| p == "web"), "{pods:?}");
}

//! Network policy across an agent restart: identities are restored with the same numbers,
//! policy stays enforced, and there is no moment of open access.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test policy_restart -- --test-threads=1`.
//!
//! From before the agent stops until after the new agent enforces policy again, hammers try
//! denied flows without pause (UDP datagrams and ICMP echoes every millisecond, new TCP
//! connections every 50 ms; pod to pod, pod to the world and the world to a pod; peers with
//! pod, CIDR and reserved identities) and must never get through, while allowed TCP and UDP
//! flows that were established before keep making round trips. Pods are dual-stack: every
//! hammer, stream and table runs in IPv4 and IPv6. The agent is stopped with SIGTERM in one
//! test and killed with SIGKILL in the other.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cellium_integration::lab::{Family, Flow, Lab, Stream, fixture};
use cellium_integration::reach::Probe::{self, Icmp, Tcp, Udp};
use cellium_integration::serial;

/// Pod, namespace, ipBlock (pods and the world) and entity rules: what the agent must restore.
const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: dns, namespace: ops }
spec:
  podSelector: { matchLabels: { app: dns } }
  ingress:
  - from: [ { ipBlock: { cidr: 10.244.0.8/29 } }, { ipBlock: { cidr: "fd00:10:244::8/125" } } ]
    ports: [ { port: 53, protocol: UDP } ]
  - from:
    - ipBlock: { cidr: 10.99.0.0/24, except: [ 10.99.0.20/32 ] }
    - ipBlock: { cidr: "fd00:99::/64", except: [ "fd00:99::20/128" ] }
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: tool, namespace: dev }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  egress: [ { toEntities: [ cluster ] } ]
"#;

const PROBES: [Probe; 3] = [Tcp(5432), Udp(53), Icmp];

/// What [`POLICIES`] allow.
fn expected(f: &Flow<'_>) -> bool {
    let ingress = f.from.is_node()
        || match f.to.name.as_str() {
            "shop/db" => f.from.is("shop/web") && f.probe == Tcp(5432),
            // 10.244.0.8/29 (fd00:10:244::8/125) holds shop/web (.10) and shop/db (.11).
            "ops/dns" => {
                f.from.is("ext-a")
                    || ((f.from.is("shop/web") || f.from.is("shop/db")) && f.probe == Udp(53))
            }
            _ => true,
        };
    let egress = !f.from.is("dev/tool") || !f.to.is_external();
    ingress && egress
}

/// Denied flows to hammer: pod identities, a pod with an ipBlock label, the world, a CIDR
/// identity inside an exception, and an egress to the world.
const DENIED: [(&str, &str, Probe); 7] = [
    ("dev/web", "shop/db", Udp(53)),
    ("dev/web", "shop/db", Tcp(5432)),
    ("dev/tool", "shop/db", Icmp),
    ("shop/web", "shop/db", Udp(53)),
    ("ext-b", "ops/dns", Udp(53)),
    ("ext-a", "shop/db", Icmp),
    ("dev/tool", "ext-a", Udp(53)),
];

/// Identity numbers and labels, as `cellium identity list` shows them.
fn identity_table(lab: &Lab) -> BTreeMap<u64, Vec<String>> {
    lab.agent()
        .cli_json(&["identity", "list"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let labels = i["labels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap().to_string())
                .collect();
            (i["id"].as_u64().unwrap(), labels)
        })
        .collect()
}

fn restart_keeps_policy_without_a_window(kill: bool) {
    let mut lab = fixture::lab(fixture::dual_stack()).unwrap();
    lab.apply_policy(POLICIES).unwrap();
    // The hammered flows are denied flows of the table below.
    let places = lab.places().unwrap();
    let place = |name: &str| places.iter().find(|p| p.is(name)).unwrap();
    for (family, (from, to, probe)) in Family::ALL.into_iter().flat_map(|f| DENIED.map(|d| (f, d)))
    {
        let flow = Flow {
            from: place(from),
            to: place(to),
            probe,
            family,
        };
        assert!(
            PROBES.contains(&probe) && !expected(&flow),
            "{from} -> {to} {probe} ({family})"
        );
    }
    lab.check("before the restart", &PROBES, expected);
    let identities = lab.identities().unwrap();
    let table = identity_table(&lab);
    assert!(
        identities.values().any(|id| *id >= 1 << 24),
        "a pod inside an ipBlock has a node-local identity: {identities:?}"
    );

    let mut streams = Vec::new();
    for family in Family::ALL {
        for (name, from, to, probe) in [
            ("tcp shop/web -> shop/db", "shop/web", "shop/db", Tcp(5432)),
            ("udp shop/web -> ops/dns", "shop/web", "ops/dns", Udp(53)),
        ] {
            let flow = lab.open_in(family, from, to, probe).unwrap();
            streams.push((format!("{name} ({family})"), Stream::start(flow)));
        }
    }
    let hammers: Vec<_> = Family::ALL
        .into_iter()
        .flat_map(|f| DENIED.map(|d| (f, d)))
        .map(|(family, (from, to, probe))| lab.hammer_in(family, from, to, probe).unwrap())
        .collect();

    std::thread::sleep(Duration::from_millis(500));
    let stopping = Instant::now();
    if kill {
        lab.agent_mut().kill().unwrap();
    } else {
        let (status, _) = lab.agent_mut().stop().unwrap();
        assert!(status.success(), "{status}");
    }
    let down = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let starting = Instant::now();
    lab.agent_mut().start().expect("restart");
    let up = Instant::now();
    lab.settle().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let end = Instant::now();

    let mut report = Vec::new();
    for hammer in hammers {
        let log = hammer.finish().unwrap();
        let phases = [
            (
                "before the stop",
                log.attempts_between(log.attempts[0], stopping),
            ),
            ("while down", log.attempts_between(down, starting)),
            ("while starting", log.attempts_between(starting, up)),
            ("after the start", log.attempts_between(up, end)),
        ];
        eprintln!(
            "{}: attempts {phases:?}, {} got through",
            log.what,
            log.breaches.len()
        );
        for (phase, n) in phases {
            if n == 0 && phase != "while starting" {
                report.push(format!("{}: no attempt {phase}", log.what));
            }
        }
        if let Some((at, what)) = log.breaches.first() {
            report.push(format!(
                "{}: {} attempts got through, the first {:?} after the stop began ({what})",
                log.what,
                log.breaches.len(),
                at.saturating_duration_since(stopping)
            ));
        }
    }
    for (name, stream) in streams {
        let log = stream.finish().unwrap();
        eprintln!(
            "{name}: {} round trips, longest gap {:?}",
            log.rounds.len(),
            log.max_gap()
        );
        if let Some((at, why)) = &log.failure {
            report.push(format!(
                "{name} broke {:?} after the stop began: {why}",
                at.saturating_duration_since(stopping)
            ));
        }
        if log.rounds_between(down, starting) == 0 || log.rounds_between(up, end) == 0 {
            report.push(format!(
                "{name}: no round trip while down or after the start"
            ));
        }
        if log.max_gap() > Duration::from_millis(500) {
            report.push(format!("{name} stalled for {:?}", log.max_gap()));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));

    assert_eq!(
        lab.identities().unwrap(),
        identities,
        "pods changed identity"
    );
    assert_eq!(identity_table(&lab), table, "identities were renumbered");
    let status = lab.agent().cli_json(&["status"]).unwrap().to_string();
    assert!(
        status.contains("5 endpoints restored, 0 removed"),
        "{status}"
    );
    lab.check("after the restart", &PROBES, expected);
}

#[test]
fn sigterm_and_start_keep_identities_and_policy_with_no_window_of_open_access() {
    let _serial = serial();
    restart_keeps_policy_without_a_window(false);
}

#[test]
fn sigkill_and_start_keep_identities_and_policy_with_no_window_of_open_access() {
    let _serial = serial();
    restart_keeps_policy_without_a_window(true);
}

/// shop/web may open connections only to ports named `dns-tcp`, which only the pod of
/// ops/dns names (53/TCP); ops/dns is the last endpoint restored (the restore reads the
/// records in the order of their ids).
const NAMED_EGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-out, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: dns-tcp } ] } ]
"#;

/// New connections that an egress rule allows by the name of the peer's port are never
/// refused across a restart: every endpoint publishes its pod's named ports before any is
/// enforced, so one restored early does not close the port of one restored later.
fn restart_keeps_named_ports_open(kill: bool) {
    let mut lab = fixture::lab(cellium_integration::AgentOptions::default()).unwrap();
    lab.apply_policy(NAMED_EGRESS).unwrap();
    let ids: Vec<u64> = ["shop/web", "ops/dns"]
        .iter()
        .map(|p| lab.endpoints().unwrap()[*p]["id"].as_u64().unwrap())
        .collect();
    assert!(
        ids[0].to_string() < ids[1].to_string(),
        "ops/dns is restored after shop/web: {ids:?}"
    );
    lab.check("before the restart", &[Tcp(53), Tcp(8080)], |f| {
        !f.from.is("shop/web") || (f.to.is("ops/dns") && f.probe == Tcp(53))
    });

    // A new connection every millisecond, each of which must get through.
    let hammer = lab.hammer("shop/web", "ops/dns", Tcp(53)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    if kill {
        lab.agent_mut().kill().unwrap();
    } else {
        let (status, _) = lab.agent_mut().stop().unwrap();
        assert!(status.success(), "{status}");
    }
    let starting = Instant::now();
    lab.agent_mut().start().expect("restart");
    lab.settle().unwrap();
    let settled = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let log = hammer.finish().unwrap();

    let through: std::collections::HashSet<Instant> = log.breaches.iter().map(|b| b.0).collect();
    let refused: Vec<Instant> = log
        .attempts
        .iter()
        .copied()
        .filter(|t| !through.contains(t))
        .collect();
    assert!(
        log.attempts_between(starting, settled) > 0,
        "no attempt while the agent started"
    );
    assert!(
        refused.is_empty(),
        "{} of {} new connections refused, the first {:?} after the start began",
        refused.len(),
        log.attempts.len(),
        refused[0].saturating_duration_since(starting)
    );
    lab.check("after the restart", &[Tcp(53), Tcp(8080)], |f| {
        !f.from.is("shop/web") || (f.to.is("ops/dns") && f.probe == Tcp(53))
    });
}

#[test]
fn sigterm_and_start_keep_a_port_allowed_by_name_open() {
    let _serial = serial();
    restart_keeps_named_ports_open(false);
}

#[test]
fn sigkill_and_start_keep_a_port_allowed_by_name_open() {
    let _serial = serial();
    restart_keeps_named_ports_open(true);
}

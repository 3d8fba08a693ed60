//! Network policy under change: policies updated and deleted while connections are open,
//! pods created after their policies and relabelled, namespaces relabelled, and the policy
//! directory (`--policy-dir`) followed as files are dropped in, edited and removed. After
//! every change, a truth table of real TCP, UDP and ICMP flows.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test policy_live -- --test-threads=1`.
//!
//! The cluster is `lab::fixture` (pods `shop/web`, `shop/db`, `dev/web`, `dev/tool`,
//! `ops/dns`, the node, and `ext-a`/`ext-b` outside the cluster); every test has its own agent
//! and namespaces and removes them when it ends.

use cellium_integration::lab::{Lab, OpenFlow, fixture};
use cellium_integration::reach::Outcome;
use cellium_integration::reach::Probe::{Icmp, Tcp, Udp};
use cellium_integration::{AgentOptions, CniCall, NetNs, serial};

const PROBES: [cellium_integration::reach::Probe; 3] = [Tcp(5432), Udp(53), Icmp];

/// Asserts that every open flow still makes a round trip.
#[track_caller]
fn still_open(state: &str, flows: &mut [(&str, &mut OpenFlow)]) {
    let failed: Vec<String> = flows
        .iter_mut()
        .filter_map(|(name, f)| match f.round_trip() {
            Outcome::Answered => None,
            other => Some(format!("{name}: {other}")),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{state}: established flows stopped: {}",
        failed.join(", ")
    );
}

const DB_FROM_WEB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
"#;

const DB_FROM_TOOL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress:
  - from: [ { namespaceSelector: { matchLabels: { team: b } }, podSelector: { matchLabels: { app: tool } } } ]
"#;

const WEB_NO_EGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-silent, namespace: shop }
spec: { podSelector: { matchLabels: { app: web } }, policyTypes: [ Egress ] }
"#;

#[test]
fn established_flows_follow_conntrack_while_new_flows_follow_each_policy_change() {
    let _serial = serial();
    let mut lab = fixture::lab(AgentOptions::default()).unwrap();
    // Opened with no policy at all.
    let mut web_db_tcp = lab.open("shop/web", "shop/db", Tcp(5432)).unwrap();
    let mut web_db_udp = lab.open("shop/web", "shop/db", Udp(53)).unwrap();
    let mut tool_db_tcp = lab.open("dev/tool", "shop/db", Tcp(5432)).unwrap();

    // 1. db takes only web on 5432/TCP: the UDP flow and tool's connection are now denied
    //    for new flows, and keep flowing.
    lab.apply_policy(DB_FROM_WEB).unwrap();
    still_open(
        "db from web",
        &mut [
            ("web->db tcp", &mut web_db_tcp),
            ("web->db udp", &mut web_db_udp),
            ("tool->db tcp", &mut tool_db_tcp),
        ],
    );
    lab.check("db from web", &PROBES, |f| {
        !f.to.is("shop/db") || f.from.is_node() || (f.from.is("shop/web") && f.probe == Tcp(5432))
    });

    // 2. The same policy, updated: db takes only tool. web's connection stays; a new one
    //    does not get through, tool's new ones do.
    lab.apply_policy(DB_FROM_TOOL).unwrap();
    let mut tool_db_tcp2 = lab.open("dev/tool", "shop/db", Tcp(5432)).unwrap();
    still_open(
        "db from tool",
        &mut [
            ("web->db tcp", &mut web_db_tcp),
            ("web->db udp", &mut web_db_udp),
            ("tool->db tcp", &mut tool_db_tcp),
            ("tool->db tcp (2)", &mut tool_db_tcp2),
        ],
    );
    lab.check("db from tool", &PROBES, |f| {
        !f.to.is("shop/db") || f.from.is_node() || f.from.is("dev/tool")
    });

    // 3. web may send nothing any more: its open flows stay, its new ones stop.
    lab.apply_policy(WEB_NO_EGRESS).unwrap();
    still_open(
        "web silent",
        &mut [
            ("web->db tcp", &mut web_db_tcp),
            ("web->db udp", &mut web_db_udp),
        ],
    );
    lab.check("web silent, db from tool", &PROBES, |f| {
        let db = !f.to.is("shop/db") || f.from.is_node() || f.from.is("dev/tool");
        db && !f.from.is("shop/web")
    });

    // 4. Both deleted: everything new flows again, and what was open still is.
    lab.delete_policy(&format!("{DB_FROM_TOOL}---{WEB_NO_EGRESS}"))
        .unwrap();
    still_open(
        "no policy",
        &mut [
            ("web->db tcp", &mut web_db_tcp),
            ("web->db udp", &mut web_db_udp),
            ("tool->db tcp", &mut tool_db_tcp),
            ("tool->db tcp (2)", &mut tool_db_tcp2),
        ],
    );
    lab.check("policies deleted", &PROBES, |_| true);
}

#[test]
fn pods_created_after_their_policies_and_relabelled_pods_and_namespaces_follow_them() {
    let _serial = serial();
    let mut lab = Lab::start(AgentOptions::default()).unwrap();
    lab.apply(fixture::BASE).unwrap();
    // Policies first, pods afterwards: each endpoint is born enforcing them, its ipBlock
    // labels included.
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress:
  - from: [ { namespaceSelector: { matchLabels: { team: a } }, podSelector: { matchLabels: { app: web } } } ]
  - from: [ { ipBlock: { cidr: 10.244.0.20/31 } } ]
    ports: [ { port: 53, protocol: UDP } ]
"#,
    )
    .unwrap();
    for (key, ip) in fixture::PODS {
        lab.add_pod(key, ip).unwrap();
    }
    lab.settle().unwrap();
    // team-a web pods: shop/web; 10.244.0.20/31: dev/web and dev/tool, on 53/UDP.
    let db_in = |from: &str, probe| {
        from == "shop/web" || from == "node" || (from.starts_with("dev/") && probe == Udp(53))
    };
    lab.check("created after the policy", &PROBES, |f| {
        !f.to.is("shop/db") || db_in(&f.from.name, f.probe)
    });

    // dev becomes team a: dev/web now matches both selectors of the first peer.
    let before = lab.identities().unwrap();
    lab.apply("apiVersion: v1\nkind: Namespace\nmetadata: { name: dev, labels: { team: a } }\n")
        .unwrap();
    lab.wait_until("dev/web has a new identity", |l| {
        Ok(l.identities()?.get("dev/web") != before.get("dev/web"))
    })
    .unwrap();
    lab.settle().unwrap();
    lab.check("dev relabelled to team a", &PROBES, |f| {
        !f.to.is("shop/db") || db_in(&f.from.name, f.probe) || f.from.is("dev/web")
    });

    // shop/web stops being a web pod, so db no longer takes it; ops/dns becomes a web pod of
    // a team-a namespace, so db takes it.
    let before = lab.identities().unwrap();
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: web, namespace: shop, labels: { app: shop-front } }\nspec: { containers: [ { name: c } ] }\n---\napiVersion: v1\nkind: Pod\nmetadata: { name: dns, namespace: ops, labels: { app: web } }\nspec: { containers: [ { name: c } ] }\n",
    )
    .unwrap();
    lab.wait_until("shop/web and ops/dns have new identities", |l| {
        let now = l.identities()?;
        Ok(now.get("shop/web") != before.get("shop/web")
            && now.get("ops/dns") != before.get("ops/dns"))
    })
    .unwrap();
    lab.settle().unwrap();
    lab.check("pods relabelled", &PROBES, |f| {
        !f.to.is("shop/db")
            || f.from.is("node")
            || f.from.is("dev/web")
            || f.from.is("ops/dns")
            || (f.from.in_ns("dev") && f.probe == Udp(53))
    });
}

#[test]
fn the_policy_directory_is_followed_as_files_come_change_and_go() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let opts = AgentOptions {
        env: vec![(
            "CELLIUM_POLICY_DIR".into(),
            dir.path().display().to_string(),
        )],
        ..AgentOptions::default()
    };
    let mut lab = fixture::lab(opts).unwrap();
    lab.check("empty directory", &PROBES, |_| true);

    // Dropped in.
    let file = dir.path().join("shop.yaml");
    let before = lab.revision().unwrap();
    std::fs::write(&file, DB_FROM_WEB).unwrap();
    lab.wait_revision_after(before).unwrap();
    lab.settle().unwrap();
    lab.check("file dropped in", &PROBES, |f| {
        !f.to.is("shop/db") || f.from.is_node() || (f.from.is("shop/web") && f.probe == Tcp(5432))
    });

    // Edited: the same policy now takes tool, and a second policy joins the file.
    let before = lab.revision().unwrap();
    std::fs::write(&file, format!("{DB_FROM_TOOL}---{WEB_NO_EGRESS}")).unwrap();
    lab.wait_revision_after(before).unwrap();
    lab.settle().unwrap();
    lab.check("file edited", &PROBES, |f| {
        let db = !f.to.is("shop/db") || f.from.is_node() || f.from.is("dev/tool");
        db && !f.from.is("shop/web")
    });

    // Removed: its policies go with it.
    let before = lab.revision().unwrap();
    std::fs::remove_file(&file).unwrap();
    lab.wait_revision_after(before).unwrap();
    lab.settle().unwrap();
    lab.check("file removed", &PROBES, |_| true);
}

#[test]
fn a_pod_created_at_a_deleted_pods_address_takes_its_own_identity_and_policy() {
    let _serial = serial();
    // The new pod asks for the deleted one's address at once: the release quarantine off.
    let mut lab = fixture::lab(AgentOptions {
        env: vec![("CELLIUM_IPAM_RELEASE_QUARANTINE".into(), "0s".into())],
        ..AgentOptions::default()
    })
    .unwrap();
    lab.apply_policy(DB_FROM_WEB).unwrap();
    let before = lab.identities().unwrap();
    // shop/web (10.244.0.10) goes; a pod of dev that db does not take gets its address.
    lab.remove_pod("shop/web").unwrap();
    lab.delete("apiVersion: v1\nkind: Pod\nmetadata: { name: web, namespace: shop }\n")
        .unwrap();
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: intruder, namespace: dev, labels: { app: intruder } }\nspec: { containers: [ { name: c } ] }\n",
    )
    .unwrap();
    // The runtime's ADD for an attachment that exists, naming another namespace, is refused
    // rather than answered with the existing endpoint (which would leave this pod without
    // networking while its runtime believes otherwise).
    let dns = lab.pod("ops/dns").unwrap().container_id.clone();
    let elsewhere = NetNs::new().unwrap();
    let (status, out) = lab
        .agent()
        .cni(
            &CniCall::new("ADD", &dns)
                .netns(elsewhere.path())
                .args("K8S_POD_NAMESPACE=dev;K8S_POD_NAME=intruder"),
        )
        .unwrap();
    assert!(!status.success(), "{out}");
    assert_eq!(out["code"], 104, "{out}");
    let msg = out["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&elsewhere.path().display().to_string()),
        "{msg}"
    );
    assert!(elsewhere.ip(&["link", "show", "eth0"]).is_err());
    lab.add_pod("dev/intruder", "10.244.0.10".parse().unwrap())
        .unwrap();
    lab.settle().unwrap();
    let after = lab.identities().unwrap();
    assert!(!after.contains_key("shop/web"), "{after:?}");
    assert_ne!(after.get("dev/intruder"), before.get("shop/web"));
    lab.check("address reused", &PROBES, |f| {
        !f.to.is("shop/db") || f.from.is_node()
    });
    // And a web pod again, at a new address: db takes it.
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: web2, namespace: shop, labels: { app: web } }\nspec: { containers: [ { name: c } ] }\n",
    )
    .unwrap();
    lab.add_pod("shop/web2", "10.244.0.12".parse().unwrap())
        .unwrap();
    lab.settle().unwrap();
    lab.check("a new web pod", &PROBES, |f| {
        !f.to.is("shop/db") || f.from.is_node() || (f.from.is("shop/web2") && f.probe == Tcp(5432))
    });
}

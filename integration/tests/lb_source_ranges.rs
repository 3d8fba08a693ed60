//! `loadBalancerSourceRanges` end to end: the real agent in a node namespace with the lab's
//! external network on `celx0`, whose namespace holds two clients of each family (`ext-a`
//! 10.99.0.10 / fd00:99::10, `ext-b` 10.99.0.20 / fd00:99::20); a LoadBalancer service whose
//! ingress IPs are routed to the node admits only the clients its ranges hold, at its ingress
//! IPs only, and its entries in the pinned source range maps follow the service.
//!
//! Root, serially, after `cargo build --workspace --bins`:
//! `cargo test -p cellium-integration --test lb_source_ranges -- --test-threads=1`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use cellium_datapath_bpf::abi::{Lb4SrcRangeKey, Lb6SrcRangeKey, Plain};
use cellium_integration::lab::external::{EXT_ADDRS, EXT_ADDRS6, NODE_LINK_IP};
use cellium_integration::lab::service_bed::{NODE6, ServiceBed, frontends, pods};
use cellium_integration::probe::{PeerServer, seen_from, seen_from_source};
use cellium_integration::wait::wait_for;
use cellium_integration::{Agent, serial};
use libbpf_rs::{MapCore, MapHandle};
use serde_json::Value;

/// The ingress IPs of the service, routed to the node in the external namespace.
const LB4: &str = "192.0.2.30";
const LB6: &str = "2001:db8:30::1";
/// A client outside every range stays unanswered: long enough for a refusal to show.
const DROPPED: Duration = Duration::from_secs(1);

/// The LoadBalancer service `guarded` selecting web-0, with `ranges` (YAML list items).
fn guarded(ranges: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: guarded }}\nspec:\n  type: LoadBalancer\n  ipFamilyPolicy: PreferDualStack\n  externalTrafficPolicy: Local\n  selector: {{ app: web }}\n  ports: [ {{ name: http, port: 80, targetPort: http }} ]\n  loadBalancerSourceRanges: [ {ranges} ]\nstatus: {{ loadBalancer: {{ ingress: [ {{ ip: {LB4} }}, {{ ip: \"{LB6}\" }} ] }} }}\n"
    )
}

fn frontends_of(agent: &Agent, kind: &str) -> Vec<Value> {
    frontends(agent)
        .into_iter()
        .filter(|f| f["service"] == "default/guarded" && f["kind"] == kind)
        .collect()
}

/// Every rev-NAT id with an entry in the pinned `cel_lb4_source_range` / `cel_lb6_source_range`.
fn ids_in_maps(agent: &Agent) -> Vec<u16> {
    let open = |name: &str| {
        MapHandle::from_pinned_path(agent.bpf_root().join("maps").join(name))
            .unwrap_or_else(|e| panic!("the pinned {name}: {e}"))
    };
    let mut ids: Vec<u16> = open("cel_lb4_source_range")
        .keys()
        .map(|k| Lb4SrcRangeKey::decode(&k).expect("a key").rev_nat_id)
        .chain(
            open("cel_lb6_source_range")
                .keys()
                .map(|k| Lb6SrcRangeKey::decode(&k).expect("a key").rev_nat_id),
        )
        .collect();
    ids.sort_unstable();
    ids
}

/// Drops counted as `not in source range`, in either direction's counter.
fn not_in_range(agent: &Agent) -> u64 {
    ["ingress", "egress"]
        .iter()
        .map(|d| {
            agent
                .datapath_packets(d, "not in source range")
                .expect("metrics")
        })
        .sum()
}

#[test]
fn load_balancer_source_ranges_admit_only_their_clients_at_the_ingress_ips() {
    let _serial = serial();
    let mut bed = ServiceBed::start(&pods(1, true), "lbsr").expect("the service bed");
    let _servers: Vec<PeerServer> = bed
        .web_ips
        .iter()
        .map(|ip| PeerServer::start(&bed.web, SocketAddr::new(*ip, 8080)).expect("server"))
        .collect();
    let agent = &bed.agent;
    let outside = bed.external.netns();
    let v6 = bed.external.addrs6().is_some();
    outside
        .ip(&["route", "add", LB4, "via", &NODE_LINK_IP.to_string()])
        .expect("route the IPv4 ingress IP to the node");
    if v6 {
        outside
            .ip(&["-6", "route", "add", LB6, "via", NODE6])
            .expect("route the IPv6 ingress IP to the node");
    }
    let a = [IpAddr::from(EXT_ADDRS[0].1), IpAddr::from(EXT_ADDRS6[0])];
    let b = [IpAddr::from(EXT_ADDRS[1].1), IpAddr::from(EXT_ADDRS6[1])];
    let lbs: [IpAddr; 2] = [LB4.parse().unwrap(), LB6.parse().unwrap()];
    let families = if v6 { 2 } else { 1 };
    let reached = |client: IpAddr, lb: IpAddr| {
        seen_from_source(outside, client, SocketAddr::new(lb, 80), DROPPED).ok()
    };

    // Admitted: ext-a of each family.
    agent
        .objects("apply", &guarded(&format!("{}/32, \"{}/128\"", a[0], a[1])))
        .expect("apply the service");
    wait_for("both ingress frontends served", || {
        let lb = frontends_of(agent, "LoadBalancer");
        (lb.len() == families
            && lb
                .iter()
                .all(|f| f["error"].is_null() && f["rev_nat_id"] != 0))
        .then_some(())
    });
    for f in 0..families {
        let seen = wait_for(&format!("{} reaching {}", a[f], lbs[f]), || {
            reached(a[f], lbs[f])
        });
        assert_eq!(seen, a[f], "Local keeps the client's address");
    }
    let before = not_in_range(agent);
    for f in 0..families {
        assert_eq!(
            reached(b[f], lbs[f]),
            None,
            "{} is outside the ranges",
            b[f]
        );
    }
    wait_for("the drops counted as not in source range", || {
        (not_in_range(agent) >= before + families as u64).then_some(())
    });
    wait_for("the drops' flows", || {
        let out = agent
            .cli(&["observe", "--all", "--verdict", "DROPPED", "-o", "json"])
            .ok()?;
        out.lines()
            .any(|l| l.contains("DENIED_BY_LB_SRC_RANGE_CHECK"))
            .then_some(())
    });

    // The node port of the same service is not restricted; nor is its cluster IP, from a pod
    // (outside the ranges too), which its ingress IP refuses.
    let node_port = wait_for("the node port", || {
        frontends_of(agent, "NodePort")
            .iter()
            .find(|f| f["vip"] == NODE_LINK_IP.to_string().as_str())
            .and_then(|f| f["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
    });
    let seen = seen_from_source(
        outside,
        b[0],
        SocketAddr::new(NODE_LINK_IP.into(), node_port),
        Duration::from_secs(2),
    )
    .expect("ext-b through the node port");
    assert_eq!(seen, b[0]);
    for cluster in frontends_of(agent, "ClusterIP") {
        let vip: IpAddr = cluster["vip"].as_str().unwrap().parse().unwrap();
        let seen = seen_from(&bed.client, SocketAddr::new(vip, 80)).expect("the cluster IP");
        assert!(bed.client_ips.contains(&seen), "{seen}");
    }
    assert!(
        seen_from_source(
            &bed.client,
            bed.client_ips[0],
            SocketAddr::new(lbs[0], 80),
            DROPPED
        )
        .is_err(),
        "the pod is outside the ranges of the ingress IP"
    );

    // Changed ranges: ext-b admitted, ext-a no longer.
    agent
        .objects(
            "apply",
            // A /28 holding ext-b (10.99.0.20), not ext-a (10.99.0.10).
            &guarded(&format!("10.99.0.16/28, \"{}/128\"", b[1])),
        )
        .expect("apply the changed ranges");
    for f in 0..families {
        let seen = wait_for(&format!("{} reaching {}", b[f], lbs[f]), || {
            reached(b[f], lbs[f])
        });
        assert_eq!(seen, b[f]);
        assert_eq!(reached(a[f], lbs[f]), None, "{} is outside now", a[f]);
    }

    // The ranges hold while the agent is down (the pinned maps enforce them) and after it
    // comes back (it reads them back from the pins, and removes none).
    let ids = ids_in_maps(&bed.agent);
    bed.agent.stop().expect("stop the agent");
    for f in 0..families {
        assert_eq!(
            reached(a[f], lbs[f]),
            None,
            "{} refused while stopped",
            a[f]
        );
        assert!(
            reached(b[f], lbs[f]).is_some(),
            "{} admitted while stopped",
            b[f]
        );
    }
    bed.agent.start().expect("start the agent again");
    let agent = &bed.agent;
    assert_eq!(ids_in_maps(agent), ids, "the same ranges, read back");
    for f in 0..families {
        assert_eq!(
            reached(a[f], lbs[f]),
            None,
            "{} refused after the restart",
            a[f]
        );
        let seen = wait_for(
            &format!("{} reaching {} after the restart", b[f], lbs[f]),
            || reached(b[f], lbs[f]),
        );
        assert_eq!(seen, b[f]);
    }

    // A /0 admits every client.
    agent
        .objects("apply", &guarded("0.0.0.0/0, \"::/0\""))
        .expect("apply /0");
    for f in 0..families {
        for client in [a[f], b[f]] {
            wait_for(&format!("{client} reaching {} through /0", lbs[f]), || {
                reached(client, lbs[f])
            });
        }
    }

    // Deleted: the maps hold nothing of its frontends.
    let ids: Vec<u16> = frontends_of(agent, "LoadBalancer")
        .iter()
        .filter_map(|f| f["rev_nat_id"].as_u64())
        .filter_map(|id| u16::try_from(id).ok())
        .collect();
    assert_eq!(ids.len(), families, "an ingress frontend per family");
    assert!(ids_in_maps(agent).iter().any(|id| ids.contains(id)));
    agent
        .objects("delete", &guarded("0.0.0.0/0"))
        .expect("delete the service");
    wait_for("the service's source ranges removed", || {
        let left = ids_in_maps(agent);
        (!left.iter().any(|id| ids.contains(id))).then_some(())
    });
}

//! Network policy, packet by packet: truth tables of real TCP, UDP and ICMP flows between
//! dual-stack pods in three Kubernetes namespaces, the node and an external network, in IPv4
//! and IPv6, one scenario per feature.
//!
//! Root, serially, after `cargo build --workspace` (the tests run the built binaries):
//! `cargo test -p cellium-integration --test policy -- --test-threads=1`.
//!
//! Each test starts its own agent in its own node namespace, applies the namespaces and pods
//! of `lab::fixture::BASE` with `cellium apply`, creates the pods through `cellium-cni` (kubelet's
//! `K8S_POD_NAMESPACE`/`K8S_POD_NAME`, fixed addresses so that ipBlocks can name them), and
//! removes everything when it ends (guards). For every flow (source, destination, probe) of a
//! scenario the expectation is written out as a condition in the scenario's own terms; a
//! failure prints the whole table with every difference marked.
//!
//! The places: pods `shop/web`, `shop/db`, `dev/web`, `dev/tool`, `ops/dns`; `node` (the pods'
//! gateway address in the node namespace); `ext-a` (10.99.0.10, fd00:99::10) and `ext-b`
//! (10.99.0.20, fd00:99::20) in a namespace routed through the node, outside the cluster. Every
//! flow is probed in both families (`f.v6()` says which); CIDR rules are per family, so the
//! scenarios that have them give each family its own and expect each its own table. A pod's
//! identity is one for all its addresses: an ipBlock covering one of a pod's addresses selects
//! the pod in both families (the scenarios mirror their pod blocks in IPv6).

use cellium_integration::lab::{Family, Flow, Lab, fixture};
use cellium_integration::reach::Probe::{self, Icmp, Tcp, Udp};
use cellium_integration::serial;

/// A dual-stack lab with the pods of [`fixture::BASE`] and no policy.
fn lab() -> Lab {
    fixture::lab(fixture::dual_stack()).expect("the lab")
}

const COMMON: [Probe; 4] = [Tcp(80), Tcp(5432), Udp(53), Icmp];

#[test]
fn without_policy_everything_flows() {
    let _serial = serial();
    let mut lab = lab();
    let table = lab.table("no policy", &COMMON, |_| true).expect("probed");
    table.assert();
    // Every pair in both families: 5 pods with each other and with the node and the two
    // external addresses, both ways: 5 * 4 + 5 * 3 * 2 = 50 pairs.
    for family in [Family::Ipv4, Family::Ipv6] {
        let rows = table.rows.iter().filter(|r| r.family == family).count();
        assert_eq!(rows, 50 * COMMON.len(), "{family}");
    }
}

#[test]
fn a_selected_pod_is_default_deny_in_each_direction_its_policy_names() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(fixture::DEFAULT_DENY_PER_DIRECTION)
        .unwrap();
    lab.check("default deny per direction", &COMMON, |f| {
        // shop/db takes nothing in but from the node (allow-localhost), and still sends;
        // dev/tool sends nothing (the node included) and still takes everything in.
        if f.to.is("shop/db") {
            return f.from.is_node();
        }
        !f.from.is("dev/tool")
    });
}

#[test]
fn namespaces_isolate_themselves_with_an_empty_pod_selector() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(fixture::NAMESPACE_ISOLATION).unwrap();
    lab.check("namespace isolation", &COMMON, |f| {
        // dev talks only to dev, in both directions; shop takes in only shop (and the node).
        if f.from.in_ns("dev") && !f.to.in_ns("dev") {
            return false;
        }
        for ns in ["shop", "dev"] {
            if f.to.in_ns(ns) {
                return f.from.in_ns(ns) || f.from.is_node();
            }
        }
        true
    });
}

#[test]
fn pod_and_namespace_selectors_in_one_peer_need_both_and_in_two_peers_either() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: one-peer, namespace: dev }
spec:
  podSelector: { matchLabels: { app: tool } }
  ingress:
  - from: [ { namespaceSelector: { matchLabels: { team: a } }, podSelector: { matchLabels: { app: web } } } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: two-peers, namespace: dev }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress:
  - from: [ { namespaceSelector: { matchLabels: { team: a } } }, { podSelector: { matchLabels: { app: tool } } } ]
"#,
    )
    .unwrap();
    lab.check("one peer vs two peers", &COMMON, |f| {
        match f.to.name.as_str() {
            // web pods of team-a namespaces: shop/web only.
            "dev/tool" => f.from.is("shop/web") || f.from.is_node(),
            // every pod of team-a namespaces (shop, ops), or tool pods of dev.
            "dev/web" => {
                f.from.in_ns("shop")
                    || f.from.in_ns("ops")
                    || f.from.is("dev/tool")
                    || f.from.is_node()
            }
            _ => true,
        }
    });
}

#[test]
fn ip_blocks_with_exceptions_cover_pod_and_external_addresses() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-egress-blocks, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [ Egress ]
  egress:
  - to:
    - ipBlock: { cidr: 10.244.0.16/28, except: [ 10.244.0.21/32 ] }
    - ipBlock: { cidr: "fd00:10:244::10/124", except: [ "fd00:10:244::15/128" ] }
  - to:
    - ipBlock: { cidr: 10.99.0.0/24, except: [ 10.99.0.20/32 ] }
    - ipBlock: { cidr: "fd00:99::/64", except: [ "fd00:99::10/128" ] }
    ports: [ { port: 80 } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: dns-ingress-blocks, namespace: ops }
spec:
  podSelector: { matchLabels: { app: dns } }
  ingress:
  - from:
    - ipBlock: { cidr: 10.99.0.0/24, except: [ 10.99.0.20/32 ] }
    - ipBlock: { cidr: "fd00:99::/64" }
    - ipBlock: { cidr: 10.244.0.8/29, except: [ 10.244.0.11/32 ] }
    - ipBlock: { cidr: "fd00:10:244::8/125", except: [ "fd00:10:244::b/128" ] }
"#,
    )
    .unwrap();
    lab.check("ipBlock", &COMMON, |f| {
        let egress = if f.from.is("shop/web") {
            // 10.244.0.16/28 (fd00:10:244::10/124) holds dev/web (.20) and ops/dns (.30), less
            // dev/tool (.21); the external block on port 80 holds ext-a in IPv4 and ext-b in
            // IPv6, where the exception is the other one.
            let outside = if f.v6() { "ext-b" } else { "ext-a" };
            f.to.is("dev/web") || f.to.is("ops/dns") || (f.to.is(outside) && f.probe == Tcp(80))
        } else {
            true
        };
        let ingress = if f.to.is("ops/dns") {
            // ext-a (in IPv6 ext-b too: that block has no exception), and 10.244.0.8/29
            // (shop/web at .10) less shop/db (.11).
            f.from.is("ext-a")
                || (f.v6() && f.from.is("ext-b"))
                || f.from.is("shop/web")
                || f.from.is_node()
        } else {
            true
        };
        egress && ingress
    });
}

#[test]
fn named_ports_are_the_selected_pods_for_ingress_and_the_peers_for_egress() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-http, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { ports: [ { port: http } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-http, namespace: dev }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { ports: [ { port: http } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: dns-udp, namespace: ops }
spec:
  podSelector: { matchLabels: { app: dns } }
  ingress: [ { ports: [ { port: dns, protocol: UDP } ] } ]
  egress:
  - to: [ { namespaceSelector: {} } ]
    ports: [ { port: http }, { port: sql } ]
"#,
    )
    .unwrap();
    let probes = [Tcp(80), Tcp(8080), Tcp(5432), Tcp(53), Udp(53), Icmp];
    lab.check("named ports", &probes, |f| {
        // `http` is 8080 in shop/web and 80 in dev/web; `dns` is 53/UDP (53/TCP is `dns-tcp`).
        let ingress = f.from.is_node()
            || match f.to.name.as_str() {
                "shop/web" => f.probe == Tcp(8080),
                "dev/web" => f.probe == Tcp(80),
                "ops/dns" => f.probe == Udp(53),
                _ => true,
            };
        // ops/dns sends to pods on their own `http` and `sql` ports only.
        let egress = !f.from.is("ops/dns")
            || matches!(
                (f.to.name.as_str(), f.probe),
                ("shop/web", Tcp(8080)) | ("dev/web", Tcp(80)) | ("shop/db", Tcp(5432))
            );
        ingress && egress
    });
}

#[test]
fn an_egress_named_port_without_peers_allows_each_destination_pods_own_port_only() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: http-anywhere, namespace: dev }
spec:
  podSelector: { matchLabels: { app: tool } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: http } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: sql-anywhere, namespace: ops }
spec:
  endpointSelector: { matchLabels: { app: dns } }
  egress: [ { toPorts: [ { ports: [ { port: sql } ] } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: nobody-has-it, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: nosuch } ] } ]
"#,
    )
    .unwrap();
    let probes = [Tcp(80), Tcp(8080), Tcp(5432), Udp(8080), Icmp];
    // `http` is 8080 on shop/web, 80 on dev/web and (once it exists) 5432 on ops/api; `sql`
    // is 5432 on shop/db. The node and the external addresses have no named ports.
    let expect = |f: &Flow<'_>| match f.from.name.as_str() {
        "dev/tool" => matches!(
            (f.to.name.as_str(), f.probe),
            ("shop/web", Tcp(8080)) | ("dev/web", Tcp(80)) | ("ops/api", Tcp(5432))
        ),
        "ops/dns" => f.to.is("shop/db") && f.probe == Tcp(5432),
        // A port name no pod has allows nothing.
        "shop/web" => false,
        _ => true,
    };
    lab.check("egress named ports, every destination", &probes, expect);

    // A pod created afterwards brings its own number for the name: its endpoint's ports reach
    // the other endpoints' policies without any policy change.
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: api, namespace: ops, labels: { app: api } }\n\
         spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 5432 } ] } ] }\n",
    )
    .unwrap();
    let before = lab.revision().unwrap();
    lab.add_pod("ops/api", "10.244.0.40".parse().unwrap())
        .unwrap();
    lab.wait_revision_after(before).unwrap();
    lab.settle().unwrap();
    lab.check("a pod added with a named port", &probes, expect);
}

#[test]
fn port_ranges_allow_exactly_their_ports() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db-ranges, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress:
  - ports: [ { port: 9000, endPort: 9010, protocol: TCP }, { port: 5000, endPort: 5999, protocol: UDP } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: tool-range, namespace: dev }
spec:
  podSelector: { matchLabels: { app: tool } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: 8000, endPort: 9005 } ] } ]
"#,
    )
    .unwrap();
    let probes = [
        Tcp(7999),
        Tcp(8000),
        Tcp(8999),
        Tcp(9000),
        Tcp(9005),
        Tcp(9006),
        Tcp(9010),
        Tcp(9011),
        Udp(4999),
        Udp(5000),
        Udp(5999),
        Udp(6000),
        Udp(9005),
        Icmp,
    ];
    lab.check("port ranges", &probes, |f| {
        let ingress = !f.to.is("shop/db")
            || f.from.is_node()
            || matches!(f.probe, Tcp(9000..=9010) | Udp(5000..=5999));
        // The protocol defaults to TCP: UDP 9005 is outside the range.
        let egress = !f.from.is("dev/tool") || matches!(f.probe, Tcp(8000..=9005));
        ingress && egress
    });
}

#[test]
fn entities_select_the_node_the_world_the_cluster_and_everything() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-entities, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  egress: [ { toEntities: [ host ] } ]
  ingress: [ { fromEntities: [ world ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: tool-cluster, namespace: dev }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  egress: [ { toEntities: [ cluster ] } ]
  ingress: [ { fromEntities: [ cluster ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: dns-all, namespace: ops }
spec:
  endpointSelector: { matchLabels: { app: dns } }
  ingress: [ { fromEntities: [ all ] } ]
  egress: [ { toEntities: [ world ] } ]
"#,
    )
    .unwrap();
    lab.check("entities", &COMMON, |f| {
        let egress = match f.from.name.as_str() {
            "shop/web" => f.to.is_node(),
            "dev/tool" => !f.to.is_external(),
            "ops/dns" => f.to.is_external(),
            _ => true,
        };
        let ingress = match f.to.name.as_str() {
            "shop/web" => f.from.is_external() || f.from.is_node(),
            "dev/tool" => !f.from.is_external(),
            _ => true,
        };
        egress && ingress
    });
}

#[test]
fn deny_rules_win_over_every_allow() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all-in, namespace: shop }
spec: { podSelector: {}, ingress: [ {} ] }
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: no-dev, namespace: shop }
spec:
  endpointSelector: {}
  ingressDeny: [ { fromEndpoints: [ { matchLabels: { k8s:io.kubernetes.pod.namespace: dev } } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: tool-no-5432, namespace: dev }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  egress: [ { toEntities: [ all ] } ]
  egressDeny: [ { toPorts: [ { ports: [ { port: "5432", protocol: TCP } ] } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: ops-not-ext-b }
spec:
  endpointSelector: { matchLabels: { k8s:io.kubernetes.pod.namespace: ops } }
  egress: [ { toEntities: [ all ] } ]
  egressDeny: [ { toCIDR: [ 10.99.0.20/32, "fd00:99::10/128" ] } ]
"#,
    )
    .unwrap();
    lab.check("deny over allow", &COMMON, |f| {
        if f.to.in_ns("shop") && f.from.in_ns("dev") {
            return false;
        }
        if f.from.is("dev/tool") && f.probe == Tcp(5432) {
            return false;
        }
        // The denied CIDR is ext-b's in IPv4 and ext-a's in IPv6.
        let denied = if f.v6() { "ext-a" } else { "ext-b" };
        !(f.from.in_ns("ops") && f.to.is(denied))
    });
}

#[test]
fn icmp_types_are_allowed_and_denied_per_family() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db-icmp, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  ingress:
  - fromEntities: [ all ]
    icmps: [ { fields: [ { type: EchoRequest, family: IPv4 }, { type: 13 }, { type: EchoReply, family: IPv6 } ] } ]
  - fromEndpoints: [ { matchLabels: { app: web } } ]
    icmps: [ { fields: [ { type: 128, family: IPv6 } ] } ]
    toPorts: [ { ports: [ { port: "80", protocol: TCP } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: tool-no-echo }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  egress: [ { toEntities: [ all ] } ]
  egressDeny: [ { icmps: [ { fields: [ { type: Echo }, { type: EchoRequest, family: IPv6 } ] } ] } ]
"#,
    )
    .unwrap();
    lab.check("icmp types", &COMMON, |f| {
        // dev/tool sends no echo request in either family, and everything else.
        if f.from.is("dev/tool") && f.probe == Icmp {
            return false;
        }
        if !f.to.is("shop/db") || f.from.is_node() {
            return true;
        }
        // shop/db: IPv4 echo requests from anyone, IPv6 ones and TCP 80 from shop/web only
        // (the IPv4 type is not the IPv6 one, and an IPv6 echo reply is not a request),
        // nothing else.
        match f.probe {
            Icmp => !f.v6() || f.from.is("shop/web"),
            Tcp(80) => f.from.is("shop/web"),
            _ => false,
        }
    });
}

#[test]
fn egress_and_ingress_rules_hold_together() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  policyTypes: [ Ingress, Egress ]
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [ { port: 5432 } ] } ]
  egress:
  - to: [ { namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: ops } } } ]
    ports: [ { port: 53, protocol: UDP } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-out, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [ Egress ]
  egress:
  - to: [ { podSelector: { matchLabels: { app: db } } } ]
    ports: [ { port: 5432 } ]
  - to: [ { namespaceSelector: { matchLabels: { team: b } } } ]
"#,
    )
    .unwrap();
    lab.check("egress and ingress together", &COMMON, |f| {
        let db_in = !f.to.is("shop/db")
            || f.from.is_node()
            || (f.from.is("shop/web") && f.probe == Tcp(5432));
        let db_out = !f.from.is("shop/db") || (f.to.in_ns("ops") && f.probe == Udp(53));
        let web_out = !f.from.is("shop/web")
            || (f.to.is("shop/db") && f.probe == Tcp(5432))
            || f.to.in_ns("dev");
        db_in && db_out && web_out
    });
}

#[test]
fn cilium_policies_scope_endpoint_selectors_by_namespace_and_clusterwide_ones_do_not() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db-from-web, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  ingress: [ { fromEndpoints: [ { matchLabels: { app: web } } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: tool-from-ops, namespace: dev }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  ingress: [ { fromEndpoints: [ { matchLabels: { k8s:io.kubernetes.pod.namespace: ops } } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: webs-from-tools }
spec:
  endpointSelector: { matchExpressions: [ { key: app, operator: In, values: [ web ] } ] }
  ingress: [ { fromEndpoints: [ { matchLabels: { app: tool } } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: ops-to-pods }
spec:
  endpointSelector: { matchLabels: { k8s:io.kubernetes.pod.namespace: ops } }
  egress: [ { toEndpoints: [ {} ] } ]
"#,
    )
    .unwrap();
    lab.check("Cilium selectors", &COMMON, |f| {
        let ingress = f.from.is_node()
            || match f.to.name.as_str() {
                // A namespaced policy's fromEndpoints: web pods of shop only.
                "shop/db" => f.from.is("shop/web"),
                // ... unless it names the namespace.
                "dev/tool" => f.from.in_ns("ops"),
                // A clusterwide policy selects web pods of every namespace, and tool pods of
                // every namespace as peers.
                "shop/web" | "dev/web" => f.from.is("dev/tool"),
                _ => true,
            };
        // toEndpoints [{}] of a clusterwide policy: every pod, neither the node nor the world.
        let egress = !f.from.in_ns("ops") || f.to.is_pod();
        ingress && egress
    });
}

#[test]
fn cilium_cidr_rules_select_addresses_outside_the_cluster_only() {
    let _serial = serial();
    let mut lab = lab();
    lab.apply_policy(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: dns-from-cidrs, namespace: ops }
spec:
  endpointSelector: { matchLabels: { app: dns } }
  ingress:
  - fromCIDRSet:
    - { cidr: 10.99.0.0/24, except: [ 10.99.0.20/32 ] }
    - { cidr: "fd00:99::/64", except: [ "fd00:99::10/128" ] }
  - fromCIDR: [ 10.244.0.0/24, "fd00:10:244::/112" ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-to-world, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  egress: [ { toEntities: [ world ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: tool-port-53, namespace: dev }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  egress: [ { toPorts: [ { ports: [ { port: "53" } ] } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db-not-from-world, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  enableDefaultDeny: { ingress: false }
  ingressDeny: [ { fromEntities: [ world ] } ]
"#,
    )
    .unwrap();
    let probes = [Tcp(53), Udp(53), Tcp(80), Icmp];
    lab.check("Cilium CIDR rules", &probes, |f| {
        // fromCIDR of the pod CIDRs holds every pod's address and selects none of them; the
        // CIDR set selects ext-a in IPv4 and ext-b in IPv6, whose CIDR identities are still
        // the world's.
        let outside = if f.v6() { "ext-b" } else { "ext-a" };
        let dns_in = !f.to.is("ops/dns") || f.from.is(outside) || f.from.is_node();
        let web_out = !f.from.is("shop/web") || f.to.is_external();
        // A port without a protocol is TCP and UDP (and SCTP), to every peer.
        let tool_out = !f.from.is("dev/tool") || matches!(f.probe, Tcp(53) | Udp(53));
        // Deny rules without default deny: everything but the world.
        let db_in = !f.to.is("shop/db") || !f.from.is_external();
        dns_in && web_out && tool_out && db_in
    });
}

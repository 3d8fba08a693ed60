//! The repository's truth table: pods in several namespaces with labels and named ports,
//! external CIDRs, the world and the node; policies for every feature; and for each
//! (subject endpoint, direction, peer, protocol, port) the expected verdict.
//!
//! Each verdict is computed along the full chain except packets: the repository resolves
//! the endpoint's policy, `cellium_policy::compile` turns it into policy map entries, and
//! `cellium_policy::decide` answers as the datapath's two LPM lookups do (longest match per
//! identity, a deny from either lookup wins), with the enforcement flags of the resolved
//! policy (`integration/tests/policy_model.rs` checks that decision against the real
//! programs).
//! Peers are resolved to identities as the datapath does too: a local pod by its endpoint
//! identity, an address by longest-prefix match in the ipcache (the CIDR entries the
//! repository wrote), falling back to `world`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use cellium_identity::Identities;
use cellium_ipcache::{Ipcache, Source};
use cellium_labels::Labels;
use cellium_policy::{Direction, Protocol, compile, decide};
use cellium_policy_repo::{PolicyRepository, Subject};
use cellium_resources::{NamedPort, ObjectKey, Resources};
use ipnet::IpNet;

use Direction::{Egress, Ingress};

/// Namespaces and pods shared by every scenario; pod addresses are given by [`POD_IPS`].
const BASE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: { name: shop, labels: { team: a } }
---
apiVersion: v1
kind: Namespace
metadata: { name: dev, labels: { team: b } }
---
apiVersion: v1
kind: Namespace
metadata: { name: ops, labels: { team: a, tier: infra } }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: shop, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 8080 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: db, namespace: shop, labels: { app: db } }
spec: { containers: [ { name: c, ports: [ { name: sql, containerPort: 5432 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: cache, namespace: shop, labels: { app: cache } }
spec: { containers: [ { name: c, ports: [ { name: redis, containerPort: 6379 }, { name: stats, containerPort: 9100, protocol: UDP } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: dev, labels: { app: web } }
spec: { containers: [ { name: c, ports: [ { name: http, containerPort: 80 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: tool, namespace: dev, labels: { app: tool } }
spec: { containers: [ { name: c } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: dns, namespace: ops, labels: { app: dns } }
spec: { containers: [ { name: c, ports: [ { name: dns, containerPort: 53, protocol: UDP }, { name: dns-tcp, containerPort: 53 } ] } ] }
"#;

const POD_IPS: [(&str, &str); 6] = [
    ("shop/web", "10.244.0.10"),
    ("shop/db", "10.244.0.11"),
    ("shop/cache", "10.244.0.12"),
    ("dev/web", "10.244.1.10"),
    ("dev/tool", "10.244.1.20"),
    ("ops/dns", "10.244.2.10"),
];

/// A peer of a case.
#[derive(Debug, Clone, Copy)]
enum Peer {
    /// A pod of [`BASE`], by `namespace/name`.
    Pod(&'static str),
    /// An address outside the cluster.
    Ip(&'static str),
    /// The node itself.
    Host,
}

use Peer::{Host, Ip, Pod};

const TCP: Protocol = Protocol::Tcp;
const UDP: Protocol = Protocol::Udp;
const SCTP: Protocol = Protocol::Sctp;
const ICMP: Protocol = Protocol::Icmp;

/// (subject pod, direction, peer, protocol, port, allowed)
type Case = (&'static str, Direction, Peer, Protocol, u16, bool);

struct World {
    resources: Arc<Resources>,
    ids: Arc<Identities>,
    ipcache: Arc<Ipcache>,
    repo: PolicyRepository,
    pods: BTreeMap<&'static str, (u32, Labels, Vec<NamedPort>)>,
}

impl World {
    fn new(policies: &str) -> World {
        let resources = Resources::new();
        resources.apply("base.yaml", BASE).unwrap();
        if !policies.trim().is_empty() {
            resources.apply("policies.yaml", policies).unwrap();
        }
        let ids = Identities::in_memory();
        let ipcache = Ipcache::in_memory();
        let repo = PolicyRepository::with_parts(ids.clone(), Some(ipcache.clone()), None);
        repo.sync_resources(&resources);
        let mut world = World {
            resources,
            ids,
            ipcache,
            repo,
            pods: BTreeMap::new(),
        };
        world.identify_pods();
        world
    }

    /// Gives each pod the identity the endpoint manager would: its pod labels plus the
    /// `cidr:` labels of the ipBlocks covering its address; and its ipcache entry, which
    /// carries its named ports as the endpoint manager's does.
    fn identify_pods(&mut self) {
        for (name, ip) in POD_IPS {
            let (ns, pod_name) = name.split_once('/').unwrap();
            let pod = self
                .resources
                .pods
                .get(&ObjectKey::namespaced(ns, pod_name))
                .unwrap();
            let ns_labels = self
                .resources
                .namespaces
                .get(&ObjectKey::cluster(ns))
                .unwrap()
                .labels
                .clone();
            let mut labels = Labels::for_pod(ns, &pod.labels, &ns_labels);
            let ip: IpAddr = ip.parse().unwrap();
            labels.extend(self.repo.cidr_labels_for(ip));
            let identity = self.ids.allocate(&labels).unwrap();
            self.ipcache
                .upsert(IpNet::from(ip), identity.id, Source::Endpoint)
                .unwrap();
            self.ipcache
                .set_named_ports(IpNet::from(ip), Source::Endpoint, &pod.ports);
            self.pods
                .insert(name, (identity.id, labels, pod.ports.clone()));
        }
        let (snapshot, _) = self.ids.snapshot_and_subscribe();
        self.repo.sync_identities(&snapshot);
        self.repo.sync_named_ports();
    }

    fn peer_identity(&self, peer: Peer) -> u32 {
        match peer {
            Pod(name) => self.pods[name].0,
            Host => 1,
            Ip(ip) => self
                .ipcache
                .lookup(ip.parse().unwrap())
                .map_or(2, |(_, id, _)| id),
        }
    }

    /// Whether a new connection is allowed, along the full chain but packets.
    fn allowed(
        &self,
        subject: &str,
        dir: Direction,
        peer: Peer,
        proto: Protocol,
        port: u16,
    ) -> bool {
        let (identity, labels, ports) = &self.pods[subject];
        let policy = self.repo.resolve(&Subject {
            identity: *identity,
            labels,
            named_ports: ports,
        });
        let enforced = match dir {
            Ingress => policy.ingress_enforced,
            Egress => policy.egress_enforced,
        };
        let entries = compile(7, &policy.rules).unwrap();
        decide(&entries, dir, self.peer_identity(peer), proto, port).passes(enforced)
    }

    fn check(&self, scenario: &str, cases: &[Case]) {
        let mut failures = Vec::new();
        for &(subject, dir, peer, proto, port, want) in cases {
            let got = self.allowed(subject, dir, peer, proto, port);
            if got != want {
                failures.push(format!(
                    "{scenario}: {subject} {dir} {peer:?} {proto}/{port}: expected {}, got {}",
                    verdict(want),
                    verdict(got)
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases wrong:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "denied" }
}

#[test]
fn no_policy_allows_everything() {
    let w = World::new("");
    w.check(
        "no policy",
        &[
            ("shop/db", Ingress, Pod("dev/tool"), TCP, 5432, true),
            ("shop/db", Egress, Ip("8.8.8.8"), UDP, 53, true),
            ("dev/web", Ingress, Ip("8.8.8.8"), ICMP, 0, true),
        ],
    );
}

#[test]
fn network_policy_default_deny_and_pod_peers() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: default-deny, namespace: shop }
spec: { podSelector: {} }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db-from-web, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress:
  - from: [ { podSelector: { matchLabels: { app: web } } } ]
    ports: [ { port: 5432 } ]
"#,
    );
    w.check(
        "default deny + pod peers",
        &[
            // Default deny at ingress for every pod of shop, egress untouched.
            ("shop/web", Ingress, Pod("dev/web"), TCP, 8080, false),
            ("shop/web", Ingress, Pod("shop/db"), TCP, 8080, false),
            ("shop/web", Ingress, Ip("8.8.8.8"), TCP, 8080, false),
            ("shop/web", Egress, Pod("dev/web"), TCP, 80, true),
            ("shop/web", Egress, Ip("8.8.8.8"), UDP, 53, true),
            // The node always reaches its pods (allow-localhost).
            ("shop/web", Ingress, Host, TCP, 8080, true),
            ("shop/db", Ingress, Host, ICMP, 0, true),
            // db from web of the same namespace, on 5432/TCP only.
            ("shop/db", Ingress, Pod("shop/web"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("shop/web"), TCP, 5433, false),
            ("shop/db", Ingress, Pod("shop/web"), UDP, 5432, false),
            ("shop/db", Ingress, Pod("shop/web"), ICMP, 0, false),
            ("shop/db", Ingress, Pod("dev/web"), TCP, 5432, false),
            ("shop/db", Ingress, Pod("shop/cache"), TCP, 5432, false),
            // Other namespaces are not selected.
            ("dev/web", Ingress, Pod("shop/cache"), TCP, 80, true),
            ("dev/tool", Ingress, Ip("8.8.8.8"), TCP, 22, true),
        ],
    );
}

#[test]
fn network_policy_namespace_selectors_and_both_in_one_peer() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: from-team-a, namespace: dev }
spec:
  podSelector: { matchLabels: { app: tool } }
  ingress: [ { from: [ { namespaceSelector: { matchLabels: { team: a } } } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-of-infra-only, namespace: dev }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress:
  - from: [ { namespaceSelector: { matchLabels: { tier: infra } }, podSelector: { matchLabels: { app: dns } } } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: either, namespace: shop }
spec:
  podSelector: { matchLabels: { app: cache } }
  ingress:
  - from: [ { namespaceSelector: { matchLabels: { tier: infra } } }, { podSelector: { matchLabels: { app: web } } } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: all-namespaces, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { namespaceSelector: {} } ] } ]
"#,
    );
    w.check(
        "namespace selectors",
        &[
            ("dev/tool", Ingress, Pod("shop/web"), TCP, 1, true),
            ("dev/tool", Ingress, Pod("ops/dns"), UDP, 9, true),
            ("dev/tool", Ingress, Pod("dev/web"), TCP, 1, false),
            ("dev/tool", Ingress, Ip("8.8.8.8"), TCP, 1, false),
            // Both selectors in one peer: pods matching both.
            ("dev/web", Ingress, Pod("ops/dns"), TCP, 80, true),
            ("dev/web", Ingress, Pod("shop/web"), TCP, 80, false),
            ("dev/web", Ingress, Pod("dev/tool"), TCP, 80, false),
            // Two peers: either.
            ("shop/cache", Ingress, Pod("ops/dns"), TCP, 6379, true),
            ("shop/cache", Ingress, Pod("shop/web"), TCP, 6379, true),
            ("shop/cache", Ingress, Pod("dev/web"), TCP, 6379, false),
            ("shop/cache", Ingress, Pod("shop/db"), TCP, 6379, false),
            // An empty namespaceSelector: every pod of every namespace, not the world.
            ("shop/db", Ingress, Pod("dev/tool"), SCTP, 5432, true),
            ("shop/db", Ingress, Pod("ops/dns"), TCP, 5432, true),
            ("shop/db", Ingress, Ip("8.8.8.8"), TCP, 5432, false),
        ],
    );
}

#[test]
fn network_policy_ip_blocks_cover_external_addresses_and_pods() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: egress-blocks, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [ Egress ]
  egress:
  - to: [ { ipBlock: { cidr: 192.0.2.0/24 } } ]
  - to: [ { ipBlock: { cidr: 198.51.100.0/24, except: [ 198.51.100.128/25 ] } } ]
    ports: [ { port: 443 } ]
  - to: [ { ipBlock: { cidr: 10.244.1.0/24, except: [ 10.244.1.20/32 ] } } ]
"#,
    );
    w.check(
        "ipBlock",
        &[
            ("shop/web", Egress, Ip("192.0.2.7"), TCP, 80, true),
            ("shop/web", Egress, Ip("192.0.2.7"), ICMP, 0, true),
            ("shop/web", Egress, Ip("198.51.100.5"), TCP, 443, true),
            ("shop/web", Egress, Ip("198.51.100.5"), TCP, 80, false),
            ("shop/web", Egress, Ip("198.51.100.200"), TCP, 443, false),
            ("shop/web", Egress, Ip("8.8.8.8"), UDP, 53, false),
            // Pods inside the block are peers too (upstream e2e semantics) ...
            ("shop/web", Egress, Pod("dev/web"), TCP, 80, true),
            // ... but not those of an exception, nor those outside.
            ("shop/web", Egress, Pod("dev/tool"), TCP, 80, false),
            ("shop/web", Egress, Pod("shop/db"), TCP, 5432, false),
            // Only egress was restricted.
            ("shop/web", Ingress, Ip("8.8.8.8"), TCP, 8080, true),
        ],
    );
}

#[test]
fn network_policy_empty_and_absent_lists() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all-in, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ {} ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: empty-ports, namespace: shop }
spec:
  podSelector: { matchLabels: { app: cache } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ], ports: [] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: no-egress, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  policyTypes: [ Ingress, Egress ]
  ingress: [ { from: [], ports: [ { port: 5432 } ] } ]
"#,
    );
    w.check(
        "empty and absent",
        &[
            ("shop/web", Ingress, Ip("8.8.8.8"), TCP, 1234, true),
            ("shop/web", Ingress, Pod("dev/tool"), ICMP, 0, true),
            ("shop/web", Egress, Ip("8.8.8.8"), TCP, 1234, true),
            ("shop/cache", Ingress, Pod("shop/web"), UDP, 9100, true),
            ("shop/cache", Ingress, Pod("shop/web"), ICMP, 0, true),
            ("shop/cache", Ingress, Pod("dev/web"), TCP, 6379, false),
            // An empty `from` with ports: every peer, those ports.
            ("shop/db", Ingress, Ip("8.8.8.8"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("dev/tool"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("dev/tool"), TCP, 22, false),
            // Egress in policyTypes without an egress list: nothing leaves.
            ("shop/db", Egress, Pod("ops/dns"), UDP, 53, false),
            ("shop/db", Egress, Host, TCP, 10250, false),
            ("shop/db", Egress, Ip("8.8.8.8"), ICMP, 0, false),
        ],
    );
}

#[test]
fn network_policy_named_ports_ranges_and_protocols() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: http-by-name, namespace: shop }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { ports: [ { port: http } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: http-by-name, namespace: dev }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [ { ports: [ { port: http }, { port: 9000, endPort: 9010, protocol: SCTP } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: egress-by-name, namespace: shop }
spec:
  podSelector: { matchLabels: { app: cache } }
  policyTypes: [ Egress ]
  egress:
  - to: [ { namespaceSelector: {} } ]
    ports: [ { port: http }, { port: dns, protocol: UDP }, { port: 8000, endPort: 8100 } ]
"#,
    );
    w.check(
        "named ports",
        &[
            // Ingress names are the selected pod's own ports: 8080 in shop, 80 in dev.
            ("shop/web", Ingress, Pod("dev/tool"), TCP, 8080, true),
            ("shop/web", Ingress, Pod("dev/tool"), TCP, 80, false),
            ("shop/web", Ingress, Pod("dev/tool"), UDP, 8080, false),
            ("dev/web", Ingress, Pod("shop/cache"), TCP, 80, true),
            ("dev/web", Ingress, Pod("shop/cache"), TCP, 8080, false),
            ("dev/web", Ingress, Pod("shop/cache"), SCTP, 9000, true),
            ("dev/web", Ingress, Pod("shop/cache"), SCTP, 9010, true),
            ("dev/web", Ingress, Pod("shop/cache"), SCTP, 9011, false),
            ("dev/web", Ingress, Pod("shop/cache"), TCP, 9005, false),
            // Egress names are the peer's ports.
            ("shop/cache", Egress, Pod("dev/web"), TCP, 80, true),
            ("shop/cache", Egress, Pod("dev/web"), TCP, 81, false),
            // 8080 is not dev/web's http port, but inside the range below.
            ("shop/cache", Egress, Pod("dev/web"), TCP, 8080, true),
            ("shop/cache", Egress, Pod("shop/web"), TCP, 8080, true),
            ("shop/cache", Egress, Pod("shop/web"), TCP, 80, false),
            ("shop/cache", Egress, Pod("ops/dns"), UDP, 53, true),
            ("shop/cache", Egress, Pod("ops/dns"), TCP, 53, false),
            ("shop/cache", Egress, Pod("shop/db"), TCP, 5432, false),
            // A numeric range applies to every peer of the rule.
            ("shop/cache", Egress, Pod("shop/db"), TCP, 8000, true),
            ("shop/cache", Egress, Pod("shop/db"), TCP, 8100, true),
            ("shop/cache", Egress, Pod("shop/db"), TCP, 8101, false),
            ("shop/cache", Egress, Pod("shop/db"), UDP, 8050, false),
            ("shop/cache", Egress, Ip("8.8.8.8"), TCP, 8050, false),
        ],
    );
}

#[test]
fn egress_named_ports_to_every_peer_are_each_destination_pods_own() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: http-anywhere, namespace: shop }
spec:
  podSelector: { matchLabels: { app: cache } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: http } ] } ]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: nobody-has-it, namespace: dev }
spec:
  podSelector: { matchLabels: { app: tool } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: nosuch } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: dns-anywhere, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  egress: [ { toPorts: [ { ports: [ { port: dns } ] } ] } ]
"#,
    );
    w.check(
        "egress named ports, every peer",
        &[
            // `http` is 8080 on shop/web and 80 on dev/web: each destination's own number.
            ("shop/cache", Egress, Pod("shop/web"), TCP, 8080, true),
            ("shop/cache", Egress, Pod("shop/web"), TCP, 80, false),
            ("shop/cache", Egress, Pod("dev/web"), TCP, 80, true),
            ("shop/cache", Egress, Pod("dev/web"), TCP, 8080, false),
            ("shop/cache", Egress, Pod("dev/web"), UDP, 80, false),
            // Pods without an `http` port, the node and the world get nothing.
            ("shop/cache", Egress, Pod("shop/db"), TCP, 8080, false),
            ("shop/cache", Egress, Pod("shop/db"), TCP, 80, false),
            ("shop/cache", Egress, Host, TCP, 8080, false),
            ("shop/cache", Egress, Ip("8.8.8.8"), TCP, 80, false),
            ("shop/cache", Egress, Ip("8.8.8.8"), TCP, 8080, false),
            // A name no pod has allows nothing at all.
            ("dev/tool", Egress, Pod("shop/web"), TCP, 8080, false),
            ("dev/tool", Egress, Pod("dev/web"), TCP, 80, false),
            ("dev/tool", Egress, Ip("8.8.8.8"), TCP, 80, false),
            // Cilium's `toPorts` without a peer: `dns` is 53/UDP on ops/dns (53/TCP is
            // `dns-tcp`), and a port without protocol takes the named port's own.
            ("shop/db", Egress, Pod("ops/dns"), UDP, 53, true),
            ("shop/db", Egress, Pod("ops/dns"), TCP, 53, false),
            ("shop/db", Egress, Pod("shop/web"), UDP, 53, false),
            ("shop/db", Egress, Ip("8.8.8.8"), UDP, 53, false),
            // Ingress is untouched by egress rules.
            ("shop/cache", Ingress, Pod("dev/tool"), TCP, 5432, true),
        ],
    );
}

#[test]
fn egress_named_ports_follow_the_pods_ports_and_who_has_an_identity() {
    let mut w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: http-anywhere, namespace: shop }
spec:
  podSelector: { matchLabels: { app: cache } }
  policyTypes: [ Egress ]
  egress: [ { ports: [ { port: http } ] } ]
"#,
    );
    let web = IpNet::from("10.244.0.10".parse::<IpAddr>().unwrap());
    let http = |port| NamedPort {
        name: "http".into(),
        port,
        protocol: cellium_resources::Protocol::Tcp,
    };
    w.check(
        "before",
        &[("shop/cache", Egress, Pod("shop/web"), TCP, 8080, true)],
    );

    // The pod's `http` becomes 9090: a new revision, and the new number only.
    let rev = w.repo.revision();
    assert!(
        w.ipcache
            .set_named_ports(web, Source::Endpoint, &[http(9090)])
    );
    w.repo.sync_named_ports();
    assert!(w.repo.revision() > rev);
    w.check(
        "the pod's port changed",
        &[
            ("shop/cache", Egress, Pod("shop/web"), TCP, 9090, true),
            ("shop/cache", Egress, Pod("shop/web"), TCP, 8080, false),
        ],
    );

    // A second pod with shop/web's identity names `http` 8080: the identity's pods have
    // both numbers, and both are allowed to either (identities are the datapath's unit).
    let twin = IpNet::from("10.244.0.13".parse::<IpAddr>().unwrap());
    let web_id = w.pods["shop/web"].0;
    w.ipcache.upsert(twin, web_id, Source::Endpoint).unwrap();
    w.ipcache
        .set_named_ports(twin, Source::Endpoint, &[http(8080)]);
    w.repo.sync_named_ports();
    w.check(
        "two pods of one identity",
        &[
            ("shop/cache", Egress, Pod("shop/web"), TCP, 9090, true),
            ("shop/cache", Egress, Pod("shop/web"), TCP, 8080, true),
        ],
    );

    // shop/web takes another identity (relabelled): its ports go with it, the old identity
    // keeps its other pod's.
    let moved = w
        .ids
        .allocate(&Labels::for_pod(
            "shop",
            &[("app".to_string(), "web2".to_string())].into(),
            &[("team".to_string(), "a".to_string())].into(),
        ))
        .unwrap();
    w.repo.identity_added(&moved);
    w.ipcache.upsert(web, moved.id, Source::Endpoint).unwrap();
    w.repo.sync_named_ports();
    let entry = w.pods.get_mut("shop/web").unwrap();
    entry.0 = moved.id;
    w.check(
        "relabelled",
        &[
            ("shop/cache", Egress, Pod("shop/web"), TCP, 9090, true),
            ("shop/cache", Egress, Pod("shop/web"), TCP, 8080, false),
        ],
    );
    assert!(allowed_to(&w, web_id, 8080) && !allowed_to(&w, web_id, 9090));

    // The pod goes (its ipcache claim deleted): nothing is allowed to its old identity.
    w.ipcache.delete(web, Source::Endpoint).unwrap();
    w.repo.sync_named_ports();
    assert!(!allowed_to(&w, moved.id, 9090));

    // Without a rule naming a port, the ports of peers change no revision.
    let w = World::new("");
    let rev = w.repo.revision();
    w.ipcache.set_named_ports(web, Source::Endpoint, &[http(1)]);
    w.repo.sync_named_ports();
    assert_eq!(w.repo.revision(), rev);
}

/// Whether shop/cache may open a TCP connection to `identity` on `port`.
fn allowed_to(w: &World, identity: u32, port: u16) -> bool {
    let (id, labels, ports) = &w.pods["shop/cache"];
    let policy = w.repo.resolve(&Subject {
        identity: *id,
        labels,
        named_ports: ports,
    });
    let entries = compile(7, &policy.rules).unwrap();
    decide(&entries, Egress, identity, TCP, port).passes(policy.egress_enforced)
}

#[test]
fn cilium_endpoint_peers_are_namespaced_and_ports_any_protocol() {
    let w = World::new(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  ingress:
  - fromEndpoints: [ { matchLabels: { app: web } } ]
    toPorts: [ { ports: [ { port: "5432" } ] } ]
  - fromEndpoints: [ { matchLabels: { "k8s:io.kubernetes.pod.namespace": dev, app: tool } } ]
  - fromEndpoints: [ { matchLabels: { "io.cilium.k8s.namespace.labels.tier": infra } } ]
    toPorts: [ { ports: [ { port: "9000", endPort: 9001, protocol: UDP } ] } ]
"#,
    );
    w.check(
        "CNP endpoints",
        &[
            ("shop/db", Ingress, Pod("shop/web"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("shop/web"), UDP, 5432, true),
            ("shop/db", Ingress, Pod("shop/web"), SCTP, 5432, true),
            ("shop/db", Ingress, Pod("shop/web"), ICMP, 0, false),
            ("shop/db", Ingress, Pod("shop/web"), TCP, 5433, false),
            // fromEndpoints of a namespaced policy stay in its namespace ...
            ("shop/db", Ingress, Pod("dev/web"), TCP, 5432, false),
            // ... unless the selector names the namespace, or namespace labels.
            ("shop/db", Ingress, Pod("dev/tool"), TCP, 1, true),
            ("shop/db", Ingress, Pod("dev/tool"), ICMP, 0, true),
            ("shop/db", Ingress, Pod("ops/dns"), UDP, 9001, true),
            ("shop/db", Ingress, Pod("ops/dns"), UDP, 9002, false),
            ("shop/db", Ingress, Pod("ops/dns"), TCP, 9000, false),
            ("shop/db", Ingress, Host, TCP, 5432, true),
            ("shop/db", Egress, Ip("8.8.8.8"), TCP, 443, true),
            ("shop/web", Ingress, Pod("dev/web"), TCP, 8080, true),
        ],
    );
}

#[test]
fn cilium_cidrs_select_external_addresses_only_and_entities() {
    let w = World::new(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: web-out, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: web } }
  egress:
  - toCIDRSet: [ { cidr: 203.0.113.0/24, except: [ 203.0.113.128/25 ] } ]
  - toCIDR: [ 10.244.1.0/24 ]
  - toEntities: [ host ]
    toPorts: [ { ports: [ { port: "10250", protocol: TCP } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db-in, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  ingress:
  - fromEntities: [ cluster ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: cache-out, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: cache } }
  egress:
  - toEntities: [ world ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: tool-all, namespace: dev }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  ingress:
  - fromEntities: [ all ]
    toPorts: [ { ports: [ { port: "22", protocol: TCP } ] } ]
"#,
    );
    w.check(
        "CNP CIDR and entities",
        &[
            ("shop/web", Egress, Ip("203.0.113.9"), TCP, 443, true),
            ("shop/web", Egress, Ip("203.0.113.200"), TCP, 443, false),
            ("shop/web", Egress, Ip("8.8.8.8"), TCP, 443, false),
            // A Cilium CIDR rule never selects pods, even inside the prefix.
            ("shop/web", Egress, Pod("dev/web"), TCP, 80, false),
            ("shop/web", Egress, Pod("dev/tool"), TCP, 80, false),
            ("shop/web", Egress, Host, TCP, 10250, true),
            ("shop/web", Egress, Host, TCP, 22, false),
            // cluster: pods and the node, not the world.
            ("shop/db", Ingress, Pod("dev/web"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("ops/dns"), UDP, 5432, true),
            ("shop/db", Ingress, Ip("8.8.8.8"), TCP, 5432, false),
            ("shop/db", Ingress, Ip("203.0.113.9"), TCP, 5432, false),
            // world: every external address, CIDR identities included, no pod.
            ("shop/cache", Egress, Ip("8.8.8.8"), UDP, 53, true),
            ("shop/cache", Egress, Ip("203.0.113.9"), TCP, 443, true),
            ("shop/cache", Egress, Pod("shop/db"), TCP, 5432, false),
            ("shop/cache", Egress, Host, TCP, 10250, false),
            // all: every peer.
            ("dev/tool", Ingress, Ip("8.8.8.8"), TCP, 22, true),
            ("dev/tool", Ingress, Pod("shop/web"), TCP, 22, true),
            ("dev/tool", Ingress, Pod("shop/web"), TCP, 23, false),
        ],
    );
}

#[test]
fn cilium_deny_rules_win_and_clusterwide_policies() {
    let w = World::new(
        r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  ingress: [ { fromEntities: [ all ] } ]
  ingressDeny:
  - fromEndpoints: [ { matchLabels: { app: cache } } ]
  - toPorts: [ { ports: [ { port: "23" } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: no-smtp }
spec:
  endpointSelector: {}
  egressDeny: [ { toPorts: [ { ports: [ { port: "25", protocol: TCP } ] } ] } ]
  enableDefaultDeny: { egress: false }
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: { name: tool-from-pods }
spec:
  endpointSelector: { matchLabels: { app: tool } }
  ingress: [ { fromEndpoints: [ {} ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: lockdown, namespace: ops }
spec:
  endpointSelector: {}
  ingress: [ {} ]
  egress: [ {} ]
"#,
    );
    w.check(
        "deny and clusterwide",
        &[
            ("shop/db", Ingress, Pod("shop/web"), TCP, 5432, true),
            ("shop/db", Ingress, Ip("8.8.8.8"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("shop/cache"), TCP, 5432, false),
            ("shop/db", Ingress, Pod("shop/cache"), ICMP, 0, false),
            ("shop/db", Ingress, Pod("shop/web"), TCP, 23, false),
            ("shop/db", Ingress, Pod("shop/web"), UDP, 23, false),
            ("shop/db", Ingress, Pod("shop/web"), TCP, 22, true),
            // Deny without default deny: everything else still leaves.
            ("shop/web", Egress, Ip("8.8.8.8"), TCP, 25, false),
            ("shop/web", Egress, Ip("8.8.8.8"), TCP, 587, true),
            ("dev/tool", Egress, Pod("shop/db"), TCP, 25, false),
            ("dev/tool", Egress, Pod("shop/db"), UDP, 25, true),
            // A cluster-wide `fromEndpoints: [{}]`: pods of every namespace, not the world.
            ("dev/tool", Ingress, Pod("shop/web"), TCP, 80, true),
            ("dev/tool", Ingress, Pod("ops/dns"), TCP, 80, true),
            ("dev/tool", Ingress, Ip("8.8.8.8"), TCP, 80, false),
            // Empty rules: default deny both ways, nothing allowed but the node's access.
            ("ops/dns", Ingress, Pod("shop/web"), UDP, 53, false),
            ("ops/dns", Ingress, Host, UDP, 53, true),
            ("ops/dns", Egress, Ip("8.8.8.8"), UDP, 53, false),
            ("ops/dns", Egress, Ip("8.8.8.8"), TCP, 25, false),
        ],
    );
}

#[test]
fn network_policy_and_cilium_policy_combine() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { podSelector: { matchLabels: { app: web } } } ] } ]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: { name: db-extra, namespace: shop }
spec:
  endpointSelector: { matchLabels: { app: db } }
  ingress: [ { fromEndpoints: [ { matchLabels: { app: cache } } ], toPorts: [ { ports: [ { port: "5432", protocol: TCP } ] } ] } ]
  ingressDeny: [ { fromEndpoints: [ { matchLabels: { app: web } } ], toPorts: [ { ports: [ { port: "22", protocol: TCP } ] } ] } ]
"#,
    );
    w.check(
        "combined",
        &[
            ("shop/db", Ingress, Pod("shop/web"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("shop/web"), TCP, 22, false),
            ("shop/db", Ingress, Pod("shop/web"), UDP, 22, true),
            ("shop/db", Ingress, Pod("shop/cache"), TCP, 5432, true),
            ("shop/db", Ingress, Pod("shop/cache"), TCP, 6379, false),
            ("shop/db", Ingress, Pod("dev/tool"), TCP, 5432, false),
        ],
    );
}

#[test]
fn changes_bump_the_revision_and_update_selectors_incrementally() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db, namespace: shop }
spec:
  podSelector: { matchLabels: { app: db } }
  ingress: [ { from: [ { namespaceSelector: { matchLabels: { team: b } } } ] } ]
"#,
    );
    let before = w.repo.revision();
    let db = &w.pods["shop/db"];
    let subject = Subject {
        identity: db.0,
        labels: &db.1,
        named_ports: &db.2,
    };
    let first = w.repo.resolve(&subject);
    assert!(
        Arc::ptr_eq(&first, &w.repo.resolve(&subject)),
        "resolved once per revision"
    );
    assert_eq!(first.revision, before);

    // A new pod identity in a matching namespace joins the selector's set.
    let labels = Labels::for_pod(
        "dev",
        &[("app".to_string(), "new".to_string())].into(),
        &[("team".to_string(), "b".to_string())].into(),
    );
    let id = w.ids.allocate(&labels).unwrap();
    w.repo.identity_added(&id);
    assert!(w.repo.revision() > before);
    let second = w.repo.resolve(&subject);
    assert!(second.rules.iter().any(|r| r.identity == id.id));
    // An identity no selector matches changes nothing.
    let rev = w.repo.revision();
    let other = w
        .ids
        .allocate(&Labels::for_pod(
            "ops",
            &Default::default(),
            &Default::default(),
        ))
        .unwrap();
    w.repo.identity_added(&other);
    assert_eq!(w.repo.revision(), rev);

    // Deleting the policy lifts the enforcement.
    w.resources
        .delete(
            "d.yaml",
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db, namespace: shop}\n",
        )
        .unwrap();
    w.repo.sync_resources(&w.resources);
    assert!(w.repo.revision() > rev);
    assert!(!w.repo.resolve(&subject).ingress_enforced);
}

#[test]
fn a_policy_whose_subjects_change_namespace_is_found_for_the_endpoints_it_selects_now() {
    // Resolution visits only the rule sets of the endpoint's namespace and the unscoped ones:
    // an update that moves a policy's subjects between the two must move it in that index.
    let ccnp = |selector: &str| {
        format!(
            "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {{ name: lock }}\nspec:\n  endpointSelector: {selector}\n  ingress: [ {{ fromEntities: [ host ] }} ]\n"
        )
    };
    let w = World::new(&ccnp(
        "{ matchLabels: { k8s:io.kubernetes.pod.namespace: shop } }",
    ));
    let enforced = |w: &World, pod: &str| {
        let (identity, labels, ports) = &w.pods[pod];
        w.repo
            .resolve(&Subject {
                identity: *identity,
                labels,
                named_ports: ports,
            })
            .ingress_enforced
    };
    assert!(enforced(&w, "shop/web") && !enforced(&w, "dev/web"));
    for (selector, shop, dev) in [
        ("{}", true, true),
        (
            "{ matchLabels: { k8s:io.kubernetes.pod.namespace: dev } }",
            false,
            true,
        ),
        ("{ matchLabels: { app: web } }", true, true),
    ] {
        w.resources.apply("p.yaml", &ccnp(selector)).unwrap();
        w.repo.sync_resources(&w.resources);
        assert_eq!(
            (enforced(&w, "shop/web"), enforced(&w, "dev/web")),
            (shop, dev),
            "{selector}"
        );
    }
    assert!(!enforced(&w, "dev/tool"));
}

#[test]
fn ip_block_changes_are_announced_and_cidr_entries_follow_the_rules() {
    let w = World::new("");
    let changes = w.repo.cidr_label_changes();
    assert!(
        w.repo
            .cidr_labels_for("10.244.1.10".parse().unwrap())
            .is_empty()
    );
    w.resources
        .apply(
            "p.yaml",
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b, namespace: dev}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.244.0.0/16, except: [10.244.1.0/24]}}]}]}\n",
        )
        .unwrap();
    w.repo.sync_resources(&w.resources);
    assert!(changes.has_changed().unwrap());
    let labels: Vec<String> = w
        .repo
        .cidr_labels_for("10.244.1.10".parse().unwrap())
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(labels, vec!["cidr:10.244.0.0/16", "cidr:10.244.1.0/24"]);
    let cidrs = w.repo.cidr_identities();
    assert_eq!(cidrs.len(), 2);
    let (_, id, source) = w.ipcache.lookup("10.244.9.9".parse().unwrap()).unwrap();
    assert_eq!((id, source), (cidrs[0].1, Source::Policy));
    w.resources
        .delete("p.yaml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b, namespace: dev}\n")
        .unwrap();
    w.repo.sync_resources(&w.resources);
    assert!(w.ipcache.lookup("10.244.9.9".parse().unwrap()).is_none());
    assert!(w.repo.cidr_identities().is_empty());
    assert!(
        w.ids.get(cidrs[0].1).is_none(),
        "the CIDR identity is released"
    );
}

#[test]
fn a_thousand_endpoints_on_a_few_hundred_identities_resolve_from_the_cache() {
    let w = World::new(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: ns-peers, namespace: shop }
spec:
  podSelector: {}
  ingress: [ { from: [ { namespaceSelector: {} } ], ports: [ { port: 80 }, { port: 443 } ] } ]
"#,
    );
    let ns_labels = w
        .resources
        .namespaces
        .get(&ObjectKey::cluster("shop"))
        .unwrap()
        .labels
        .clone();
    let mut subjects = Vec::new();
    for i in 0..300 {
        let labels = Labels::for_pod(
            "shop",
            &[("app".to_string(), format!("app-{i}"))].into(),
            &ns_labels,
        );
        let id = w.ids.allocate(&labels).unwrap();
        w.repo.identity_added(&id);
        subjects.push((id.id, labels));
    }
    let start = std::time::Instant::now();
    let mut computed = std::collections::HashSet::new();
    for i in 0..1000 {
        let (id, labels) = &subjects[i % subjects.len()];
        let p = w.repo.resolve(&Subject {
            identity: *id,
            labels,
            named_ports: &[],
        });
        // Every endpoint may receive from the 306 pod identities on two ports, plus the node.
        assert_eq!(p.rules.len(), 306 * 2 + 1);
        computed.insert(Arc::as_ptr(&p) as usize);
    }
    assert_eq!(computed.len(), 300, "one computation per identity");
    eprintln!("1000 resolves over 300 identities: {:?}", start.elapsed());
}

#[test]
fn a_sync_takes_every_policy_in_one_change_and_a_second_one_changes_nothing() {
    let np = |name: &str, cidr: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, namespace: dev}}\nspec: {{podSelector: {{}}, ingress: [{{from: [{{ipBlock: {{cidr: {cidr}}}}}]}}]}}\n"
        )
    };
    let w = World::new("");
    let start = w.repo.revision();
    let text = [
        np("a", "192.0.2.0/24"),
        np("b", "198.51.100.0/24"),
        np("c", "203.0.113.0/24"),
    ]
    .join("---\n");
    w.resources.apply("p.yaml", &text).unwrap();
    w.repo.sync_resources(&w.resources);
    // One revision for the batch, with every prefix's CIDR identity already in it.
    assert_eq!(w.repo.revision(), start + 1);
    assert_eq!(w.repo.cidr_identities().len(), 3);
    w.repo.sync_resources(&w.resources);
    assert_eq!(w.repo.revision(), start + 1, "nothing changed");
    // A policy gone from the tables goes in the same batch as one that changed.
    w.resources
        .delete("p.yaml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a, namespace: dev}\n")
        .unwrap();
    w.resources
        .apply("p.yaml", &np("b", "198.51.100.0/25"))
        .unwrap();
    w.repo.sync_resources(&w.resources);
    assert_eq!(w.repo.revision(), start + 2);
    let prefixes: Vec<String> = w
        .repo
        .cidr_identities()
        .iter()
        .map(|(net, _)| net.to_string())
        .collect();
    assert_eq!(prefixes, ["198.51.100.0/25", "203.0.113.0/24"]);
}

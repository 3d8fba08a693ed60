//! Identity-relevant labels follow policies: a pod label key the label filter drops
//! (`statefulset.kubernetes.io/pod-name`) is kept in the identities of the pods carrying it
//! while a policy selects on it, so that the policy applies to them, and dropped again when
//! the policy goes. After every change, a truth table of real TCP, UDP and ICMP flows.
//!
//! Root, serially, after `cargo build --workspace`:
//! `cargo test -p cellium-integration --test identity_relevance -- --test-threads=1`.
//!
//! The cluster is `lab::fixture` (pods `shop/web`, `shop/db`, `dev/web`, `dev/tool`,
//! `ops/dns`, the node, and `ext-a`/`ext-b` outside the cluster), with `shop/db` and
//! `dev/tool` labelled as the first pods of StatefulSets.

use cellium_integration::lab::{Lab, fixture};
use cellium_integration::reach::Probe::{Icmp, Tcp, Udp};
use cellium_integration::{AgentOptions, serial};
use serde_json::Value;

const PROBES: [cellium_integration::reach::Probe; 3] = [Tcp(5432), Udp(53), Icmp];

/// A key the label filter drops: it differs from pod to pod of a StatefulSet.
const POD_NAME: &str = "statefulset.kubernetes.io/pod-name";

const STATEFUL_PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: { name: db, namespace: shop, labels: { app: db, statefulset.kubernetes.io/pod-name: db-0 } }
spec: { containers: [ { name: c, ports: [ { name: sql, containerPort: 5432 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: tool, namespace: dev, labels: { app: tool, statefulset.kubernetes.io/pod-name: tool-0 } }
spec: { containers: [ { name: c } ] }
"#;

/// Selects db-0 by its pod name alone, and admits the web pods of shop, and tool-0 of team b
/// on 53/UDP (a peer selected by the dropped key as well).
const DB_0: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: db-0, namespace: shop }
spec:
  podSelector: { matchLabels: { statefulset.kubernetes.io/pod-name: db-0 } }
  ingress:
  - from: [ { podSelector: { matchLabels: { app: web } } } ]
  - from: [ { namespaceSelector: { matchLabels: { team: b } }, podSelector: { matchLabels: { statefulset.kubernetes.io/pod-name: tool-0 } } } ]
    ports: [ { port: 53, protocol: UDP } ]
"#;

/// The value of the `k8s:` label `key` of `pod`'s endpoint.
fn label(lab: &Lab, pod: &str, key: &str) -> Option<String> {
    lab.endpoints().unwrap()[pod]["labels"][format!("k8s:{key}")]
        .as_str()
        .map(str::to_string)
}

/// The `POD_NAME` row of `cellium identity list --keys -o json`, if there is one.
fn pod_name_key(lab: &Lab) -> Option<Value> {
    let keys = lab
        .agent()
        .cli_json(&["identity", "list", "--keys"])
        .unwrap();
    keys.as_array()?
        .iter()
        .find(|k| k["key"] == POD_NAME)
        .cloned()
}

#[test]
fn a_policy_selecting_on_a_filtered_key_applies_and_the_key_leaves_identities_with_it() {
    let _serial = serial();
    let mut lab = Lab::start(AgentOptions::default()).unwrap();
    lab.apply(fixture::BASE).unwrap();
    lab.apply(STATEFUL_PODS).unwrap();
    for (key, ip) in fixture::PODS {
        lab.add_pod(key, ip).unwrap();
    }
    lab.settle().unwrap();
    assert_eq!(
        label(&lab, "shop/db", POD_NAME),
        None,
        "the filter drops it"
    );
    assert_eq!(pod_name_key(&lab), None, "no identity holds it");
    lab.check("no policy", &PROBES, |_| true);

    // The policy exists: db-0 and tool-0 carry their pod names, and the policy applies.
    let before = lab.identities().unwrap();
    lab.apply_policy(DB_0).unwrap();
    lab.wait_until("db and tool carry their pod names", |l| {
        Ok(label(l, "shop/db", POD_NAME).as_deref() == Some("db-0")
            && label(l, "dev/tool", POD_NAME).as_deref() == Some("tool-0"))
    })
    .unwrap();
    lab.settle().unwrap();
    let now = lab.identities().unwrap();
    for pod in ["shop/db", "dev/tool"] {
        assert_ne!(now[pod], before[pod], "{pod} has a new identity");
    }
    for pod in ["shop/web", "dev/web", "ops/dns"] {
        assert_eq!(now[pod], before[pod], "{pod} does not carry the key");
    }
    let key = pod_name_key(&lab).expect("the key is listed");
    assert_eq!(key["kept_by"], "policy", "{key}");
    assert_eq!(key["policies"][0], "NetworkPolicy shop/db-0", "{key}");
    assert!(key["identities"].as_u64() >= Some(2), "{key}");
    lab.check("the policy selects db-0 by pod name", &PROBES, |f| {
        !f.to.is("shop/db")
            || f.from.is_node()
            || f.from.is("shop/web")
            || (f.from.is("dev/tool") && f.probe == Udp(53))
    });

    // The policy goes: the key leaves the identities, and db is open again.
    lab.delete_policy(DB_0).unwrap();
    lab.wait_until("db and tool drop their pod names", |l| {
        Ok(label(l, "shop/db", POD_NAME).is_none() && label(l, "dev/tool", POD_NAME).is_none())
    })
    .unwrap();
    lab.settle().unwrap();
    lab.wait_until("no identity holds the key", |l| {
        Ok(pod_name_key(l).is_none())
    })
    .unwrap();
    lab.check("policy deleted", &PROBES, |_| true);
}

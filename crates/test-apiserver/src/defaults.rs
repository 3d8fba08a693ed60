//! Defaulting the real API server does for the fields a CNI reads, and ClusterIP allocation.

use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Hands out Service ClusterIPs from 10.96.0.0/12 and fd00:10:96::/108.
#[derive(Debug, Default)]
pub struct IpAllocator {
    used: HashSet<String>,
    next_v4: u32,
    next_v6: u32,
}

const V4_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
const V4_SIZE: u32 = 1 << 20;
const V6_SIZE: u32 = 1 << 20;

impl IpAllocator {
    /// Marks an address as taken (a Service created with an explicit ClusterIP).
    pub fn reserve(&mut self, ip: &str) {
        self.used.insert(ip.to_string());
    }

    /// Returns an address to the pool.
    pub fn release(&mut self, ip: &str) {
        self.used.remove(ip);
    }

    /// The next free address of the family (`"IPv4"` or `"IPv6"`).
    fn allocate(&mut self, family: &str) -> Option<String> {
        for _ in 0..V4_SIZE {
            let ip = if family == "IPv6" {
                // .1 is the kubernetes Service in a real cluster: start at ::a like kubeadm leaves it.
                self.next_v6 = (self.next_v6 % (V6_SIZE - 10)) + 1;
                let base = u128::from(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0));
                Ipv6Addr::from(base + u128::from(self.next_v6 + 9)).to_string()
            } else {
                self.next_v4 = (self.next_v4 % (V4_SIZE - 11)) + 1;
                Ipv4Addr::from(V4_BASE + self.next_v4 + 9).to_string()
            };
            if self.used.insert(ip.clone()) {
                return Some(ip);
            }
        }
        None
    }
}

/// Fills in defaults on a new or updated object of `kind`; `old` is the stored object on update.
pub fn apply(kind: &str, obj: &mut Value, old: Option<&Value>, ips: &mut IpAllocator) {
    match kind {
        "Namespace" => namespace(obj),
        "Service" => service(obj, old, ips),
        "Pod" => pod(obj),
        _ => {}
    }
}

fn namespace(obj: &mut Value) {
    let name = obj["metadata"]["name"].clone();
    let labels = ensure_object(&mut obj["metadata"], "labels");
    labels.insert("kubernetes.io/metadata.name".into(), name);
    if obj.pointer("/spec/finalizers").is_none() {
        ensure_object(obj, "spec").insert("finalizers".into(), json!(["kubernetes"]));
    }
    if obj.pointer("/status/phase").is_none() {
        ensure_object(obj, "status").insert("phase".into(), json!("Active"));
    }
}

fn pod(obj: &mut Value) {
    for list in ["containers", "initContainers"] {
        if let Some(containers) = obj
            .pointer_mut(&format!("/spec/{list}"))
            .and_then(Value::as_array_mut)
        {
            for c in containers {
                if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
                    for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                        p.entry("protocol").or_insert(json!("TCP"));
                    }
                }
            }
        }
    }
    if obj.pointer("/status/phase").is_none() {
        ensure_object(obj, "status").insert("phase".into(), json!("Pending"));
    }
}

fn service(obj: &mut Value, old: Option<&Value>, ips: &mut IpAllocator) {
    let spec = ensure_object(obj, "spec");
    spec.entry("type").or_insert(json!("ClusterIP"));
    spec.entry("sessionAffinity").or_insert(json!("None"));
    // The allocated addresses are immutable: an update that omits them keeps the stored ones,
    // as the real server's patchAllocatedValues does.
    if let Some(old_spec) = old.and_then(|o| o.get("spec")).and_then(Value::as_object) {
        for key in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if !spec.contains_key(key)
                && let Some(v) = old_spec.get(key)
            {
                spec.insert(key.into(), v.clone());
            }
        }
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert(json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                p.entry("targetPort").or_insert(port);
            }
        }
    }
    if spec.get("type").and_then(Value::as_str) == Some("ExternalName") {
        return;
    }
    spec.entry("internalTrafficPolicy")
        .or_insert(json!("Cluster"));
    let policy = spec
        .get("ipFamilyPolicy")
        .and_then(Value::as_str)
        .unwrap_or("SingleStack")
        .to_string();
    spec.insert("ipFamilyPolicy".into(), json!(policy));
    let given: Vec<String> = match (spec.get("clusterIPs"), spec.get("clusterIP")) {
        (Some(Value::Array(list)), _) if !list.is_empty() => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        (_, Some(Value::String(ip))) if !ip.is_empty() => vec![ip.clone()],
        _ => Vec::new(),
    };
    let families: Vec<String> = match spec.get("ipFamilies").and_then(Value::as_array) {
        Some(f) if !f.is_empty() => f
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ if !given.is_empty() && given[0] != "None" => given
            .iter()
            .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" }.to_string())
            .collect(),
        _ if policy == "SingleStack" => vec!["IPv4".into()],
        _ => vec!["IPv4".into(), "IPv6".into()],
    };
    spec.insert("ipFamilies".into(), json!(families));
    if given.first().map(String::as_str) == Some("None") {
        spec.insert("clusterIP".into(), json!("None"));
        spec.insert("clusterIPs".into(), json!(["None"]));
        return;
    }
    let mut cluster_ips = Vec::new();
    for (i, family) in families.iter().enumerate() {
        match given.get(i) {
            Some(ip) => {
                ips.reserve(ip);
                cluster_ips.push(ip.clone());
            }
            None => cluster_ips.extend(ips.allocate(family)),
        }
    }
    if let Some(first) = cluster_ips.first() {
        spec.insert("clusterIP".into(), json!(first));
    }
    spec.insert("clusterIPs".into(), json!(cluster_ips));
}

/// The ClusterIPs a stored Service holds, to release when it is deleted.
pub fn cluster_ips(obj: &Value) -> Vec<String> {
    obj.pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .filter(|ip| *ip != "None")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `obj[key]` as a mutable map, made one if absent or not an object.
pub fn ensure_object<'a>(obj: &'a mut Value, key: &str) -> &'a mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let map = obj.as_object_mut().expect("made an object above");
    let entry = map.entry(key.to_string()).or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    entry.as_object_mut().expect("made an object above")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_gets_cluster_ip_and_defaults() {
        let mut ips = IpAllocator::default();
        let mut svc = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}});
        apply("Service", &mut svc, None, &mut ips);
        let spec = &svc["spec"];
        assert_eq!(spec["type"], "ClusterIP");
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        assert_eq!(
            spec["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        let ip: Ipv4Addr = spec["clusterIP"].as_str().unwrap().parse().unwrap();
        assert_eq!(ip.octets()[0..2], [10, 96]);
        assert_eq!(spec["clusterIPs"], json!([spec["clusterIP"]]));
    }

    #[test]
    fn dual_stack_and_headless() {
        let mut ips = IpAllocator::default();
        let mut svc =
            json!({"metadata": {"name": "s"}, "spec": {"ipFamilyPolicy": "PreferDualStack"}});
        apply("Service", &mut svc, None, &mut ips);
        assert_eq!(svc["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        let v6: Ipv6Addr = svc["spec"]["clusterIPs"][1]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(v6.segments()[0..3], [0xfd00, 0x10, 0x96]);
        let mut headless = json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}});
        apply("Service", &mut headless, None, &mut ips);
        assert_eq!(headless["spec"]["clusterIP"], "None");
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
    }

    #[test]
    fn allocations_are_unique_and_kept_on_update() {
        let mut ips = IpAllocator::default();
        let mut a = json!({"spec": {}});
        let mut b = json!({"spec": {"clusterIP": "10.96.0.10"}});
        apply("Service", &mut b, None, &mut ips);
        apply("Service", &mut a, None, &mut ips);
        assert_ne!(a["spec"]["clusterIP"], b["spec"]["clusterIP"]);
        let mut update = json!({"spec": {"ports": [{"port": 81}]}});
        apply("Service", &mut update, Some(&a), &mut ips);
        assert_eq!(update["spec"]["clusterIP"], a["spec"]["clusterIP"]);
    }

    #[test]
    fn namespace_and_pod_defaults() {
        let mut ns = json!({"metadata": {"name": "team"}});
        apply("Namespace", &mut ns, None, &mut IpAllocator::default());
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "team"
        );
        let mut pod =
            json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}});
        apply("Pod", &mut pod, None, &mut IpAllocator::default());
        assert_eq!(pod["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
    }
}

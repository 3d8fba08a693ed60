//! Legacy discovery documents. kubectl asks for aggregated discovery
//! (`apidiscovery.k8s.io/v2`) first; a plain `application/json` answer makes it fall back.

use crate::registry::{self, KINDS};
use serde_json::{Value, json};

/// `/version`: kubectl and kube-rs print it; the numbers claim the kubectl we test with.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-cellium-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`: the core group's versions.
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]
    })
}

fn group_entry(name: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
}

/// `/apis`: every named group.
pub fn groups() -> Value {
    let groups: Vec<Value> = registry::groups()
        .iter()
        .map(|(g, v)| group_entry(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/GROUP`, if served.
pub fn group(name: &str) -> Option<Value> {
    let (_, versions) = registry::groups().into_iter().find(|(g, _)| *g == name)?;
    let mut entry = group_entry(name, &versions);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

/// `/api/v1` or `/apis/GROUP/VERSION`: the resources with their verbs and short names.
pub fn resources(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for k in KINDS
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        // `kubectl get all` expands the `all` category, which core pods and services join.
        let categories: &[&str] = if k.group.is_empty() && matches!(k.kind, "Pod" | "Service") {
            &["all"]
        } else {
            &[]
        };
        resources.push(json!({
            "name": k.resource,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": k.short_names,
            "categories": categories,
        }));
        if k.status {
            resources.push(json!({
                "name": format!("{}/status", k.resource),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_status_subresources() {
        let core = resources("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods") && names.contains(&"pods/status"));
        assert!(!names.contains(&"endpoints"));
        let cilium = resources("cilium.io", "v2").unwrap();
        assert!(
            cilium["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["shortNames"] == json!(["cnp", "ciliumnp"]))
        );
        assert!(resources("nope", "v1").is_none());
        assert_eq!(
            group("cilium.io").unwrap()["preferredVersion"]["groupVersion"],
            "cilium.io/v2"
        );
        assert!(group("nope").is_none());
    }
}

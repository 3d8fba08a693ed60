//! A minimal OpenAPI v3 document: no schemas, only each kind's PATCH operation declaring the
//! `fieldValidation` query parameter.
//!
//! That is what kubectl's `--validate=strict` (its default) looks for: when the server
//! declares `fieldValidation` for a kind, kubectl leaves validation to the server (which
//! here accepts everything) instead of downloading schemas for client-side validation.
//! Without schemas kubectl's client-side apply computes strategic merge patches from its
//! compiled-in types (core kinds) and JSON merge patches for the others, as it does for CRDs.

use crate::registry::KINDS;
use serde_json::{Map, Value, json};

/// The URL path prefix of a group version's document (`api/v1`, `apis/cilium.io/v2`).
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of group-version documents.
pub fn index() -> Value {
    let mut paths = Map::new();
    for k in KINDS {
        let path = gv_path(k.group, k.version);
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash=cellium")}),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/G/V`, if served.
pub fn group_version(group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for k in KINDS
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        let scope = if k.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let path = format!(
            "/{}/{scope}{}/{{name}}",
            gv_path(k.group, k.version),
            k.resource
        );
        let gvk = json!({"group": k.group, "version": k.version, "kind": k.kind});
        paths.insert(
            path,
            json!({
                "patch": {
                    "operationId": format!("patch{}", k.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
                    ],
                    "responses": {"200": {"description": "OK"}}
                }
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0-cellium-test"},
        "paths": paths,
        "components": {}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_patch_with_field_validation() {
        let index = index();
        assert!(
            index["paths"]["apis/cilium.io/v2"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/apis/cilium.io/v2")
        );
        let core = group_version("", "v1").unwrap();
        let pods = &core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(pods["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert_eq!(pods["parameters"][0]["name"], "fieldValidation");
        let cilium = group_version("cilium.io", "v2").unwrap();
        assert!(
            cilium["paths"]
                .get("/apis/cilium.io/v2/ciliumnodes/{name}")
                .is_some()
        );
        assert!(group_version("nope", "v1").is_none());
    }
}

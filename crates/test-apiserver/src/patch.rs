//! The PATCH flavours: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the
//! strategic merge patch subset kubectl sends.

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// Applies an RFC 7386 merge patch: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Applies a strategic merge patch: a merge patch in which lists of objects that carry a
/// merge key (`name`; `mountPath` for volume mounts; `containerPort` / `port` for ports)
/// merge element by element.
///
/// Directives: `$patch: delete` on a list element removes it, `$patch: replace` on a map
/// replaces it, `$setElementOrder/…` orders a merged list; `$retainKeys` and
/// `$deleteFromPrimitiveList/…` are dropped (primitive lists are replaced whole).
pub fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch.clone();
        replaced.remove("$patch");
        *target = Value::Object(replaced);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Array(items) => {
                let current = target.get_mut(key).and_then(Value::as_array_mut);
                match (current, merge_key(key, items)) {
                    (Some(current), Some(mk)) => merge_list(current, items, mk),
                    _ => {
                        let items = items.iter().filter(|i| !is_delete(i)).cloned().collect();
                        target.insert(key.clone(), strip_directives(Value::Array(items)));
                    }
                }
            }
            _ => strategic(target.entry(key.clone()).or_insert(Value::Null), value),
        }
    }
    for (key, order) in patch {
        if let (Some(field), Value::Array(order)) = (key.strip_prefix("$setElementOrder/"), order)
            && let Some(Value::Array(current)) = target.get_mut(field)
        {
            set_element_order(field, current, order);
        }
    }
}

/// Orders a merged list as `$setElementOrder` says (kubectl sends the manifest's order);
/// elements the order does not name keep their relative order after the named ones.
fn set_element_order(field: &str, current: &mut [Value], order: &[Value]) {
    let Some(mk) = merge_key(field, order) else {
        return;
    };
    let position = |item: &Value| {
        order
            .iter()
            .position(|o| o.get(mk) == item.get(mk))
            .unwrap_or(order.len())
    };
    // A stable sort keeps unnamed elements in their relative order.
    current.sort_by_key(position);
}

/// The key lists of objects merge on, or None to replace the list. Kubernetes reads this
/// from the schema (`patchMergeKey`); the field names CNI-relevant kinds use are enough.
fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    let all_have = |k: &str| !items.is_empty() && items.iter().all(|i| i.get(k).is_some());
    if !items.iter().all(Value::is_object) {
        return None;
    }
    if field == "volumeMounts" && all_have("mountPath") {
        Some("mountPath")
    } else if field == "ports" && all_have("containerPort") {
        Some("containerPort")
    } else if field == "ports" && all_have("port") {
        Some("port")
    } else if all_have("name") {
        Some("name")
    } else {
        None
    }
}

fn is_delete(item: &Value) -> bool {
    item.get("$patch").and_then(Value::as_str) == Some("delete")
}

fn merge_list(current: &mut Vec<Value>, items: &[Value], mk: &str) {
    for item in items {
        let key = &item[mk];
        let pos = current.iter().position(|c| c.get(mk) == Some(key));
        match (pos, is_delete(item)) {
            (Some(i), true) => {
                current.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic(&mut current[i], item),
            (None, false) => current.push(strip_directives(item.clone())),
        }
    }
}

fn strip_directives(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k, strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_directives).collect()),
        other => other,
    }
}

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`, `copy`, `test`).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<()> {
    let ops = ops
        .as_array()
        .ok_or_else(|| Error::BadRequest("a JSON patch is an array of operations".into()))?;
    for op in ops {
        let field = |name: &str| -> Result<&str> {
            op.get(name).and_then(Value::as_str).ok_or_else(|| {
                Error::BadRequest(format!("JSON patch operation lacks {name:?}: {op}"))
            })
        };
        let path = field("path")?;
        match field("op")? {
            "add" => add(target, path, value_of(op)?.clone())?,
            "remove" => {
                remove(target, path)?;
            }
            "replace" => {
                remove(target, path)?;
                add(target, path, value_of(op)?.clone())?;
            }
            "move" => {
                let value = remove(target, field("from")?)?;
                add(target, path, value)?;
            }
            "copy" => {
                let value = target
                    .pointer(field("from")?)
                    .cloned()
                    .ok_or_else(|| missing(field("from").unwrap_or_default()))?;
                add(target, path, value)?;
            }
            "test" => {
                if target.pointer(path) != Some(value_of(op)?) {
                    return Err(Error::Invalid(format!("JSON patch test failed at {path}")));
                }
            }
            other => {
                return Err(Error::BadRequest(format!(
                    "unknown JSON patch op {other:?}"
                )));
            }
        }
    }
    Ok(())
}

fn value_of(op: &Value) -> Result<&Value> {
    op.get("value")
        .ok_or_else(|| Error::BadRequest(format!("JSON patch operation lacks \"value\": {op}")))
}

fn missing(path: &str) -> Error {
    Error::Invalid(format!("JSON patch path {path:?} does not exist"))
}

/// Splits a JSON pointer into its parent pointer and unescaped last token.
fn split_pointer(path: &str) -> Result<(&str, String)> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| Error::BadRequest(format!("invalid JSON pointer {path:?}")))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn add(target: &mut Value, path: &str, value: Value) -> Result<()> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(parent).ok_or_else(|| missing(path))? {
        Value::Object(map) => {
            map.insert(last, value);
        }
        Value::Array(items) => {
            let index = if last == "-" {
                items.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|i| *i <= items.len())
                    .ok_or_else(|| missing(path))?
            };
            items.insert(index, value);
        }
        _ => return Err(missing(path)),
    }
    Ok(())
}

fn remove(target: &mut Value, path: &str) -> Result<Value> {
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(parent).ok_or_else(|| missing(path))? {
        Value::Object(map) => map.remove(&last).ok_or_else(|| missing(path)),
        Value::Array(items) => {
            let index = last
                .parse::<usize>()
                .ok()
                .filter(|i| *i < items.len())
                .ok_or_else(|| missing(path))?;
            Ok(items.remove(index))
        }
        _ => Err(missing(path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge(
            &mut doc,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            doc,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
        merge(&mut doc, &json!("whole"));
        assert_eq!(doc, json!("whole"));
    }

    #[test]
    fn strategic_merges_named_lists() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "ports": [{"containerPort": 80, "protocol": "TCP"}]},
            {"name": "b", "image": "b:1"}
        ]}});
        strategic(
            &mut pod,
            &json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [
                {"name": "a", "image": "a:2", "ports": [{"containerPort": 8080}]},
                {"name": "c", "image": "c:1"}
            ]}}),
        );
        let containers = pod["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 3);
        assert_eq!(containers[0]["image"], "a:2");
        assert_eq!(containers[0]["ports"].as_array().unwrap().len(), 2);
        assert_eq!(containers[1]["image"], "b:1");
        assert_eq!(containers[2]["name"], "c");
        assert!(pod["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn strategic_volume_mounts_merge_on_their_path() {
        // What kubectl apply sends when a manifest drops a mount its last one had.
        let mut c = json!({"volumeMounts": [
            {"name": "config", "mountPath": "/etc/c"},
            {"name": "etcd", "mountPath": "/var/lib/etcd-config"}
        ]});
        strategic(
            &mut c,
            &json!({"volumeMounts": [{"mountPath": "/var/lib/etcd-config", "$patch": "delete"}]}),
        );
        assert_eq!(
            c,
            json!({"volumeMounts": [{"name": "config", "mountPath": "/etc/c"}]})
        );
    }

    #[test]
    fn strategic_set_element_order() {
        let mut pod =
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "x"}]}});
        strategic(
            &mut pod,
            &json!({"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "c"}, {"name": "a"}],
            "containers": [{"name": "c"}]}}),
        );
        let names: Vec<&str> = pod["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b", "c", "a", "x"]);
    }

    #[test]
    fn strategic_delete_and_replace_directives() {
        let mut obj =
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "m": {"x": 1, "y": 2}}});
        strategic(
            &mut obj,
            &json!({"spec": {
            "containers": [{"name": "a", "$patch": "delete"}],
            "m": {"$patch": "replace", "z": 3}}}),
        );
        assert_eq!(
            obj,
            json!({"spec": {"containers": [{"name": "b"}], "m": {"z": 3}}})
        );
    }

    #[test]
    fn strategic_replaces_scalar_lists_and_service_ports_merge_by_port() {
        let mut svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443}], "ipFamilies": ["IPv4"]}});
        strategic(
            &mut svc,
            &json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}], "ipFamilies": ["IPv6"]}}),
        );
        assert_eq!(
            svc["spec"]["ports"][1],
            json!({"port": 443, "targetPort": 8443})
        );
        assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 2);
        assert_eq!(svc["spec"]["ipFamilies"], json!(["IPv6"]));
    }

    #[test]
    fn json_patch_rfc6902() {
        let mut doc = json!({"metadata": {"labels": {"a/b": "1"}}, "l": [1, 2, 3]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/metadata/labels/c", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a~1b", "value": "9"},
                {"op": "remove", "path": "/l/0"},
                {"op": "add", "path": "/l/-", "value": 4},
                {"op": "copy", "from": "/l/0", "path": "/first"},
                {"op": "move", "from": "/first", "path": "/moved"},
                {"op": "test", "path": "/moved", "value": 2}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"a/b": "9", "c": "2"}}, "l": [2, 3, 4], "moved": 2})
        );
    }

    #[test]
    fn json_patch_failures() {
        let mut doc = json!({"a": 1});
        assert!(json_patch(&mut doc, &json!([{"op": "test", "path": "/a", "value": 2}])).is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "bogus", "path": "/a"}])).is_err());
        assert!(json_patch(&mut doc, &json!({"op": "add"})).is_err());
    }
}

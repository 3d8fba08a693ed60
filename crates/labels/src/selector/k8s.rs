//! The Kubernetes/Cilium shape of a selector: `matchLabels` and `matchExpressions`.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Operator, Requirement, Selector};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Shape {
    #[serde(default)]
    match_labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    match_expressions: Option<Vec<Expression>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expression {
    key: String,
    operator: Operator,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    values: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for Selector {
    /// Reads `{matchLabels: {k: v}, matchExpressions: [{key, operator, values}]}`; both
    /// fields are optional and `{}` (or `null` fields) select everything. Each entry is
    /// checked as [`Requirement::new`] checks it, and the error names its key.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Selector, D::Error> {
        let shape = Shape::deserialize(d)?;
        let mut requirements = Vec::new();
        for (key, value) in shape.match_labels.unwrap_or_default() {
            requirements.push(
                Requirement::new(&key, Operator::In, [value])
                    .map_err(|e| D::Error::custom(format!("matchLabels: {e}")))?,
            );
        }
        for e in shape.match_expressions.unwrap_or_default() {
            requirements.push(
                Requirement::new(&e.key, e.operator, e.values.unwrap_or_default())
                    .map_err(|e| D::Error::custom(format!("matchExpressions: {e}")))?,
            );
        }
        Ok(Selector::new(requirements))
    }
}

impl Serialize for Selector {
    /// Writes single-value `In` requirements as `matchLabels`, the others as
    /// `matchExpressions`, every key with its source.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut labels = BTreeMap::new();
        let mut expressions = Vec::new();
        for r in &self.requirements {
            match (r.operator(), r.values().len()) {
                (Operator::In, 1) => {
                    let value = r.values().iter().next().cloned().unwrap_or_default();
                    labels.insert(r.key().to_string(), value);
                }
                (op, _) => expressions.push(Expression {
                    key: r.key().to_string(),
                    operator: op,
                    values: (!r.values().is_empty()).then(|| r.values().iter().cloned().collect()),
                }),
            }
        }
        let fields = usize::from(!labels.is_empty()) + usize::from(!expressions.is_empty());
        let mut map = s.serialize_map(Some(fields))?;
        if !labels.is_empty() {
            map.serialize_entry("matchLabels", &labels)?;
        }
        if !expressions.is_empty() {
            map.serialize_entry("matchExpressions", &expressions)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Labels;

    fn yaml(s: &str) -> Result<Selector, String> {
        serde_yaml::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn match_labels_and_expressions_are_read() {
        let sel = yaml(
            "matchLabels: {app: web, 'k8s:io.kubernetes.pod.namespace': shop}\n\
             matchExpressions:\n\
             - {key: tier, operator: In, values: [a, b]}\n\
             - {key: debug, operator: DoesNotExist}\n",
        )
        .unwrap();
        assert_eq!(
            sel.to_string(),
            "any:app=web,!any:debug,any:tier in (a,b),k8s:io.kubernetes.pod.namespace=shop"
        );
        let l: Labels = "k8s:app=web,k8s:tier=b,k8s:io.kubernetes.pod.namespace=shop"
            .parse()
            .unwrap();
        assert!(sel.matches(&l));
    }

    #[test]
    fn empty_and_null_select_everything() {
        assert_eq!(yaml("{}").unwrap(), Selector::all());
        assert_eq!(
            yaml("{matchLabels: null, matchExpressions: []}").unwrap(),
            Selector::all()
        );
    }

    #[test]
    fn both_forms_of_one_requirement_are_equal() {
        let a = yaml("matchLabels: {app: web}").unwrap();
        let b = yaml("matchExpressions: [{key: app, operator: In, values: [web]}]").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), b.to_string());
    }

    #[test]
    fn errors_name_the_field_and_key() {
        for (text, want) in [
            (
                "matchExpressions: [{key: app, operator: In}]",
                "matchExpressions: invalid selector requirement on key \"app\": In needs at least one value",
            ),
            (
                "matchExpressions: [{key: app, operator: Has}]",
                "unknown variant `Has`",
            ),
            (
                "matchLabels: {'a b': x}",
                "matchLabels: invalid selector requirement on key \"a b\"",
            ),
            ("matchLabel: {app: web}", "unknown field `matchLabel`"),
        ] {
            let err = yaml(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn serialization_round_trips_through_the_kubernetes_shape() {
        let sel: Selector = "app=web,tier in (a,b),!debug,reserved:host"
            .parse()
            .unwrap();
        let json = serde_json::to_value(&sel).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "matchLabels": {"any:app": "web"},
                "matchExpressions": [
                    {"key": "any:debug", "operator": "DoesNotExist"},
                    {"key": "any:tier", "operator": "In", "values": ["a", "b"]},
                    {"key": "reserved:host", "operator": "Exists"},
                ]
            })
        );
        assert_eq!(serde_json::from_value::<Selector>(json).unwrap(), sel);
        assert_eq!(
            serde_json::to_value(Selector::all()).unwrap(),
            serde_json::json!({})
        );
    }
}

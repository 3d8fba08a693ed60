//! Reading every section from the sources, with every problem reported at once.

use std::any::TypeId;
use std::collections::HashMap;

use figment::Figment;
use figment::providers::Serialized;
use figment::value::{Dict, Value};

use super::SectionDecl;
use super::sources::{ConfigSources, RawValue, env_value};
use crate::error::Problem;
use crate::module::ValueBox;

/// A section and the module that owns it (`hive` for the hive's own).
pub(crate) struct SectionRef<'a> {
    pub(crate) owner: &'a str,
    pub(crate) decl: &'a SectionDecl,
}

/// Every section, read.
#[derive(Default)]
pub(crate) struct LoadedConfig {
    /// `Config<T>` by `TypeId` of `T`.
    pub(crate) values: HashMap<TypeId, ValueBox>,
    /// `key = value` lines by `TypeId` of `T`, for `describe`.
    pub(crate) rendered: HashMap<TypeId, Vec<(String, String)>>,
}

/// Jaro-Winkler similarity above which a declared key is suggested.
const SUGGEST: f64 = 0.8;

pub(crate) fn load(
    sections: &[SectionRef<'_>],
    sources: &ConfigSources,
) -> Result<LoadedConfig, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut types: HashMap<TypeId, usize> = HashMap::new();
    let mut owners: HashMap<String, usize> = HashMap::new();
    let mut defaults: Vec<Option<Dict>> = Vec::with_capacity(sections.len());
    for (i, s) in sections.iter().enumerate() {
        if let Some(&first) = types.get(&s.decl.ty.id) {
            problems.push(Problem::DuplicateConfigSection {
                section: s.decl.ty.pretty(),
                first_module: sections[first].owner.to_string(),
                second_module: s.owner.to_string(),
            });
            defaults.push(None);
            continue;
        }
        types.insert(s.decl.ty.id, i);
        match (s.decl.defaults)() {
            Ok(dict) => {
                for key in dict.keys() {
                    if let Some(&j) = owners.get(key) {
                        problems.push(Problem::ConfigKeyClash {
                            key: key.clone(),
                            first_section: sections[j].decl.ty.pretty(),
                            first_module: sections[j].owner.to_string(),
                            second_section: s.decl.ty.pretty(),
                            second_module: s.owner.to_string(),
                        });
                    } else {
                        owners.insert(key.clone(), i);
                    }
                }
                defaults.push(Some(dict));
            }
            Err(reason) => {
                problems.push(Problem::BadConfigSection {
                    section: s.decl.ty.pretty(),
                    module: s.owner.to_string(),
                    reason,
                });
                defaults.push(None);
            }
        }
    }

    // Later sources override earlier ones key by key; `winners` keeps the value
    // in force and where it came from, for error messages.
    let mut winners: HashMap<String, (Value, String)> = HashMap::new();
    for entry in sources.read(&mut problems) {
        let Some(&owner) = owners.get(&entry.key) else {
            problems.push(Problem::UnknownKey {
                hint: unknown_hint(&entry.key, &entry.value, &owners, sections),
                key: entry.key,
                origin: entry.origin,
            });
            continue;
        };
        let default = defaults[owner].as_ref().and_then(|d| d.get(&entry.key));
        let value = match entry.value {
            RawValue::Typed(v) => v,
            RawValue::Env(s) => env_value(&s, default),
        };
        winners.insert(entry.key, (value, entry.origin));
    }

    let mut loaded = LoadedConfig::default();
    for (s, dict) in sections.iter().zip(defaults) {
        let Some(mut dict) = dict else { continue };
        for (key, value) in dict.iter_mut() {
            if let Some((v, _)) = winners.get(key) {
                *value = v.clone();
            }
        }
        let figment = Figment::from(Serialized::defaults(dict));
        match (s.decl.load)(&figment) {
            Ok(section) => {
                loaded.values.insert(s.decl.ty.id, section.value);
                loaded.rendered.insert(s.decl.ty.id, section.rendered);
            }
            Err(errors) => {
                for e in *errors {
                    let key = e.path.first().cloned().unwrap_or_default();
                    let origin = winners.get(&key).map_or_else(
                        || format!("the default of section `{}`", s.decl.ty.pretty()),
                        |(_, origin)| origin.clone(),
                    );
                    problems.push(Problem::InvalidValue {
                        key,
                        origin,
                        reason: e.kind.to_string(),
                    });
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(loaded)
    } else {
        Err(problems)
    }
}

fn unknown_hint(
    key: &str,
    value: &RawValue,
    owners: &HashMap<String, usize>,
    sections: &[SectionRef<'_>],
) -> Option<String> {
    // A nested table whose keys are declared: the user wrote sections, but keys
    // are flat.
    if let RawValue::Typed(Value::Dict(_, inner)) = value {
        let known: Vec<&String> = inner.keys().filter(|k| owners.contains_key(*k)).collect();
        if !known.is_empty() {
            let list: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            return Some(format!(
                "keys are flat: set {} at the top level, not under `{key}`",
                list.join(", ")
            ));
        }
    }
    let (best, score) = owners
        .keys()
        .map(|k| (k, strsim::jaro_winkler(key, k)))
        .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(a.0)))?;
    (score >= SUGGEST).then(|| {
        let s = &sections[owners[best]];
        format!(
            "did you mean `{best}` (section `{}` of module `{}`)?",
            s.decl.ty.pretty(),
            s.owner
        )
    })
}

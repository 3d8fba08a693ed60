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
            RawValue::Text(s) => env_value(&s, default),
        };
        winners.insert(entry.key, (value, entry.origin));
    }

    let mut loaded = LoadedConfig::default();
    for (s, dict) in sections.iter().zip(defaults) {
        let Some(dict) = dict else { continue };
        let with = |keys: &mut dyn Iterator<Item = &String>| {
            let mut d = dict.clone();
            for key in keys {
                if let (Some(slot), Some((v, _))) = (d.get_mut(key), winners.get(key)) {
                    *slot = v.clone();
                }
            }
            (s.decl.load)(&Figment::from(Serialized::defaults(d)))
        };
        let set: Vec<&String> = dict.keys().filter(|k| winners.contains_key(*k)).collect();
        match with(&mut set.iter().copied()) {
            Ok(section) => {
                loaded.values.insert(s.decl.ty.id, section.value);
                loaded.rendered.insert(s.decl.ty.id, section.rendered);
            }
            Err(first) => {
                // Deserializing stops at the first bad field; try each set key
                // alone so that every bad value is reported.
                let mut found = false;
                for key in &set {
                    if let Err(e) = with(&mut std::iter::once(*key)) {
                        found = true;
                        problems.extend(value_problems(*e, s, &winners));
                    }
                }
                if !found {
                    problems.extend(value_problems(*first, s, &winners));
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

fn value_problems(
    errors: figment::Error,
    s: &SectionRef<'_>,
    winners: &HashMap<String, (Value, String)>,
) -> Vec<Problem> {
    errors
        .into_iter()
        .map(|e| {
            let key = e.path.first().cloned().unwrap_or_default();
            let origin = winners.get(&key).map_or_else(
                || format!("the default of section `{}`", s.decl.ty.pretty()),
                |(_, origin)| origin.clone(),
            );
            // The value itself, so a person sees what they wrote next to what was expected.
            let value = winners.get(&key).map(|(v, _)| render(v));
            Problem::InvalidValue {
                key,
                origin,
                reason: e.kind.to_string(),
                value,
            }
        })
        .collect()
}

/// A value as compact JSON, cut after 200 characters.
fn render(value: &Value) -> String {
    let text = serde_json::to_string(value).unwrap_or_else(|_| format!("{value:?}"));
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    use crate::{Config, ConfigSources, Error, Hive, Module};

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct IpamConfig {
        pod_cidr: Vec<String>,
        state_dir: String,
        max_pods: u16,
        debug: bool,
    }

    impl Default for IpamConfig {
        fn default() -> Self {
            IpamConfig {
                pod_cidr: vec!["10.0.0.0/24".into()],
                state_dir: "/var/lib/cellium".into(),
                max_pods: 110,
                debug: false,
            }
        }
    }

    #[derive(Default, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct OtherConfig {
        state_dir: String,
    }

    fn hive_with(sources: ConfigSources, seen: Arc<Mutex<Option<IpamConfig>>>) -> Hive {
        Hive::new([Module::new("ipam", "x")
            .config::<IpamConfig>()
            .invoke(move |c: Config<IpamConfig>| {
                *seen.lock().unwrap() = Some((*c).clone());
            })
            .into()])
        .with_config(sources)
    }

    fn problems(hive: &Hive) -> Vec<String> {
        match hive.validate() {
            Err(Error::Invalid { problems }) => problems.iter().map(|p| p.to_string()).collect(),
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn defaults_file_env_flags_in_increasing_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cellium.toml");
        std::fs::write(
            &file,
            "state-dir = \"/from/file\"\nmax-pods = 50\ndebug = false\n",
        )
        .unwrap();
        let seen = Arc::default();
        let sources = ConfigSources::new()
            .file(&file)
            .env_vars(
                "CELLIUM_",
                [
                    ("CELLIUM_MAX_PODS", "60"),
                    ("CELLIUM_POD_CIDR", "10.1.0.0/24,fd00::/64"),
                    ("UNRELATED", "x"),
                ],
            )
            .flag("max-pods", 70)
            .flag("debug", "true");
        let mut hive = hive_with(sources, Arc::clone(&seen));
        hive.populate().unwrap();
        let got = seen.lock().unwrap().clone().unwrap();
        assert_eq!(
            got,
            IpamConfig {
                pod_cidr: vec!["10.1.0.0/24".into(), "fd00::/64".into()],
                state_dir: "/from/file".into(),
                max_pods: 70,
                debug: true,
            }
        );
        let described = hive.describe();
        assert!(described.contains("max-pods = 70"), "{described}");
    }

    #[test]
    fn yaml_files_work_and_untouched_keys_keep_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cellium.yaml");
        std::fs::write(&file, "pod-cidr:\n  - 192.168.0.0/16\n").unwrap();
        let seen = Arc::default();
        let mut hive = hive_with(ConfigSources::new().file(&file), Arc::clone(&seen));
        hive.populate().unwrap();
        let got = seen.lock().unwrap().clone().unwrap();
        assert_eq!(got.pod_cidr, ["192.168.0.0/16"]);
        assert_eq!(got.max_pods, 110);
    }

    #[test]
    fn a_key_declared_twice_names_both_modules() {
        let hive = Hive::new([
            Module::new("ipam", "x").config::<IpamConfig>().into(),
            Module::new("cp", "x")
                .cell(Module::new("store", "x").config::<OtherConfig>())
                .into(),
        ]);
        let p = problems(&hive);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("config key `state-dir`"), "{}", p[0]);
        assert!(
            p[0].contains("of module `ipam`") && p[0].contains("of module `cp.store`"),
            "{}",
            p[0]
        );
    }

    #[test]
    fn unknown_keys_name_the_key_the_source_and_a_close_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "state-dirr = \"/x\"\n[ipam]\nmax-pods = 3\n").unwrap();
        let sources = ConfigSources::new()
            .file(&file)
            .env_vars(
                "CELLIUM_",
                [("CELLIUM_MAX_POD", "3"), ("CELLIUM_ZZZ_QQQ", "1")],
            )
            .flag("debugg", true);
        let p = problems(&hive_with(sources, Arc::default()));
        assert_eq!(p.len(), 5, "{p:#?}");
        let file_s = file.display().to_string();
        assert!(
            p[0].contains("unknown config key `ipam`")
                && p[0].contains("keys are flat: set `max-pods` at the top level"),
            "{}",
            p[0]
        );
        assert!(
            p[1].contains("unknown config key `state-dirr` in file `") && p[1].contains(&file_s),
            "{}",
            p[1]
        );
        assert!(
            p[1].contains("did you mean `state-dir` (section `"),
            "{}",
            p[1]
        );
        assert!(p[1].contains("of module `ipam`)?"), "{}", p[1]);
        assert!(
            p[2].contains("`max-pod` in environment variable `CELLIUM_MAX_POD`")
                && p[2].contains("did you mean `max-pods`"),
            "{}",
            p[2]
        );
        assert!(
            p[3].contains("`zzz-qqq` in environment variable `CELLIUM_ZZZ_QQQ`")
                && !p[3].contains("did you mean"),
            "{}",
            p[3]
        );
        assert!(
            p[4].contains("`debugg` in flag `--debugg`") && p[4].contains("did you mean `debug`"),
            "{}",
            p[4]
        );
    }

    #[test]
    fn bad_values_name_the_key_the_source_and_what_was_expected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "max-pods = \"many\"\n").unwrap();
        let sources = ConfigSources::new()
            .file(&file)
            .env_vars("CELLIUM_", [("CELLIUM_DEBUG", "maybe")])
            .flag("start-timeout", "soon");
        let p = problems(&hive_with(sources, Arc::default()));
        assert_eq!(p.len(), 3, "{p:#?}");
        let all = p.join("\n");
        assert!(
            all.contains("invalid value for config key `max-pods` from file `"),
            "{all}"
        );
        assert!(all.contains("expected u16"), "{all}");
        assert!(all.contains("(the value was \"many\")"), "{all}");
        assert!(
            all.contains(
                "invalid value for config key `debug` from environment variable `CELLIUM_DEBUG`"
            ),
            "{all}"
        );
        assert!(all.contains("expected a boolean"), "{all}");
        assert!(
            all.contains(
                "invalid value for config key `start-timeout` from flag `--start-timeout`"
            ),
            "{all}"
        );
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let p = problems(&hive_with(
            ConfigSources::new().file("/nonexistent/cellium.toml"),
            Arc::default(),
        ));
        assert!(
            p[0].contains("file `/nonexistent/cellium.toml` cannot be read"),
            "{}",
            p[0]
        );
    }

    #[test]
    fn the_hive_section_has_humantime_timeouts() {
        let mut hive = Hive::new([]);
        assert_eq!(hive.hive_config().start_timeout, Duration::from_secs(300));
        assert_eq!(hive.hive_config().stop_timeout, Duration::from_secs(60));
        let mut hive2 = Hive::new([]).with_config(
            ConfigSources::new()
                .flag("start-timeout", "10s")
                .env_vars("C_", [("C_STOP_TIMEOUT", "1m 30s")]),
        );
        hive.populate().unwrap();
        hive2.populate().unwrap();
        assert_eq!(hive2.hive_config().start_timeout, Duration::from_secs(10));
        assert_eq!(hive2.hive_config().stop_timeout, Duration::from_secs(90));
        assert!(
            hive.describe().contains("start-timeout = \"5m\""),
            "{}",
            hive.describe()
        );
    }

    #[test]
    fn option_fields_are_declared_keys() {
        #[derive(Default, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        struct Opt {
            node_name: Option<String>,
            mtu: Option<u32>,
        }
        type Seen = Option<(Option<String>, Option<u32>)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let s = seen.clone();
        let mut hive = Hive::new([Module::new("node", "x")
            .config::<Opt>()
            .invoke(move |c: Config<Opt>| {
                *s.lock().unwrap() = Some((c.node_name.clone(), c.mtu));
            })
            .into()])
        .with_config(ConfigSources::new().env_vars("X_", [("X_MTU", "1450")]));
        hive.populate().unwrap();
        assert_eq!(*seen.lock().unwrap(), Some((None, Some(1450))));
    }

    /// Reads the real process environment in a child process, since setting
    /// variables in this multi-threaded test process is unsound.
    #[test]
    fn the_process_environment_is_read() {
        if std::env::var("HIVE_ENV_CHILD").is_ok() {
            let seen: Arc<Mutex<Option<IpamConfig>>> = Arc::default();
            let mut hive = hive_with(ConfigSources::new().env("HIVECHILD_"), Arc::clone(&seen));
            hive.populate().unwrap();
            let got = seen.lock().unwrap().clone().unwrap();
            assert_eq!(got.pod_cidr, ["10.0.0.0/24", "fd00::/64"]);
            assert_eq!(got.max_pods, 12);
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "config::load::tests::the_process_environment_is_read",
                "--nocapture",
            ])
            .env("HIVE_ENV_CHILD", "1")
            .env("HIVECHILD_POD_CIDR", "10.0.0.0/24,fd00::/64")
            .env("HIVECHILD_MAX_PODS", "12")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("1 passed"), "{stdout}");
    }
}

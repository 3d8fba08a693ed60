//! Where config values come from: files, the environment, flags.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Toml, Yaml};
use figment::value::{Dict, Value};
use serde::Serialize;

use crate::error::Problem;

/// The sources of configuration, in increasing precedence: files (in the order
/// given), config directories (in the order given), the environment, flags. Defaults
/// come from each section's `Default`.
///
/// ```
/// use cellium_hive::ConfigSources;
/// let sources = ConfigSources::new()
///     .env("CELLIUM_")                  // CELLIUM_STATE_DIR -> state-dir
///     .flag("state-dir", "/run/cellium"); // wins over everything else
/// ```
#[derive(Clone, Debug, Default)]
pub struct ConfigSources {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    env: Option<EnvSource>,
    flags: Vec<(String, Result<Value, String>)>,
}

#[derive(Clone, Debug)]
enum EnvSource {
    /// Read the process environment when the hive validates.
    Process { prefix: String },
    /// A snapshot given by the caller.
    Vars {
        prefix: String,
        vars: Vec<(String, String)>,
    },
}

/// A value as read from one source, before it meets its field.
pub(crate) enum RawValue {
    /// Parsed by the file format or serialized from a flag.
    Typed(Value),
    /// A string from the environment or a flag, converted using the field's
    /// default (split on commas for a list).
    Text(String),
}

/// One key set by one source.
pub(crate) struct RawEntry {
    pub(crate) key: String,
    /// `file `/etc/cellium.toml``, `environment variable `CELLIUM_X``, `flag `--x``.
    pub(crate) origin: String,
    pub(crate) value: RawValue,
}

impl ConfigSources {
    /// No sources: every section keeps its defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a config file: TOML for `.toml`, YAML for `.yaml`/`.yml`. Keys are flat
    /// at the top level (`state-dir = "/x"`). A missing file is an error.
    pub fn file(mut self, path: impl Into<PathBuf>) -> Self {
        self.files.push(path.into());
        self
    }

    /// Adds a config directory, Cilium's `--config-dir` layout: each file is one key, its
    /// name the key and its content the value, read as an environment value is (`a,b` for
    /// a list). This is what a ConfigMap mounted as a volume gives: one key can be set or
    /// patched alone. Names starting with `.` (the mount's own `..data` links) are skipped.
    /// A missing directory is an error.
    pub fn dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.dirs.push(path.into());
        self
    }

    /// Reads environment variables starting with `prefix` (`"CELLIUM_"`): the
    /// rest, lowercased with `_` turned into `-`, is the key (`CELLIUM_STATE_DIR`
    /// sets `state-dir`). Every such variable must name a declared key. List
    /// values are comma-separated (see the [`config`](crate::config) module).
    pub fn env(mut self, prefix: &str) -> Self {
        self.env = Some(EnvSource::Process {
            prefix: prefix.to_string(),
        });
        self
    }

    /// As [`env`](Self::env), from the given variables instead of the process
    /// environment (tests, or an environment captured earlier).
    pub fn env_vars<K, V>(mut self, prefix: &str, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.env = Some(EnvSource::Vars {
            prefix: prefix.to_string(),
            vars: vars
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        });
        self
    }

    /// Sets a key with the highest precedence, as a command-line flag does. A
    /// string value is read as an environment value is (`"a,b"` for a list).
    pub fn flag(mut self, key: &str, value: impl Serialize) -> Self {
        let value = Value::serialize(value).map_err(|e| e.kind.to_string());
        self.flags.push((key.to_string(), value));
        self
    }

    /// Reads every source, lowest precedence first.
    pub(crate) fn read(&self, problems: &mut Vec<Problem>) -> Vec<RawEntry> {
        let mut entries = Vec::new();
        for path in &self.files {
            match read_file(path) {
                Ok(dict) => {
                    let origin = format!("file `{}`", path.display());
                    entries.extend(dict.into_iter().map(|(key, v)| RawEntry {
                        key,
                        origin: origin.clone(),
                        value: RawValue::Typed(v),
                    }));
                }
                Err(reason) => problems.push(Problem::ConfigSource {
                    source_name: format!("file `{}`", path.display()),
                    reason,
                }),
            }
        }
        for path in &self.dirs {
            match read_dir(path) {
                Ok(found) => entries.extend(found),
                Err(reason) => problems.push(Problem::ConfigSource {
                    source_name: format!("directory `{}`", path.display()),
                    reason,
                }),
            }
        }
        match &self.env {
            None => {}
            Some(EnvSource::Process { prefix }) => {
                let mut vars = Vec::new();
                for (k, v) in std::env::vars_os() {
                    let Some(k) = k.to_str().filter(|k| k.starts_with(prefix.as_str())) else {
                        continue;
                    };
                    match v.into_string() {
                        Ok(v) => vars.push((k.to_string(), v)),
                        Err(_) => problems.push(Problem::ConfigSource {
                            source_name: format!("environment variable `{k}`"),
                            reason: "its value is not UTF-8".into(),
                        }),
                    }
                }
                env_entries(prefix, &vars, &mut entries);
            }
            Some(EnvSource::Vars { prefix, vars }) => env_entries(prefix, vars, &mut entries),
        }
        for (key, value) in &self.flags {
            let origin = format!("flag `--{key}`");
            match value {
                // Command lines give strings: read them as the environment's.
                Ok(Value::String(_, s)) => entries.push(RawEntry {
                    key: key.clone(),
                    origin,
                    value: RawValue::Text(s.clone()),
                }),
                Ok(v) => entries.push(RawEntry {
                    key: key.clone(),
                    origin,
                    value: RawValue::Typed(v.clone()),
                }),
                Err(reason) => problems.push(Problem::ConfigSource {
                    source_name: origin,
                    reason: format!("its value does not serialize: {reason}"),
                }),
            }
        }
        entries
    }
}

fn env_entries(prefix: &str, vars: &[(String, String)], entries: &mut Vec<RawEntry>) {
    let mut vars: Vec<&(String, String)> = vars
        .iter()
        .filter(|(k, _)| !prefix.is_empty() && k.starts_with(prefix) && k.len() > prefix.len())
        .collect();
    // The process environment has no order; sort so errors come in a stable one.
    vars.sort();
    for (name, value) in vars {
        entries.push(RawEntry {
            key: name[prefix.len()..].to_ascii_lowercase().replace('_', "-"),
            origin: format!("environment variable `{name}`"),
            value: RawValue::Text(value.clone()),
        });
    }
}

fn read_file(path: &Path) -> Result<Dict, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("toml") => Toml::from_str::<Dict>(&text).map_err(|e| e.to_string()),
        Some("yaml") | Some("yml") => {
            if text.trim().is_empty() {
                return Ok(Dict::new());
            }
            Yaml::from_str::<Dict>(&text).map_err(|e| e.to_string())
        }
        _ => Err("unknown format: the name must end in .toml, .yaml or .yml".into()),
    }
}

/// The keys of a config directory, in name order so that errors come in a stable one.
fn read_dir(path: &Path) -> Result<Vec<RawEntry>, String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| !n.starts_with('.')) else {
            continue;
        };
        // A ConfigMap's keys are symbolic links to files: follow them.
        if entry.path().is_file() {
            names.push(name.to_string());
        }
    }
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let file = path.join(&name);
            let text = std::fs::read_to_string(&file).map_err(|e| format!("`{name}`: {e}"))?;
            Ok(RawEntry {
                key: name,
                origin: format!("file `{}`", file.display()),
                value: RawValue::Text(text),
            })
        })
        .collect()
}

/// Converts an environment string for a field whose default is `default`.
pub(crate) fn env_value(raw: &str, default: Option<&Value>) -> Value {
    let trimmed = raw.trim();
    if (trimmed.starts_with('[') || trimmed.starts_with('{'))
        && let Ok(v @ (Value::Array(..) | Value::Dict(..))) = trimmed.parse::<Value>()
    {
        return v;
    }
    match default {
        Some(Value::Array(..)) => Value::from(
            trimmed
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::from(s.to_string()))
                .collect::<Vec<Value>>(),
        ),
        _ => Value::from(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lists_split_on_commas() {
        let list = Value::from(Vec::<Value>::new());
        let v = env_value("10.0.0.0/24, fd00::/64", Some(&list));
        let items: Vec<String> = v
            .into_array()
            .unwrap()
            .into_iter()
            .map(|v| v.into_string().unwrap())
            .collect();
        assert_eq!(items, ["10.0.0.0/24", "fd00::/64"]);
        assert!(env_value("", Some(&list)).into_array().unwrap().is_empty());
        let bracketed = env_value("[1, 2]", Some(&list)).into_array().unwrap();
        assert_eq!(bracketed.len(), 2);
        let scalar = env_value("a,b", Some(&Value::from("x".to_string())));
        assert_eq!(scalar.into_string().unwrap(), "a,b");
    }

    #[test]
    fn env_keys_are_kebab_case_and_sorted() {
        let mut entries = Vec::new();
        let vars = vec![
            ("X_STATE_DIR".to_string(), "/a".to_string()),
            ("X_DEBUG".to_string(), "true".to_string()),
            ("OTHER".to_string(), "1".to_string()),
            ("X_".to_string(), "1".to_string()),
        ];
        env_entries("X_", &vars, &mut entries);
        let keys: Vec<_> = entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["debug", "state-dir"]);
        assert_eq!(entries[1].origin, "environment variable `X_STATE_DIR`");
    }

    #[test]
    fn files_by_extension_and_missing_files_are_problems() {
        let dir = tempfile::tempdir().unwrap();
        let toml = dir.path().join("c.toml");
        std::fs::write(&toml, "state-dir = \"/x\"\n").unwrap();
        let yaml = dir.path().join("c.yml");
        std::fs::write(&yaml, "debug: true\n").unwrap();
        let ini = dir.path().join("c.ini");
        std::fs::write(&ini, "x=1").unwrap();
        let missing = dir.path().join("missing.toml");
        let mut problems = Vec::new();
        let entries = ConfigSources::new()
            .file(&toml)
            .file(&yaml)
            .file(&ini)
            .file(&missing)
            .flag("port", 80)
            .read(&mut problems);
        let keys: Vec<_> = entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["state-dir", "debug", "port"]);
        assert_eq!(entries[2].origin, "flag `--port`");
        assert_eq!(problems.len(), 2);
        let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert!(
            text[0].contains("c.ini") && text[0].contains(".toml, .yaml or .yml"),
            "{text:?}"
        );
        assert!(text[1].contains("missing.toml"), "{text:?}");
    }

    #[test]
    fn a_directory_gives_one_key_per_file_after_files_and_before_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, "mtu: 1500\n").unwrap();
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        std::fs::write(keys.join("mtu"), "1450\n").unwrap();
        std::fs::write(keys.join("pod-cidr"), "10.0.0.0/24,fd00::/64").unwrap();
        // What a ConfigMap volume holds beside its keys.
        std::fs::create_dir(keys.join("..2026_11_28")).unwrap();
        std::fs::write(keys.join(".hidden"), "x").unwrap();
        let mut problems = Vec::new();
        let entries = ConfigSources::new()
            .file(&file)
            .dir(&keys)
            .dir(dir.path().join("missing"))
            .env_vars("X_", [("X_MTU", "9000")])
            .read(&mut problems);
        let got: Vec<_> = entries
            .iter()
            .map(|e| match &e.value {
                RawValue::Text(t) => format!("{}={}", e.key, t.trim()),
                RawValue::Typed(v) => format!("{}={v:?}", e.key),
            })
            .collect();
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got[0].starts_with("mtu="), "{got:?}");
        assert_eq!(
            got[1..],
            ["mtu=1450", "pod-cidr=10.0.0.0/24,fd00::/64", "mtu=9000"]
        );
        assert!(
            entries[1].origin.ends_with("keys/mtu`"),
            "{}",
            entries[1].origin
        );
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].to_string().contains("missing"),
            "{}",
            problems[0]
        );
    }
}

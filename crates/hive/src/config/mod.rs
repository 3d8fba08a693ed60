//! Typed configuration sections with flat, global keys.
//!
//! A module owns a section with [`Module::config`](crate::Module::config): a struct
//! with `Default`, `Serialize` and `Deserialize`, by convention
//! `#[serde(rename_all = "kebab-case")]`. Its field names are **flat, global keys**,
//! as Cilium's flags: `state-dir` is the same key in a file (`state-dir = "/x"`),
//! in the environment (`CELLIUM_STATE_DIR`) and as a flag (`--state-dir`).
//!
//! Precedence: defaults (`T::default()`) < files (in the order given) <
//! environment < flags. Validation reports every problem at once: a key declared
//! by two sections (naming both modules), a key set in a source that no section
//! declares (naming the key, its source and a close declared key), and a value
//! that does not fit (naming the key, its source and what was expected).
//!
//! # Values from the environment
//! Environment values are strings, converted to the field's type when the
//! section is read (`"true"`, `"8080"`, `"5m"` for a humantime duration). For a
//! list field (its default serializes as a list), the value is split on commas:
//! `CELLIUM_POD_CIDR=10.0.0.0/24,fd00::/64` gives two items, and an empty value
//! an empty list; a value starting with `[` is read as a bracketed list
//! (`[1, 2]`) instead. Map fields take `{key = value}` syntax. An `Option` of a
//! list has no list default, so only the bracketed form gives a list there.
//!
//! # Trap
//! Every field must serialize in `T::default()`: a field skipped with
//! `skip_serializing_if` is not declared, so setting it is an "unknown key".

mod load;
mod sources;

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
use figment::value::{Dict, Value};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::module::ValueBox;
use crate::typename::TypeKey;

pub(crate) use load::{LoadedConfig, SectionRef, load};
pub use sources::ConfigSources;

/// A config section: implemented for every `Serialize + DeserializeOwned +
/// Default + Send + Sync + 'static` type.
pub trait ConfigSection: Serialize + DeserializeOwned + Default + Send + Sync + 'static {}

impl<T: Serialize + DeserializeOwned + Default + Send + Sync + 'static> ConfigSection for T {}

/// A loaded config section, as a constructor parameter. Cheap to clone.
pub struct Config<T>(Arc<T>);

impl<T> Config<T> {
    /// Wraps a value, for tests and hand-wired code; the hive loads sections itself.
    pub fn new(value: T) -> Config<T> {
        Config(Arc::new(value))
    }
}

impl<T> Clone for Config<T> {
    fn clone(&self) -> Self {
        Config(self.0.clone())
    }
}

impl<T> Deref for Config<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: fmt::Debug> fmt::Debug for Config<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The hive's own section, owned by the hive itself (shown as module `hive`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HiveConfig {
    /// How long each start hook may take (`start-timeout`, default `5m`).
    #[serde(with = "humantime_serde")]
    pub start_timeout: Duration,
    /// How long each stop hook may take (`stop-timeout`, default `1m`).
    #[serde(with = "humantime_serde")]
    pub stop_timeout: Duration,
}

impl Default for HiveConfig {
    fn default() -> Self {
        HiveConfig {
            start_timeout: Duration::from_secs(5 * 60),
            stop_timeout: Duration::from_secs(60),
        }
    }
}

/// A section read from the sources: the `Config<T>` for the store and its values
/// rendered for `describe`.
pub(crate) struct LoadedSection {
    pub(crate) value: ValueBox,
    pub(crate) rendered: Vec<(String, String)>,
}

/// A section type, erased: what validation and loading need to know about `T`.
pub(crate) struct SectionDecl {
    pub(crate) ty: TypeKey,
    pub(crate) defaults: fn() -> Result<Dict, String>,
    pub(crate) load: fn(&Figment) -> Result<LoadedSection, Box<figment::Error>>,
}

impl SectionDecl {
    pub(crate) fn of<T: ConfigSection>() -> SectionDecl {
        SectionDecl {
            ty: TypeKey::of::<T>(),
            defaults: defaults_of::<T>,
            load: load_section::<T>,
        }
    }
}

fn defaults_of<T: ConfigSection>() -> Result<Dict, String> {
    match Value::serialize(T::default()) {
        Ok(Value::Dict(_, dict)) => Ok(dict),
        Ok(other) => Err(format!(
            "its default serializes to {}, not to a struct of keys",
            other.to_actual()
        )),
        Err(e) => Err(format!("its default does not serialize: {}", e.kind)),
    }
}

fn load_section<T: ConfigSection>(figment: &Figment) -> Result<LoadedSection, Box<figment::Error>> {
    let value: T = figment.extract_lossy().map_err(Box::new)?;
    let rendered = match serde_json::to_value(&value) {
        Ok(serde_json::Value::Object(map)) => {
            map.into_iter().map(|(k, v)| (k, v.to_string())).collect()
        }
        _ => Vec::new(),
    };
    let config = Config::new(value);
    Ok(LoadedSection {
        value: Box::new(config),
        rendered,
    })
}

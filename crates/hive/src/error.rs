//! The hive's errors.
//!
//! Two shapes: [`Error::Invalid`] gathers every [`Problem`] found before anything
//! runs (graph, config, ids), so a user fixes them all in one go; the other variants
//! are run-time failures of one constructor, invoke or hook, with the cause as their
//! `source` (print the chain with `{:#}` in anyhow, or walk `source()`).

use std::fmt;
use std::time::Duration;

/// A boxed error, as returned by hooks, jobs and constructors that fail.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The hive's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of the hive.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Validation found problems; nothing was constructed or run.
    #[error("the hive is invalid, {} problem(s):{}", .problems.len(), list_suffix(.problems))]
    Invalid {
        /// Every problem found, in a stable order.
        problems: Vec<Problem>,
    },

    /// A constructor returned an error during populate.
    #[error("constructor `{ctor}` of `{output}` in module `{module}` failed")]
    Construct {
        /// The constructor's function name.
        ctor: String,
        /// The type it provides.
        output: String,
        /// The full id of its module.
        module: String,
        /// What the constructor returned.
        #[source]
        source: BoxError,
    },

    /// A decorator returned an error during populate.
    #[error("decorator `{decorator}` of `{target}` in module `{module}` failed")]
    Decorate {
        /// The decorator's function name.
        decorator: String,
        /// The decorated type.
        target: String,
        /// The full id of its module.
        module: String,
        /// What the decorator returned.
        #[source]
        source: BoxError,
    },

    /// An invoke function returned an error during populate.
    #[error("invoke `{invoke}` in module `{module}` failed")]
    Invoke {
        /// The invoke's function name.
        invoke: String,
        /// The full id of its module.
        module: String,
        /// What the function returned.
        #[source]
        source: BoxError,
    },

    /// A start hook failed; the hooks started before it were stopped again.
    #[error("start hook `{hook}` of module `{module}` failed{}", rollback_suffix(.rollback))]
    StartHook {
        /// The hook's name.
        hook: String,
        /// The full id of the module that appended it.
        module: String,
        /// Stop hooks that also failed while undoing the start.
        rollback: Vec<HookFailure>,
        /// What the hook returned.
        #[source]
        source: BoxError,
    },

    /// A start hook did not finish within `start-timeout`: its context was
    /// cancelled, it had a grace period to return, and the hooks started before
    /// it (itself too, if it finished within the grace period) were stopped again.
    #[error(
        "start hook `{hook}` of module `{module}` timed out after {}{}{}",
        humantime_serde::re::humantime::format_duration(*.timeout),
        abandoned_suffix(*.abandoned),
        rollback_suffix(.rollback)
    )]
    StartTimeout {
        /// The hook's name.
        hook: String,
        /// The full id of the module that appended it.
        module: String,
        /// The `start-timeout` in force.
        timeout: Duration,
        /// Whether the hook ignored its cancellation and did not return within
        /// the grace period (its future was dropped where it stood).
        abandoned: bool,
        /// Stop hooks that also failed while undoing the start.
        rollback: Vec<HookFailure>,
        /// What the hook returned once cancelled, if it returned an error.
        #[source]
        source: Option<BoxError>,
    },

    /// One or more stop hooks failed or timed out; all of them were run.
    #[error("{} stop hook(s) failed:{}", .failures.len(), list_suffix(.failures))]
    Stop {
        /// Every failure, in stop order.
        failures: Vec<HookFailure>,
    },

    /// A cell asked the hive to shut down with an error (through a
    /// [`Shutdowner`](crate::Shutdowner) or a job marked `shutdown_on_error`).
    #[error("shutdown requested with an error{}", stop_suffix(.stop))]
    Shutdown {
        /// Stop hooks that failed during the shutdown that followed.
        stop: Vec<HookFailure>,
        /// The error given to the shutdowner.
        #[source]
        source: BoxError,
    },

    /// An invariant of the hive itself was broken; this is a bug in the hive.
    #[error("internal error of the hive: {what}")]
    Internal {
        /// What went wrong.
        what: String,
    },

    /// The operation is not possible in the hive's current state.
    #[error("cannot {operation}: the hive {state}")]
    State {
        /// What was asked (`start`, `populate`, ...).
        operation: &'static str,
        /// Where the hive is (`is already started`, `failed to populate`, ...).
        state: &'static str,
    },
}

/// A job that failed for good; given to the shutdowner by a one-shot job marked
/// `shutdown_on_error`.
#[derive(Debug, thiserror::Error)]
#[error("job `{job}` of module `{module}` failed")]
pub struct JobError {
    /// The job's name.
    pub job: String,
    /// The full id of its module.
    pub module: String,
    /// The job's last error.
    #[source]
    pub source: BoxError,
}

/// A hook that failed or timed out while stopping.
#[derive(Debug)]
pub struct HookFailure {
    /// The hook's name.
    pub hook: String,
    /// The full id of the module that appended it.
    pub module: String,
    /// What went wrong (the error's message, or the timeout).
    pub cause: String,
}

impl fmt::Display for HookFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stop hook `{}` of module `{}`: {}",
            self.hook, self.module, self.cause
        )
    }
}

/// One thing wrong with the declared cells or the configuration, found before
/// anything runs. Each names the types, modules and keys involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A module id does not match `[a-z][a-z0-9-]*` or is longer than 30 characters.
    #[error("invalid module id `{id}`{}: {reason}", parent_suffix(.parent))]
    InvalidModuleId {
        /// The id as declared.
        id: String,
        /// The full id of the enclosing module, if any.
        parent: Option<String>,
        /// Why it is invalid.
        reason: String,
    },

    /// Two modules have the same full id.
    #[error("module id `{id}` is declared twice")]
    DuplicateModule {
        /// The full id.
        id: String,
    },

    /// A job name does not match `[a-z][a-z0-9-]*` or is longer than 30 characters.
    #[error("invalid job name `{name}` in module `{module}`: {reason}")]
    InvalidJobName {
        /// The name as given.
        name: String,
        /// The full id of the module adding the job.
        module: String,
        /// Why it is invalid.
        reason: String,
    },

    /// A job name is already used by a running job or a sub-module of the module.
    #[error("job name `{name}` is used twice in module `{module}`")]
    DuplicateJobName {
        /// The name as given.
        name: String,
        /// The full id of the module adding the job.
        module: String,
    },

    /// A required dependency has no visible provider.
    #[error("missing provider: `{needed}` needed by `{consumer}` in module `{module}`; path: {path}{}", hint_suffix(.hint))]
    MissingProvider {
        /// The dependency as written (`Arc<cellium_ipam::Ipam>`).
        needed: String,
        /// The function that needs it.
        consumer: String,
        /// The full id of the consumer's module.
        module: String,
        /// From the invoke that drives construction down to the missing type.
        path: String,
        /// A "did you mean" or a note on how to fix it.
        hint: Option<String>,
    },

    /// A `Config<T>` is needed but no module declares the section `T`.
    #[error("missing config section: `{needed}` needed by `{consumer}` in module `{module}`, but no module declares `.config::<{section}>()`; path: {path}{}", hint_suffix(.hint))]
    MissingConfig {
        /// The dependency as written (`Config<cellium_ipam::IpamConfig>`).
        needed: String,
        /// The section type.
        section: String,
        /// The function that needs it.
        consumer: String,
        /// The full id of the consumer's module.
        module: String,
        /// From the invoke that drives construction down to the missing section.
        path: String,
        /// A "did you mean", if a similar section exists.
        hint: Option<String>,
    },

    /// A type is provided twice where one consumer could see both.
    #[error(
        "duplicate provider: `{ty}` is provided by `{first}` in module `{first_module}` and by `{second}` in module `{second_module}`"
    )]
    DuplicateProvider {
        /// The provided type.
        ty: String,
        /// The first constructor.
        first: String,
        /// The first constructor's module.
        first_module: String,
        /// The second constructor.
        second: String,
        /// The second constructor's module.
        second_module: String,
    },

    /// One type is both provided and contributed to a value group.
    #[error(
        "`{ty}` is provided by `{provider}` in module `{provider_module}` and also contributed to a value group by `{contributor}` in module `{contributor_module}`; use either provide or contribute for one type"
    )]
    ProvideAndContribute {
        /// The type.
        ty: String,
        /// The providing constructor.
        provider: String,
        /// Its module.
        provider_module: String,
        /// The contributing constructor.
        contributor: String,
        /// Its module.
        contributor_module: String,
    },

    /// A private type is needed outside the module that provides it.
    #[error(
        "`{ty}` is private to module `{provider_module}` (provided by `{provider}` with provide_private) but is needed by `{consumer}` in module `{module}`; path: {path}"
    )]
    PrivateType {
        /// The dependency as written.
        ty: String,
        /// The private constructor.
        provider: String,
        /// Its module.
        provider_module: String,
        /// The function that needs it.
        consumer: String,
        /// The consumer's module.
        module: String,
        /// From the invoke down to the type.
        path: String,
    },

    /// A dependency asks for a value group of a provided type, or for a single
    /// value of a value group.
    #[error(
        "`{needed}` needed by `{consumer}` in module `{module}` does not match how it is declared: {note}"
    )]
    WrongKind {
        /// The dependency as written.
        needed: String,
        /// The function that needs it.
        consumer: String,
        /// The consumer's module.
        module: String,
        /// How the type is actually declared and what to write instead.
        note: String,
    },

    /// Constructors depend on each other in a circle.
    #[error("dependency cycle: {cycle}")]
    Cycle {
        /// The whole cycle, `A (module a) -> B (module b) -> A (module a)`.
        cycle: String,
    },

    /// A config key is declared by two sections.
    #[error(
        "config key `{key}` is declared by section `{first_section}` of module `{first_module}` and by section `{second_section}` of module `{second_module}`"
    )]
    ConfigKeyClash {
        /// The key.
        key: String,
        /// The first section type.
        first_section: String,
        /// Its module.
        first_module: String,
        /// The second section type.
        second_section: String,
        /// Its module.
        second_module: String,
    },

    /// A config section type is declared by two modules.
    #[error(
        "config section `{section}` is declared by module `{first_module}` and by module `{second_module}`"
    )]
    DuplicateConfigSection {
        /// The section type.
        section: String,
        /// The first module.
        first_module: String,
        /// The second module.
        second_module: String,
    },

    /// A config section's default does not serialize to a map of keys.
    #[error("config section `{section}` of module `{module}` is not a struct of keys: {reason}")]
    BadConfigSection {
        /// The section type.
        section: String,
        /// Its module.
        module: String,
        /// What serializing its default gave.
        reason: String,
    },

    /// A config source could not be read.
    #[error("config {source_name} cannot be read: {reason}")]
    ConfigSource {
        /// The source (`file `/etc/cellium.toml``).
        source_name: String,
        /// Why.
        reason: String,
    },

    /// A key set in a source that no section declares.
    #[error("unknown config key `{key}` in {origin}{}", hint_suffix(.hint))]
    UnknownKey {
        /// The key.
        key: String,
        /// Where it was set (`file `/x.toml``, `environment variable `CELLIUM_X``, `flag `--x``).
        origin: String,
        /// A "did you mean" for a declared key.
        hint: Option<String>,
    },

    /// A key's value does not fit its field.
    #[error("invalid value for config key `{key}` from {origin}: {reason}{}", value_suffix(.value))]
    InvalidValue {
        /// The key.
        key: String,
        /// Where the value came from.
        origin: String,
        /// What was expected and what was found.
        reason: String,
        /// The value as it was read (JSON), when a source set it.
        value: Option<String>,
    },
}

fn list_suffix<T: fmt::Display>(items: &[T]) -> String {
    items.iter().map(|p| format!("\n  - {p}")).collect()
}

fn rollback_suffix(failures: &[HookFailure]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(
            "; undoing the start, {} stop hook(s) failed too:{}",
            failures.len(),
            list_suffix(failures)
        )
    }
}

fn abandoned_suffix(abandoned: bool) -> &'static str {
    if abandoned {
        " and did not return within its grace period once cancelled"
    } else {
        ""
    }
}

fn stop_suffix(failures: &[HookFailure]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(
            "; then {} stop hook(s) failed:{}",
            failures.len(),
            list_suffix(failures)
        )
    }
}

fn parent_suffix(parent: &Option<String>) -> String {
    parent
        .as_ref()
        .map(|p| format!(" in module `{p}`"))
        .unwrap_or_default()
}

fn value_suffix(value: &Option<String>) -> String {
    value
        .as_ref()
        .map(|v| format!(" (the value was {v})"))
        .unwrap_or_default()
}

fn hint_suffix(hint: &Option<String>) -> String {
    hint.as_ref().map(|h| format!("; {h}")).unwrap_or_default()
}

impl Error {
    /// The problems found by validation, if this is [`Error::Invalid`].
    pub fn problems(&self) -> &[Problem] {
        match self {
            Error::Invalid { problems } => problems,
            _ => &[],
        }
    }
}

/// Checks a module id or job name: `[a-z][a-z0-9-]*`, at most 30 characters.
pub(crate) fn check_name(name: &str) -> std::result::Result<(), String> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("it is empty".into()),
        Some(c) if !c.is_ascii_lowercase() => {
            return Err(format!(
                "it must start with a lowercase letter, not `{c}` (allowed: [a-z][a-z0-9-]*)"
            ));
        }
        Some(_) => {}
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
        return Err(format!("`{c}` is not allowed (allowed: [a-z][a-z0-9-]*)"));
    }
    if name.len() > 30 {
        return Err(format!(
            "it has {} characters, at most 30 are allowed",
            name.len()
        ));
    }
    Ok(())
}

/// An error and its sources on one line, `a: b: c`: what health messages, logs and gRPC
/// statuses show.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_is_one_line_of_every_source() {
        let io = std::io::Error::other("disk gone");
        assert_eq!(error_chain(&io), "disk gone");
        #[derive(Debug, thiserror::Error)]
        #[error("saving the record")]
        struct Saving(#[source] std::io::Error);
        assert_eq!(error_chain(&Saving(io)), "saving the record: disk gone");
    }

    #[test]
    fn names_follow_the_id_rule() {
        assert!(check_name("endpoint-manager").is_ok());
        assert!(check_name("a1").is_ok());
        assert!(check_name("").unwrap_err().contains("empty"));
        assert!(check_name("Ipam").unwrap_err().contains("`I`"));
        assert!(check_name("1pam").unwrap_err().contains("`1`"));
        assert!(check_name("ip_am").unwrap_err().contains("`_`"));
        assert!(check_name("ip.am").unwrap_err().contains("`.`"));
        let long = "a".repeat(31);
        assert!(check_name(&long).unwrap_err().contains("31 characters"));
        assert!(check_name(&"a".repeat(30)).is_ok());
    }

    #[test]
    fn invalid_lists_every_problem() {
        let err = Error::Invalid {
            problems: vec![
                Problem::DuplicateModule { id: "a".into() },
                Problem::Cycle {
                    cycle: "A -> B -> A".into(),
                },
            ],
        };
        let text = err.to_string();
        assert!(text.contains("2 problem(s)"), "{text}");
        assert!(
            text.contains("\n  - module id `a` is declared twice"),
            "{text}"
        );
        assert!(
            text.contains("\n  - dependency cycle: A -> B -> A"),
            "{text}"
        );
        assert_eq!(err.problems().len(), 2);
    }

    #[test]
    fn start_errors_name_hook_module_and_rollback_failures() {
        let err = Error::StartTimeout {
            hook: "restore".into(),
            module: "cp.ipam".into(),
            timeout: Duration::from_secs(300),
            abandoned: true,
            rollback: vec![HookFailure {
                hook: "close".into(),
                module: "cp.store".into(),
                cause: "disk gone".into(),
            }],
            source: None,
        };
        let text = err.to_string();
        assert!(
            text.contains("`restore` of module `cp.ipam` timed out after 5m and did not return within its grace period once cancelled"),
            "{text}"
        );
        assert!(
            text.contains("stop hook `close` of module `cp.store`: disk gone"),
            "{text}"
        );
    }
}

//! Readable type names for error messages, `describe` and `dot`.
//!
//! `std::any::type_name` spells the full path of every type
//! (`alloc::sync::Arc<cellium_ipam::Ipam>`); users think in the names they wrote
//! (`Arc<cellium_ipam::Ipam>`). We keep the crate paths of user types, because two
//! crates may well define an `Ipam` each, and drop the paths of the standard library
//! and of the hive's own types, which are unambiguous.

use std::any::TypeId;

/// Path prefixes whose types are shown by their last segment only.
const SHORTENED: &[&str] = &["alloc", "core", "std"];

/// The hive's own types that parameters name, shown without their path.
const HIVE_TYPES: &[&str] = &[
    "Config",
    "HiveConfig",
    "Lifecycle",
    "Jobs",
    "Reporter",
    "Health",
    "Shutdowner",
];

/// A type recorded at declaration: its identity and its `type_name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TypeKey {
    pub(crate) id: TypeId,
    pub(crate) name: &'static str,
}

impl TypeKey {
    pub(crate) fn of<T: ?Sized + 'static>() -> TypeKey {
        TypeKey {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }

    /// The prettified name of the type itself (`cellium_ipam::Ipam`).
    pub(crate) fn pretty(&self) -> String {
        prettify(self.name)
    }
}

/// Shortens the standard library's and the hive's paths in a `type_name`.
pub(crate) fn prettify(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut path = String::new();
    let flush = |path: &mut String, out: &mut String| {
        if path.is_empty() {
            return;
        }
        let first = path.split("::").next().unwrap_or_default();
        let last = path.rsplit("::").next().unwrap_or(path);
        let hive_type = first == "cellium_hive" && HIVE_TYPES.contains(&last);
        if hive_type || (SHORTENED.contains(&first) && !path.ends_with("}}")) {
            out.push_str(last);
        } else {
            out.push_str(path);
        }
        path.clear();
    };
    let chars: Vec<char> = name.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            path.push(c);
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            path.push_str("::");
            i += 1;
        } else if c == '{' && path.ends_with("::") {
            // `{{closure}}` and `{{constant}}` are segments of the path they end.
            let end = chars[i..]
                .iter()
                .position(|&c| c == '}')
                .map(|p| i + p)
                .unwrap_or(chars.len() - 1);
            let mut end = end;
            while chars.get(end + 1) == Some(&'}') {
                end += 1;
            }
            path.extend(&chars[i..=end]);
            i = end;
        } else {
            flush(&mut path, &mut out);
            out.push(c);
        }
        i += 1;
    }
    flush(&mut path, &mut out);
    out
}

/// The last path segment of the innermost type: `Ipam` for `Arc<cellium_ipam::Ipam>`.
/// Used to suggest a type of the same name from another crate.
pub(crate) fn last_segment(pretty: &str) -> &str {
    let inner = pretty
        .trim_end_matches('>')
        .rsplit('<')
        .next()
        .unwrap_or(pretty);
    inner.rsplit("::").next().unwrap_or(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Local;
    trait Service {}

    #[test]
    fn standard_paths_are_shortened_and_user_paths_kept() {
        let name = std::any::type_name::<Arc<Local>>();
        assert_eq!(prettify(name), "Arc<cellium_hive::typename::tests::Local>");
        assert_eq!(
            prettify("alloc::sync::Arc<cellium_ipam::Ipam>"),
            "Arc<cellium_ipam::Ipam>"
        );
        assert_eq!(
            prettify("core::option::Option<alloc::sync::Arc<dyn my_crate::Service>>"),
            "Option<Arc<dyn my_crate::Service>>"
        );
        assert_eq!(
            prettify("alloc::vec::Vec<alloc::sync::Arc<a::B<c::D, 3>>>"),
            "Vec<Arc<a::B<c::D, 3>>>"
        );
        assert_eq!(
            prettify("agent::main::{{closure}}"),
            "agent::main::{{closure}}"
        );
        let dynamic = prettify(std::any::type_name::<Arc<dyn Service>>());
        assert!(dynamic.starts_with("Arc<dyn "), "{dynamic}");
    }

    #[test]
    fn last_segment_is_the_innermost_type_name() {
        assert_eq!(last_segment("Arc<cellium_ipam::Ipam>"), "Ipam");
        assert_eq!(last_segment("Vec<Arc<x::y::Z>>"), "Z");
        assert_eq!(last_segment("Plain"), "Plain");
    }
}

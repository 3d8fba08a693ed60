//! What a constructor, invoke or decorator may take as a parameter.
//!
//! Each parameter type says how it is resolved; the hive records these specs when
//! a module is declared, validates them before anything runs, and hands out the
//! values when it calls the function.

use std::any::Any;
use std::sync::Arc;

use crate::config::{Config, ConfigSection};
use crate::health::{Health, Reporter};
use crate::job::Jobs;
use crate::lifecycle::Lifecycle;
use crate::shutdown::Shutdowner;
use crate::typename::{TypeKey, prettify};

/// How a parameter is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepKind {
    /// `Arc<T>`: one provider must be visible.
    Required,
    /// `Option<Arc<T>>`: `None` when no provider is visible.
    Optional,
    /// `Vec<Arc<T>>`: every `contribute`d member, possibly none.
    Group,
    /// `Config<T>`: the section `T`, declared by some module.
    Config,
    /// `Lifecycle`, scoped to the consuming module.
    Lifecycle,
    /// `Jobs`, scoped to the consuming module.
    Jobs,
    /// `health::Reporter` for the consuming module's node.
    Reporter,
    /// `Health`, the whole tree.
    Health,
    /// `Shutdowner`.
    Shutdowner,
}

/// A parameter recorded at declaration: its kind and, for the typed kinds, `T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DepSpec {
    pub(crate) kind: DepKind,
    pub(crate) ty: Option<TypeKey>,
}

impl DepSpec {
    /// The parameter as a user writes it: `Arc<cellium_ipam::Ipam>`.
    pub(crate) fn display(&self) -> String {
        let inner = self.ty.map(|t| prettify(t.name)).unwrap_or_default();
        match self.kind {
            DepKind::Required => format!("Arc<{inner}>"),
            DepKind::Optional => format!("Option<Arc<{inner}>>"),
            DepKind::Group => format!("Vec<Arc<{inner}>>"),
            DepKind::Config => format!("Config<{inner}>"),
            DepKind::Lifecycle => "Lifecycle".into(),
            DepKind::Jobs => "Jobs".into(),
            DepKind::Reporter => "Reporter".into(),
            DepKind::Health => "Health".into(),
            DepKind::Shutdowner => "Shutdowner".into(),
        }
    }
}

/// A resolved parameter, borrowed from the hive's store while the function is
/// called.
pub enum Resolved<'a> {
    /// A stored `Arc<T>` (or `Config<T>`).
    Value(&'a (dyn Any + Send + Sync)),
    /// No visible provider, for an optional dependency.
    Absent,
    /// The members of a value group, in declaration order.
    Group(Vec<&'a (dyn Any + Send + Sync)>),
    /// A module-scoped lifecycle.
    Lifecycle(Lifecycle),
    /// A module-scoped job group.
    Jobs(Jobs),
    /// A module-scoped health reporter.
    Reporter(Reporter),
    /// The health tree.
    Health(Health),
    /// The shutdowner.
    Shutdowner(Shutdowner),
}

pub(crate) mod sealed {
    use super::{DepSpec, Resolved};

    /// Keeps the set of dependency kinds closed: the hive validates exactly these.
    pub trait Sealed: Sized {
        fn spec() -> DepSpec;
        fn from_resolved(r: Resolved<'_>) -> Option<Self>;
    }
}

/// A type a constructor, invoke or decorator can take as a parameter.
///
/// Implemented for exactly these:
///
/// | parameter | resolves to |
/// |---|---|
/// | `Arc<T>` | the one visible provider of `T` (an error at validation if none) |
/// | `Option<Arc<T>>` | the visible provider of `T`, or `None` |
/// | `Vec<Arc<T>>` | every member `contribute`d to the value group `T`, possibly none |
/// | [`Config<T>`] | the config section `T`, declared by some module with `.config::<T>()` |
/// | [`Lifecycle`], [`Jobs`], [`Reporter`] | handles scoped to the consuming module |
/// | [`Health`], [`Shutdowner`] | the hive's health tree and shutdowner |
pub trait Dependency: sealed::Sealed + Send + 'static {}

impl<T: ?Sized + Send + Sync + 'static> sealed::Sealed for Arc<T> {
    fn spec() -> DepSpec {
        DepSpec {
            kind: DepKind::Required,
            ty: Some(TypeKey::of::<T>()),
        }
    }
    fn from_resolved(r: Resolved<'_>) -> Option<Self> {
        match r {
            Resolved::Value(v) => v.downcast_ref::<Arc<T>>().cloned(),
            _ => None,
        }
    }
}
impl<T: ?Sized + Send + Sync + 'static> Dependency for Arc<T> {}

impl<T: ?Sized + Send + Sync + 'static> sealed::Sealed for Option<Arc<T>> {
    fn spec() -> DepSpec {
        DepSpec {
            kind: DepKind::Optional,
            ty: Some(TypeKey::of::<T>()),
        }
    }
    fn from_resolved(r: Resolved<'_>) -> Option<Self> {
        match r {
            Resolved::Value(v) => v.downcast_ref::<Arc<T>>().cloned().map(Some),
            Resolved::Absent => Some(None),
            _ => None,
        }
    }
}
impl<T: ?Sized + Send + Sync + 'static> Dependency for Option<Arc<T>> {}

impl<T: ?Sized + Send + Sync + 'static> sealed::Sealed for Vec<Arc<T>> {
    fn spec() -> DepSpec {
        DepSpec {
            kind: DepKind::Group,
            ty: Some(TypeKey::of::<T>()),
        }
    }
    fn from_resolved(r: Resolved<'_>) -> Option<Self> {
        match r {
            Resolved::Group(vs) => vs
                .into_iter()
                .map(|v| v.downcast_ref::<Arc<T>>().cloned())
                .collect(),
            _ => None,
        }
    }
}
impl<T: ?Sized + Send + Sync + 'static> Dependency for Vec<Arc<T>> {}

impl<T: ConfigSection> sealed::Sealed for Config<T> {
    fn spec() -> DepSpec {
        DepSpec {
            kind: DepKind::Config,
            ty: Some(TypeKey::of::<T>()),
        }
    }
    fn from_resolved(r: Resolved<'_>) -> Option<Self> {
        match r {
            Resolved::Value(v) => v.downcast_ref::<Config<T>>().cloned(),
            _ => None,
        }
    }
}
impl<T: ConfigSection> Dependency for Config<T> {}

macro_rules! builtin {
    ($ty:ident, $kind:ident) => {
        impl sealed::Sealed for $ty {
            fn spec() -> DepSpec {
                DepSpec {
                    kind: DepKind::$kind,
                    ty: None,
                }
            }
            fn from_resolved(r: Resolved<'_>) -> Option<Self> {
                match r {
                    Resolved::$kind(v) => Some(v),
                    _ => None,
                }
            }
        }
        impl Dependency for $ty {}
    };
}
builtin!(Lifecycle, Lifecycle);
builtin!(Jobs, Jobs);
builtin!(Reporter, Reporter);
builtin!(Health, Health);
builtin!(Shutdowner, Shutdowner);

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;

    trait Service: Send + Sync {}
    struct Impl;
    impl Service for Impl {}

    #[test]
    fn specs_display_as_written() {
        assert_eq!(<Arc<dyn Service>>::spec().kind, DepKind::Required);
        assert!(<Arc<dyn Service>>::spec().display().starts_with("Arc<dyn "));
        assert_eq!(
            <Option<Arc<String>>>::spec().display(),
            "Option<Arc<String>>"
        );
        assert_eq!(<Vec<Arc<u32>>>::spec().display(), "Vec<Arc<u32>>");
        assert_eq!(Lifecycle::spec().display(), "Lifecycle");
        assert_eq!(
            <Arc<u32>>::spec().ty,
            <Vec<Arc<u32>>>::spec().ty,
            "one key for a type, whatever the kind"
        );
    }

    #[test]
    fn values_resolve_by_downcast() {
        let stored: Box<dyn Any + Send + Sync> = Box::new(Arc::new(Impl) as Arc<dyn Service>);
        let got = <Arc<dyn Service>>::from_resolved(Resolved::Value(stored.as_ref()));
        assert!(got.is_some());
        let none = <Option<Arc<dyn Service>>>::from_resolved(Resolved::Absent);
        assert!(matches!(none, Some(None)));
        let wrong = <Arc<u32>>::from_resolved(Resolved::Value(stored.as_ref()));
        assert!(wrong.is_none());
        let group = <Vec<Arc<dyn Service>>>::from_resolved(Resolved::Group(vec![
            stored.as_ref(),
            stored.as_ref(),
        ]));
        assert_eq!(group.map(|g| g.len()), Some(2));
    }
}

//! The function traits: constructors, invokes and decorators.
//!
//! They are implemented, by a macro, for every `FnOnce` of 0 to 12 parameters
//! whose parameters are [`Dependency`] types, so plain functions such as
//! `fn new(cfg: Config<IpamConfig>, lc: Lifecycle) -> Result<Arc<Ipam>, Error>` and
//! closures with typed parameters can be given to `provide`, `invoke` and
//! `decorate`. The parameter list is recorded when the module is declared.

use std::sync::Arc;

use crate::dependency::sealed::Sealed;
use crate::dependency::{DepSpec, Dependency, Resolved};
use crate::error::BoxError;

/// Why calling a declared function did not give a value.
pub enum CallError {
    /// The hive could not produce parameter `index`; validation rules this out,
    /// so it is reported as an internal error.
    Dependency {
        /// The parameter's position.
        index: usize,
    },
    /// The function returned an error.
    Failed(BoxError),
}

/// What a constructor may return: `Arc<T>` or `Result<Arc<T>, E>`.
pub trait CtorOutput {
    /// The provided type `T` (may be unsized: `Arc<dyn Trait>` works).
    type Target: ?Sized + Send + Sync + 'static;
    #[doc(hidden)]
    fn into_result(self) -> Result<Arc<Self::Target>, BoxError>;
}

impl<T: ?Sized + Send + Sync + 'static> CtorOutput for Arc<T> {
    type Target = T;
    fn into_result(self) -> Result<Arc<T>, BoxError> {
        Ok(self)
    }
}

impl<T, E> CtorOutput for Result<Arc<T>, E>
where
    T: ?Sized + Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    type Target = T;
    fn into_result(self) -> Result<Arc<T>, BoxError> {
        self.map_err(|e| Box::new(e) as BoxError)
    }
}

/// What an invoke function may return: `()` or `Result<(), E>`.
pub trait InvokeOutput {
    #[doc(hidden)]
    fn into_result(self) -> Result<(), BoxError>;
}

impl InvokeOutput for () {
    fn into_result(self) -> Result<(), BoxError> {
        Ok(())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> InvokeOutput for Result<(), E> {
    fn into_result(self) -> Result<(), BoxError> {
        self.map_err(|e| Box::new(e) as BoxError)
    }
}

/// A function that provides an `Arc<T>` from its parameters.
///
/// Implemented for `FnOnce(A1, ..., An) -> R` with `n <= 12`, each `Ai` a
/// [`Dependency`] and `R` either `Arc<T>` or `Result<Arc<T>, E>`.
pub trait Constructor<Args>: Send + 'static {
    /// The provided type `T`.
    type Output: ?Sized + Send + Sync + 'static;
    #[doc(hidden)]
    fn inputs() -> Vec<DepSpec>;
    #[doc(hidden)]
    fn construct(self, deps: Vec<Resolved<'_>>) -> Result<Arc<Self::Output>, CallError>;
}

/// A function run at populate for its effect, after its parameters are built.
///
/// Implemented for `FnOnce(A1, ..., An) -> R` with `n <= 12`, each `Ai` a
/// [`Dependency`] and `R` either `()` or `Result<(), E>`.
pub trait Invoker<Args>: Send + 'static {
    #[doc(hidden)]
    fn inputs() -> Vec<DepSpec>;
    #[doc(hidden)]
    fn invoke(self, deps: Vec<Resolved<'_>>) -> Result<(), CallError>;
}

/// A function that wraps a provided `Arc<T>` for a sub-tree of cells.
///
/// Implemented for `FnOnce(Arc<T>, A1, ..., An) -> R` with `n <= 11`: the first
/// parameter is the original value, the others are dependencies, and `R` is
/// `Arc<T>` or `Result<Arc<T>, E>`.
pub trait Decorator<Args>: Send + 'static {
    /// The decorated type `T`.
    type Target: ?Sized + Send + Sync + 'static;
    #[doc(hidden)]
    fn inputs() -> Vec<DepSpec>;
    #[doc(hidden)]
    fn decorate(self, deps: Vec<Resolved<'_>>) -> Result<Arc<Self::Target>, CallError>;
}

fn next<'a, A: Dependency>(
    it: &mut impl Iterator<Item = (usize, Resolved<'a>)>,
) -> Result<A, CallError> {
    match it.next() {
        Some((index, r)) => A::from_resolved(r).ok_or(CallError::Dependency { index }),
        None => Err(CallError::Dependency { index: usize::MAX }),
    }
}

macro_rules! impl_fns {
    ($($A:ident),*) => {
        impl<F, R, $($A,)*> Constructor<($($A,)*)> for F
        where
            F: FnOnce($($A),*) -> R + Send + 'static,
            R: CtorOutput,
            $($A: Dependency,)*
        {
            type Output = R::Target;
            fn inputs() -> Vec<DepSpec> {
                vec![$(<$A as Sealed>::spec()),*]
            }
            #[allow(non_snake_case, unused_mut, unused_variables)]
            fn construct(self, deps: Vec<Resolved<'_>>) -> Result<Arc<R::Target>, CallError> {
                let mut it = deps.into_iter().enumerate();
                $(let $A = next::<$A>(&mut it)?;)*
                (self)($($A),*).into_result().map_err(CallError::Failed)
            }
        }

        impl<F, R, $($A,)*> Invoker<($($A,)*)> for F
        where
            F: FnOnce($($A),*) -> R + Send + 'static,
            R: InvokeOutput,
            $($A: Dependency,)*
        {
            fn inputs() -> Vec<DepSpec> {
                vec![$(<$A as Sealed>::spec()),*]
            }
            #[allow(non_snake_case, unused_mut, unused_variables)]
            fn invoke(self, deps: Vec<Resolved<'_>>) -> Result<(), CallError> {
                let mut it = deps.into_iter().enumerate();
                $(let $A = next::<$A>(&mut it)?;)*
                (self)($($A),*).into_result().map_err(CallError::Failed)
            }
        }
    };
}

macro_rules! impl_decorator {
    ($($A:ident),*) => {
        impl<F, T, R, $($A,)*> Decorator<(Arc<T>, $($A,)*)> for F
        where
            F: FnOnce(Arc<T>, $($A),*) -> R + Send + 'static,
            T: ?Sized + Send + Sync + 'static,
            R: CtorOutput<Target = T>,
            $($A: Dependency,)*
        {
            type Target = T;
            fn inputs() -> Vec<DepSpec> {
                vec![<Arc<T> as Sealed>::spec(), $(<$A as Sealed>::spec()),*]
            }
            #[allow(non_snake_case, unused_mut)]
            fn decorate(self, deps: Vec<Resolved<'_>>) -> Result<Arc<T>, CallError> {
                let mut it = deps.into_iter().enumerate();
                let original = next::<Arc<T>>(&mut it)?;
                $(let $A = next::<$A>(&mut it)?;)*
                (self)(original, $($A),*).into_result().map_err(CallError::Failed)
            }
        }
    };
}

impl_fns!();
impl_fns!(A1);
impl_fns!(A1, A2);
impl_fns!(A1, A2, A3);
impl_fns!(A1, A2, A3, A4);
impl_fns!(A1, A2, A3, A4, A5);
impl_fns!(A1, A2, A3, A4, A5, A6);
impl_fns!(A1, A2, A3, A4, A5, A6, A7);
impl_fns!(A1, A2, A3, A4, A5, A6, A7, A8);
impl_fns!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
impl_fns!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
impl_fns!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
impl_fns!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);

impl_decorator!();
impl_decorator!(A1);
impl_decorator!(A1, A2);
impl_decorator!(A1, A2, A3);
impl_decorator!(A1, A2, A3, A4);
impl_decorator!(A1, A2, A3, A4, A5);
impl_decorator!(A1, A2, A3, A4, A5, A6);
impl_decorator!(A1, A2, A3, A4, A5, A6, A7);
impl_decorator!(A1, A2, A3, A4, A5, A6, A7, A8);
impl_decorator!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
impl_decorator!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
impl_decorator!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{Health, Hive, Jobs, Lifecycle, Module, Reporter, Shutdowner};

    struct Wide(usize);
    struct P<const N: usize>;

    #[allow(clippy::too_many_arguments)]
    fn twelve(
        _a: Arc<P<1>>,
        _b: Arc<P<2>>,
        _c: Arc<P<3>>,
        _d: Option<Arc<P<4>>>,
        _e: Vec<Arc<P<5>>>,
        _f: Lifecycle,
        _g: Jobs,
        _h: Reporter,
        _i: Health,
        _j: Shutdowner,
        _k: Arc<P<1>>,
        _l: Arc<P<2>>,
    ) -> Arc<Wide> {
        Arc::new(Wide(12))
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot wrap")]
    struct CannotWrap;

    #[test]
    fn twelve_parameters_and_fallible_decorators() {
        let mut hive = Hive::new([Module::new("m", "x")
            .provide(|| Arc::new(P::<1>))
            .provide(|| Arc::new(P::<2>))
            .provide(|| Arc::new(P::<3>))
            .provide(twelve)
            .decorate(
                |w: Arc<Wide>, _p: Arc<P<1>>| -> Result<Arc<Wide>, CannotWrap> {
                    Ok(Arc::new(Wide(w.0 + 1)))
                },
                [Module::new("inner", "x")
                    .invoke(|w: Arc<Wide>| assert_eq!(w.0, 13))
                    .into()],
            )
            .invoke(|w: Arc<Wide>| assert_eq!(w.0, 12))
            .into()]);
        hive.populate().unwrap();

        let mut failing = Hive::new([Module::new("m", "x")
            .provide(|| Arc::new(Wide(0)))
            .decorate(
                |_w: Arc<Wide>| -> Result<Arc<Wide>, CannotWrap> { Err(CannotWrap) },
                [Module::new("inner", "x").invoke(|_w: Arc<Wide>| {}).into()],
            )
            .into()]);
        let err = failing.populate().unwrap_err();
        assert!(err.to_string().starts_with("decorator `"), "{err}");
        assert!(
            err.to_string()
                .ends_with("of `Arc<cellium_hive::constructor::tests::Wide>` in module `m` failed"),
            "{err}"
        );
    }
}

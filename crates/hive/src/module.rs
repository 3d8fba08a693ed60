//! Declaring cells: modules and groups.
//!
//! A module is an id, a description and a list of items in declaration order:
//! config sections, constructors (`provide`, `provide_private`, `contribute`),
//! invokes, decorators and nested cells. Declaring runs nothing; it records each
//! function's parameters and output for validation.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::config::{ConfigSection, SectionDecl};
use crate::constructor::{CallError, Constructor, Decorator, Invoker};
use crate::dependency::{DepSpec, Resolved};
use crate::typename::TypeKey;

/// A constructed value in the hive's store: the `Arc<T>` a constructor returned.
pub(crate) type ValueBox = Box<dyn Any + Send + Sync>;

/// A declared function, type-erased, called once with its resolved parameters.
pub(crate) type CallFn<T> =
    Box<dyn for<'a> FnOnce(Vec<Resolved<'a>>) -> Result<T, CallError> + Send>;

/// Who may see a provided type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProvideKind {
    /// Every module.
    Public,
    /// The declaring module and its descendants.
    Private,
    /// A member of the value group `Vec<Arc<T>>`, seen by every module.
    Contribute,
}

pub(crate) struct ProviderDecl {
    pub(crate) kind: ProvideKind,
    pub(crate) name: &'static str,
    pub(crate) inputs: Vec<DepSpec>,
    pub(crate) output: TypeKey,
    pub(crate) call: Option<CallFn<ValueBox>>,
}

pub(crate) struct InvokeDecl {
    pub(crate) name: &'static str,
    pub(crate) inputs: Vec<DepSpec>,
    pub(crate) call: Option<CallFn<()>>,
}

pub(crate) struct DecoratorDecl {
    pub(crate) name: &'static str,
    pub(crate) target: TypeKey,
    /// The original `Arc<T>` first, then the other parameters.
    pub(crate) inputs: Vec<DepSpec>,
    pub(crate) call: Option<CallFn<ValueBox>>,
    pub(crate) cells: Vec<Cell>,
}

pub(crate) enum Item {
    Config(SectionDecl),
    Provide(ProviderDecl),
    Invoke(InvokeDecl),
    Decorate(DecoratorDecl),
    Cell(Cell),
}

/// A cell: a [`Module`] or a [`Group`].
pub enum Cell {
    /// A module, with a scope and a health node of its own.
    Module(Module),
    /// Cells with no scope of their own.
    Group(Group),
}

impl fmt::Debug for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Module(m) => m.fmt(f),
            Cell::Group(g) => g.fmt(f),
        }
    }
}

impl From<Module> for Cell {
    fn from(m: Module) -> Cell {
        Cell::Module(m)
    }
}

impl From<Group> for Cell {
    fn from(g: Group) -> Cell {
        Cell::Group(g)
    }
}

/// Cells with no scope of their own, as Cilium's `cell.Group`: a way for a crate
/// to hand out several modules as one value. Private types and decorators of the
/// enclosing module apply inside the group as if its cells were listed directly.
pub struct Group {
    pub(crate) cells: Vec<Cell>,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.cells).finish()
    }
}

/// Groups cells without giving them a scope.
pub fn group(cells: impl IntoIterator<Item = Cell>) -> Group {
    Group {
        cells: cells.into_iter().collect(),
    }
}

/// A module: the unit of scope, config ownership, logging and health.
///
/// The id is kebab-case (`[a-z][a-z0-9-]*`, at most 30 characters); the full id
/// is the dotted path of the enclosing modules (`controlplane.ipam`) and appears
/// on every log line of the module's hooks and jobs. The description expands on
/// the id rather than repeating it. An invalid id is reported by
/// [`Hive::validate`](crate::Hive::validate), never by a panic.
///
/// ```
/// use std::sync::Arc;
/// use cellium_hive::{Config, Lifecycle, Module};
///
/// #[derive(Default, serde::Serialize, serde::Deserialize)]
/// #[serde(rename_all = "kebab-case")]
/// struct IpamConfig { pod_cidr: Vec<String> }
///
/// struct Ipam;
/// fn new_ipam(cfg: Config<IpamConfig>, _lc: Lifecycle) -> Arc<Ipam> {
///     let _ = &cfg.pod_cidr;
///     Arc::new(Ipam)
/// }
///
/// let ipam = Module::new("ipam", "Allocates pod IPs from the node's pod CIDRs")
///     .config::<IpamConfig>()
///     .provide(new_ipam);
/// ```
pub struct Module {
    pub(crate) id: &'static str,
    pub(crate) description: &'static str,
    pub(crate) items: Vec<Item>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("id", &self.id)
            .field("items", &self.items.len())
            .finish()
    }
}

impl Module {
    /// A module with no items yet.
    pub fn new(id: &'static str, description: &'static str) -> Module {
        Module {
            id,
            description,
            items: Vec::new(),
        }
    }

    /// The module's own id (not the full path).
    pub fn id(&self) -> &'static str {
        self.id
    }

    /// Declares that this module owns the config section `T`: its kebab-case
    /// fields are global flat keys, and any constructor can take `Config<T>`.
    pub fn config<T: ConfigSection>(mut self) -> Self {
        self.items.push(Item::Config(SectionDecl::of::<T>()));
        self
    }

    /// Adds a constructor of `Arc<T>`, visible to every module. It runs only if an
    /// invoke needs `T` (transitively), once.
    pub fn provide<Args, C: Constructor<Args>>(mut self, ctor: C) -> Self {
        self.items
            .push(Item::Provide(provider(ctor, ProvideKind::Public)));
        self
    }

    /// Adds a constructor of `Arc<T>` visible in this module and its descendants
    /// only; a consumer elsewhere is a validation error naming both modules.
    pub fn provide_private<Args, C: Constructor<Args>>(mut self, ctor: C) -> Self {
        self.items
            .push(Item::Provide(provider(ctor, ProvideKind::Private)));
        self
    }

    /// Adds a constructor whose `Arc<T>` is one member of the value group
    /// `Vec<Arc<T>>`. A type is either provided or contributed, never both.
    pub fn contribute<Args, C: Constructor<Args>>(mut self, ctor: C) -> Self {
        self.items
            .push(Item::Provide(provider(ctor, ProvideKind::Contribute)));
        self
    }

    /// Adds a function run at populate, in declaration order, once its
    /// parameters are built. Invokes decide what gets constructed: modules that
    /// only provide services to others usually have none.
    pub fn invoke<Args, F: Invoker<Args>>(mut self, f: F) -> Self {
        let name = std::any::type_name::<F>();
        self.items.push(Item::Invoke(InvokeDecl {
            name,
            inputs: F::inputs(),
            call: Some(Box::new(move |deps| f.invoke(deps))),
        }));
        self
    }

    /// Wraps `Arc<T>` for the given cells: inside them (and their descendants)
    /// `Arc<T>` resolves to what `d` returns. `d` takes the original `Arc<T>`
    /// first, resolved from this module's scope, then any other dependencies.
    /// The cells become children of this module. Value groups
    /// (`Vec<Arc<T>>`) are not decorated.
    pub fn decorate<Args, D: Decorator<Args>>(
        mut self,
        d: D,
        cells: impl IntoIterator<Item = Cell>,
    ) -> Self {
        self.items.push(Item::Decorate(DecoratorDecl {
            name: std::any::type_name::<D>(),
            target: TypeKey::of::<D::Target>(),
            inputs: D::inputs(),
            call: Some(Box::new(move |deps| {
                d.decorate(deps).map(|v| Box::new(v) as ValueBox)
            })),
            cells: cells.into_iter().collect(),
        }));
        self
    }

    /// Nests a module or a group.
    pub fn cell(mut self, c: impl Into<Cell>) -> Self {
        self.items.push(Item::Cell(c.into()));
        self
    }
}

fn provider<Args, C: Constructor<Args>>(ctor: C, kind: ProvideKind) -> ProviderDecl {
    ProviderDecl {
        kind,
        name: std::any::type_name::<C>(),
        inputs: C::inputs(),
        output: TypeKey::of::<C::Output>(),
        call: Some(Box::new(move |deps| {
            ctor.construct(deps)
                .map(|v: Arc<C::Output>| Box::new(v) as ValueBox)
        })),
    }
}

#![doc = include_str!("../README.md")]
//!
//! # Where to start
//!
//! - Declaring a cell: [`Module`] (and [`group`]); the functions it takes are
//!   [`Constructor`]s, [`Invoker`]s and [`Decorator`]s, whose parameters are
//!   [`Dependency`] types.
//! - Running cells: [`Hive`]: `validate`, `populate`, `start`, `stop`, `run`,
//!   `describe`, `dot`.
//! - Configuration: [`ConfigSources`] and [`Config`]; the rules for keys,
//!   precedence and environment lists are in the [`config`] module.
//! - Doing work: [`Lifecycle`] hooks for start/stop, [`Jobs`] for loops,
//!   [`health::Reporter`] to say how it goes, [`Shutdowner`] to give up.
//! - Testing a cell without a hive: [`testing::TestLifecycle`].
//! - A runnable example: `examples/mini_agent.rs`
//!   (`cargo run -p cellium-hive --example mini_agent`).
//!
//! The order of things: declaring records each function's parameters;
//! `validate` resolves them all and reports every problem; `populate` runs the
//! constructors the invokes need, once each, dependencies first, so constructors
//! append hooks in dependency order; `start` runs the start hooks in that order
//! and `stop` the stop hooks in reverse.

pub mod config;
mod constructor;
mod dependency;
mod error;
pub mod health;
mod hive;
mod introspect;
mod job;
mod lifecycle;
mod module;
mod populate;
pub mod process;
mod shutdown;
pub mod testing;
mod typename;

mod catalog;
mod graph;

pub use config::{Config, ConfigSection, ConfigSources, HiveConfig};
pub use constructor::{Constructor, CtorOutput, Decorator, InvokeOutput, Invoker};
pub use dependency::Dependency;
pub use error::{BoxError, Error, HookFailure, JobError, Problem, Result, error_chain};
pub use health::{Health, HealthNode, Level, Reporter, Status};
pub use hive::Hive;
pub use job::{Backoff, JobContext, Jobs, Observer, OneShot, Timer, Trigger};
pub use lifecycle::{HOOK_GRACE_PERIOD, Hook, HookContext, Lifecycle};
pub use module::{Cell, Group, Module, group};
pub use shutdown::Shutdowner;

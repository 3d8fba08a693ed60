//! `cellium-cni`, the CNI plugin of Cellium.
//!
//! A thin client: it validates what the runtime passes (the `CNI_*` environment, the network
//! configuration on stdin, `CNI_ARGS`), asks the agent over its unix socket to do the work
//! (`cellium.v1.Endpoints`: Create, Delete, Check, Gc; `cellium.v1.Agent.Status`), and prints
//! the spec's result or error object. The agent owns netlink, IPAM and the datapath; the plugin
//! opens the pod's network namespace and passes it with ADD and CHECK ([`netns`]), since the
//! runtime's path is valid where the plugin runs, not necessarily where the agent runs.
//!
//! Where to start: `main.rs` reads the environment and stdin and dispatches to one file per
//! verb in [`commands`]; [`error`] holds every failure with its CNI code; [`result`] reads and
//! writes the ADD result in each supported version ([`version`]). `docs/cni.md` has the
//! configuration keys, the error-code table and installation steps.

pub mod addr;
pub mod agent;
pub mod args;
pub mod calllog;
pub mod commands;
pub mod config;
pub mod env;
pub mod error;
pub mod netns;
pub mod port_mappings;
pub mod result;
pub mod version;

pub use env::Env;
pub use error::{Error, ErrorObject, Result};
pub use version::{CniVersion, Verb};

//! The Cellium agent as a list of cells.
//!
//! [`cells`] is the whole agent; a custom agent is another list built from the same cell
//! crates (say IPAM and the endpoint manager without Kubernetes, as
//! `examples/connectivity_agent.rs` is), and the hive tells at populate time, before anything
//! runs, which cell is missing and who needs it. Such a list starts with [`node_lock`], so that
//! a second agent on the node stops before it touches anything.
//! [`ConfigArgs`] are the command-line flags every subcommand that builds the hive accepts.

mod cells;
mod flags;

pub use cells::{cells, node_lock};
pub use flags::ConfigArgs;

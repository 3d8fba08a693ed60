//! The kinds the tables hold: slim copies of the Kubernetes objects with only what cells read.
//!
//! Storing only those fields keeps memory low (a full Pod object is mostly status and spec no
//! cell of the agent reads) and keeps the cells independent of the Kubernetes types.

mod namespace;
mod pod;
mod protocol;

pub use namespace::{NAME_LABEL, Namespace, SYSTEM_NAMESPACES};
pub use pod::{NamedPort, Pod};
pub use protocol::Protocol;

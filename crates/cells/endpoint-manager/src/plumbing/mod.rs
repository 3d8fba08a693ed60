//! Interface plumbing with rtnetlink: the veth pair, the pod's addresses and routes, and the
//! node-side settings an endpoint needs.
//!
//! The agent does this work (not the CNI plugin) with one long-lived netlink connection in the
//! node's namespace and a short-lived one per pod namespace: the plugin stays a thin client,
//! a crash mid-ADD leaves a record the agent can clean up at restart, and there is a single
//! writer of the node's routes.

mod error;
mod host;
mod links;
mod netns;
mod pod;
mod routes;
mod sysctl;

pub use error::{Error, Result};
pub use host::{HOST_DEVICE, setup_host};
pub use links::{Link, find_link, host_ifname, host_links};
pub use netns::{Netlink, PodNetns, Refusal};
pub use pod::{PodInterface, PodNetwork, check_pod, setup_pod, teardown_pod};
pub use routes::host_routes;

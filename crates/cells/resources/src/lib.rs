//! The `resources` cell: the node's desired state as typed tables.
//!
//! - **Owns** one [`Table`] per kind (namespaces, pods, NetworkPolicies, CiliumNetworkPolicies,
//!   CiliumClusterwideNetworkPolicies, Services and EndpointSlices), each with change events
//!   and a revision counter; and the allocation of services' cluster IPs.
//! - **Provides** `Arc<Resources>` and the `cellium.v1.Resources` gRPC service, which is how
//!   `cellium apply -f` / `cellium delete -f` feed the tables in standalone mode. Applying
//!   behaves as the Kubernetes API server would for what the agent observes: the same
//!   validation (names, labels, ports, selectors, CIDRs; unknown fields rejected; the parts of
//!   Cilium's policy language that are not enforced rejected as "not supported"), the same
//!   defaulting (a namespace, a port's protocol, a NetworkPolicy's `policyTypes`, the
//!   `kubernetes.io/metadata.name` namespace label, a service's target port and cluster IP),
//!   and all-or-nothing for a file. A service's cluster IP is allocated from `service-cidr`
//!   when not given, checked when given, immutable once set, and recorded with the object.
//! - **Depends on** nothing.
//! - **Config keys:** `service-cidr` (default `10.96.0.0/12`): the range cluster IPs come
//!   from, as the API server's `--service-cluster-ip-range`; IPv4, /12 to /30.
//! - **Degraded** never.
//!
//! Consumers read tables and subscribe to their events; the tables keep slim copies of the
//! objects with only what the agent's cells read.

mod apply;
#[cfg(test)]
mod cell_tests;
mod config;
mod document;
mod error;
mod grpc;
mod key;
mod kinds;
mod limits;
mod objects;
mod record;
mod resources;
mod service_ip;
mod table;
mod validate;
mod writers;

use cellium_hive::Module;

pub use config::{DEFAULT_APPLY_MAX_BYTES, DEFAULT_APPLY_MAX_DEPTH, ResourcesConfig};
pub use document::DocumentError;
pub use error::{Error, Result};
pub use grpc::ResourcesService;
pub use key::{Object, ObjectKey};
pub use limits::Limits;
pub use objects::{
    CidrBlock, CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy, CiliumPeerRule, CiliumPolicy,
    CiliumRule, ClusterIp, EndpointSlice, Entity, LabelRequirement, LabelSelector, NAME_LABEL,
    NamedPort, Namespace, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyRule, Pod, PolicyPort,
    PolicyType, PortRef, Protocol, SELECTOR_SOURCES, SERVICE_NAME_LABEL, SYSTEM_NAMESPACES,
    SelectorOperator, Service, ServicePort, SliceEndpoint, SlicePort,
};
pub use resources::{Action, Outcome, Resources};
pub use table::{Change, Event, Table, Writer};
pub use validate::FieldError;

/// The `resources` module.
pub fn cell() -> Module {
    Module::new(
        "resources",
        "Holds the node's desired state (namespaces, pods, policies, ...) as typed tables fed by apply",
    )
    .config::<ResourcesConfig>()
    .provide(Resources::persistent)
    .contribute(ResourcesService::api)
}

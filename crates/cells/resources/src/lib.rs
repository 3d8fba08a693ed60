//! The `resources` cell: the node's desired state as typed tables.
//!
//! - **Owns** one [`Table`] per kind (namespaces, pods, NetworkPolicies, CiliumNetworkPolicies,
//!   CiliumClusterwideNetworkPolicies, Services and EndpointSlices), each with change events
//!   and a revision counter, and each with one exclusive [`Writer`], held by the apply path;
//!   the allocation of services' cluster IPs; the record of applied objects in the state
//!   directory (`resources/`, see `docs/state.md`); the policy directory's feed.
//! - **Provides** `Arc<Resources>` (the tables' readers as its fields; `apply` / `delete`) and
//!   the `cellium.v1.Resources` gRPC service, which is how `cellium apply -f` /
//!   `cellium delete -f` feed the tables in standalone mode. Applying behaves as the
//!   Kubernetes API server would for what the agent observes: the same validation (names,
//!   labels, ports, selectors, CIDRs; unknown fields rejected; the parts of Cilium's policy
//!   language that are not enforced rejected as "not supported"), the same defaulting (a
//!   namespace, a port's protocol, a NetworkPolicy's `policyTypes`, the
//!   `kubernetes.io/metadata.name` namespace label, a service's target port, families and
//!   cluster IPs), and all-or-nothing for a file, also across a crash. A change is recorded
//!   before the tables change; one that cannot be recorded is refused, naming the file and the
//!   errno. A service's families are defaulted as the API server does (`ipFamilies`,
//!   `ipFamilyPolicy`), its cluster IP of each family allocated from that family's
//!   `service-cidr` range when not given, checked when given, immutable once set, and
//!   recorded with the object.
//! - **Depends on** `Arc<StateDir>` (the `statedir` cell).
//! - **Config keys:** `service-cidr` (default `10.96.0.0/12`): the ranges cluster IPs come
//!   from, as the API server's `--service-cluster-ip-range`: one, or one per family (a list,
//!   or the two separated by a comma), the first being the default family; IPv4 /12 to /30,
//!   IPv6 /108 to /126;
//!   `apply-max-bytes` (default 3 MiB) and `apply-max-depth` (default 64): the largest text
//!   and the deepest nesting one apply or delete takes, checked before decoding;
//!   `policy-dir` (unset by default): a directory of YAML files applied as they change;
//!   `node-port-range` (default `30000-32767`): the node ports of NodePort and LoadBalancer
//!   services in standalone mode, allocated when not given, checked when given (in range,
//!   held by no other service), and recorded with the object.
//! - **Degraded** while a record on disk is not in force (it could not be read, or no longer
//!   loads: each named with its reason; it is kept, and an apply or delete of its object
//!   replaces it), a committed change could not be merged into the object files (it is in
//!   force and in the journal; retried at the next change), or the last change could not be
//!   recorded (it was refused; until one is); the `policy-dir` job while a file of the
//!   directory does not apply. OK once restored otherwise.
//!
//! Consumers read tables and subscribe to their events; the tables keep slim copies of the
//! objects with only what the agent's cells read.

mod apply;
#[cfg(test)]
mod cell_tests;
mod config;
mod decoded;
mod error;
mod feed;
mod grpc;
mod limits;
mod listing;
mod resources;
mod service_ip;
mod sync;
mod table;
mod unknown;
mod writers;

use cellium_hive::Module;

pub use apply::node_ports::NodePortRange;
pub use apply::policy_dir::PolicyDir;
pub use cellium_k8s_objects::{
    CONTROLLER_MANAGED_BY, CidrBlock, CidrGroupMatch, CidrGroupRef, CiliumCidrGroup,
    CiliumClusterwideNetworkPolicy, CiliumEndpoint, CiliumIdentity, CiliumNetworkPolicy,
    CiliumNode, CiliumPeerRule, CiliumPolicy, CiliumRule, ClusterIp, DocumentError, EndpointSlice,
    Entity, Exposure, FieldError, GapScope, HostPort, IcmpFamily, IcmpType, IpFamily,
    IpFamilyPolicy, LB_ALGORITHM_ANNOTATION, LabelRequirement, LabelSelector, LbAlgorithm,
    NAME_LABEL, NamedPort, Namespace, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyRule, Node,
    Object, ObjectKey, Pod, PolicyGap, PolicyPort, PolicyType, PortRef, Protocol, RuleLabel,
    SELECTOR_SOURCES, SERVICE_NAME_LABEL, SYSTEM_NAMESPACES, SelectorOperator, Service,
    ServiceOwner, ServicePort, ServiceRef, ServiceType, SliceEndpoint, SlicePort, TrafficPolicy,
};
pub use config::{DEFAULT_APPLY_MAX_BYTES, DEFAULT_APPLY_MAX_DEPTH, ResourcesConfig};
pub use decoded::{BuiltIn, Decoded};
pub use error::{Error, Result};
pub use feed::{API_KINDS, ApiSource, Feed};
pub use grpc::ResourcesService;
pub use limits::Limits;
pub use listing::Listing;
pub use resources::{Action, Outcome, Resources};
pub use table::{Change, Event, Table, Writer};

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

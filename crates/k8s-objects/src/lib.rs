//! Cellium's object model of the Kubernetes and Cilium kinds it reads: decoding from YAML or
//! JSON, validation as the API server would do it, and keys. No I/O, no hive, no gRPC: the
//! `resources` cell holds these objects in its tables, and any crate that only needs the
//! kinds depends on this one (as kube-core is to kube).
//!
//! The kinds are slim copies of the Kubernetes objects with only what cells read: the policy
//! kinds (NetworkPolicy, CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy), the
//! load-balancing kinds (Service, EndpointSlice), and the cluster kinds (Node, CiliumNode,
//! CiliumIdentity, CiliumEndpoint).
//!
//! Storing only those fields keeps memory low (a full Pod object is mostly status and spec no
//! cell of the agent reads) and keeps the cells independent of the Kubernetes types.

mod audit;
pub mod document;
pub mod gap;
mod key;
pub mod kinds;
pub mod validate;

mod cidr_group;
mod cilium_cluster;
pub mod cilium_decode;
mod cilium_policy;
mod dns_match;
mod endpoint_slice;
mod icmp;
mod namespace;
mod network_policy;
mod node;
mod pod;
mod policy_port;
mod protocol;
mod selector;
pub mod service;
pub mod service_exposure;

pub use audit::{AUDIT_MODE_ANNOTATION, audit_mode};
pub use cidr_group::{CIDR_GROUP_VERSIONS, CiliumCidrGroup};
pub use cilium_cluster::{CiliumEndpoint, CiliumIdentity, CiliumNode};
pub use cilium_policy::{
    CidrGroupMatch, CidrGroupRef, CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy,
    CiliumPeerRule, CiliumPolicy, CiliumRule, Entity, RuleLabel, ServiceRef,
};
pub use dns_match::DnsMatch;
pub use endpoint_slice::{
    CONTROLLER_MANAGED_BY, EndpointSlice, SERVICE_NAME_LABEL, ServiceOwner, SliceEndpoint,
    SlicePort,
};
pub use icmp::{IcmpFamily, IcmpType};
pub use namespace::{NAME_LABEL, Namespace, SYSTEM_NAMESPACES};
pub use network_policy::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyRule, PolicyType};
pub use node::Node;
pub use pod::{HostPort, NamedPort, Pod};
pub use policy_port::{CidrBlock, PolicyPort, PortRef};
pub use protocol::Protocol;
pub use selector::{LabelRequirement, LabelSelector, SELECTOR_SOURCES, SelectorOperator};
pub use selector::{RawSelector, SelectorFlavor};
pub use service::{
    ClusterIp, IpFamily, IpFamilyPolicy, LB_ALGORITHM_ANNOTATION, LbAlgorithm, Service, ServicePort,
};
pub use service_exposure::{Exposure, ServiceType, TrafficPolicy};

pub use document::{Document, DocumentError, decode};
pub use gap::{GapScope, PolicyGap};
pub use key::{Object, ObjectKey};
pub use validate::FieldError;

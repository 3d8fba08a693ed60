//! The `svc-lb` cell: services load-balanced by the datapath.
//!
//! - **Owns** the contents of the datapath's load-balancing maps (`cel_lb4_*`, `cel_lb6_*`,
//!   the maglev tables `cel_lb_maglev`, the affinity pairs `cel_lb_affinity_match` and the
//!   load balancer source ranges `cel_lb4_source_range` / `cel_lb6_source_range`): one
//!   frontend per port and cluster IP of every service (a dual-stack service has one cluster
//!   IP per family), and per node address and node port, external IP and load balancer
//!   ingress IP of those reached from outside ([`external`]), and per host port (a Pod's
//!   `hostPort`, or a runtime's CNI `portMappings` kept on the endpoint: [`host_ports`]), its
//!   backends (of its family),
//!   stable backend ids shared by frontends, and one rev-NAT id per frontend, ids being one
//!   space over both families. Headless services have no frontend. Also the health check
//!   node port servers of LoadBalancer services with `externalTrafficPolicy: Local`
//!   ([`health_check_node_ports`]).
//! - **Provides** `Arc<ServiceLb>` ([`ServiceLb::frontends`]: what is programmed, with the
//!   source of every backend) and the `cellium.v1.Services` gRPC service
//!   (`cellium service list`).
//! - **Depends on** resources (services, endpoint slices, pods), endpoint-manager (this node's
//!   endpoints, their port mappings and their changes), loader (the maps); optionally metrics
//!   (`cellium_host_ports_refused{reason}`: the host ports the last pass left out).
//! - **Config keys:** `service-no-backend-response`: `reject` (the default: a new connection
//!   to a frontend without backends gets an ICMP port unreachable at once) or `drop`;
//!   `bpf-lb-algorithm` (`random` or `maglev`, [`maglev`]) and `bpf-lb-maglev-table-size`;
//!   `bpf-lb-mode` (`snat`, `dsr` or `hybrid`, [`LbMode`]: direct server return of a
//!   connection from outside balanced to another node's backend);
//!   `bpf-lb-sock` (off by default) and `cgroup-root`: the node's own processes in that
//!   cgroup get services translated at `connect()` and `sendmsg()`; `enable-host-port` (on
//!   by default): host ports ([`SvcLbConfig`]). The
//!   service range, `service-cidr`, belongs to resources.
//! - **Degraded** when a frontend cannot be programmed (too many backends, ids exhausted, a
//!   map write failing), naming it and why; or when stale entries cannot be removed.
//!   Frontends left out because the datapath does not serve what they ask (an SCTP port, a
//!   LoadBalancer IP with `loadBalancerSourceRanges`) are named in the OK message and in
//!   `cellium service list`, not Degraded: that would fail CNI STATUS on every node. So are
//!   refused host ports, counted by reason in the OK message.
//!
//! Backends come from the service's EndpointSlices, or, when none names it, from this node's
//! endpoints whose pods match its selector ([`desired`] has the rules). At start the pinned
//! maps keep serving until the first pass, which runs only after the resources and the
//! endpoints are restored ([`ServiceLb`] documents the order). `docs/services.md` describes
//! the whole.

mod config;
pub mod desired;
mod error;
pub mod external;
mod grpc;
pub mod health_check_node_ports;
pub mod host_ports;
mod ids;
pub mod maglev;
mod service_lb;
mod sock_lb;
pub mod sync;

use cellium_hive::Module;

pub use config::{LbMode, MaglevTableSize, NoBackendResponse, SvcLbConfig};
pub use error::{Error, Result};
pub use external::FrontendKind;
pub use grpc::{ServicesService, to_proto};
pub use service_lb::ServiceLb;
pub use sync::{FrontendStatus, Programmer, SyncReport};

/// The `svc-lb` module.
pub fn cell() -> Module {
    Module::new(
        "svc-lb",
        "Programs services' frontends (cluster IPs, node ports, external and LB IPs) and backends into the datapath's load-balancing maps",
    )
    .config::<SvcLbConfig>()
    .provide(ServiceLb::new)
    .contribute(ServicesService::api)
}

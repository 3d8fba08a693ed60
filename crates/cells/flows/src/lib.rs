//! The `flows` cell: what the datapath did, as flows you can see.
//!
//! - **Owns** the reading of the datapath's `cel_events` ring buffer (drops, policy verdicts
//!   and traces of new connections), the flags in `cel_config` that switch traces and
//!   verdicts on, and the ring of the last flows.
//! - **Provides** `Arc<Flows>` (the [`Ring`] and its counters, [`Stats`]) and the
//!   `cellium.v1.Observer` gRPC service, modelled on Hubble's observer (`cellium observe`),
//!   also served as Hubble's `observer.Observer` ([`HubbleObserver`]):
//!   each event becomes a [`Flow`] naming both sides (local pods by endpoint, namespace and
//!   labels; anything else by identity, `reserved:world` and the like), the service a
//!   translated connection went through, and the verdict and its reason.
//! - **Depends on** loader (the events), endpoint-manager (the pods); optionally identity
//!   (labels of remote identities), ipcache (identities of addresses the event did not
//!   name), svc-lb (services by rev-NAT id) and metrics (`cellium_flows_processed_total`,
//!   `cellium_policy_verdicts_total`, `cellium_endpoint_drops_total`,
//!   `cellium_flows_lost_events_total`); and the hive's `Shutdowner`, to end every follow as
//!   soon as the agent begins to stop.
//! - **Config keys** (Cilium's names): `enable-hubble` (default true),
//!   `hubble-event-buffer-capacity` (default 4095 flows), `bpf-events-trace-enabled`
//!   (default true), `bpf-events-policy-verdict-enabled` (default false),
//!   `hubble-follow-queue-size` (default 4096).
//! - **Degraded** when reading the ring buffer fails (the reader stops).
//!
//! Events are lossy by design: a full ring buffer loses events, never packets. Losses are
//! counted in the datapath (`cel_metrics`) and reported to followers as `LostEvent`s; the
//! datapath's counters (`cellium_datapath_packets_total`) are the lossless record.
//! `docs/observability.md` describes the whole.

mod config;
pub mod convert;
mod enrich;
mod filter;
mod flow;
mod grpc;
mod hubble;
mod observer;
mod ring;
mod sources;
mod stats;

use cellium_hive::Module;

pub use config::FlowsConfig;
pub use enrich::{Enricher, LocalEndpoint, PolicyQuestion, Sources};
pub use filter::{Filter, FilterError, Filters};
pub use flow::{EndpointRef, Flow, FlowVerdict, Peer, PolicyRef, ServiceRef};
pub use grpc::{ObserverService, flow_of};
pub use hubble::{HUBBLE_SERVICE, HubbleObserver};
pub use observer::Flows;
pub use ring::{Item, LostSource, Ring, Subscription};
pub use sources::CellSources;
pub use stats::Stats;

/// The `flows` module.
pub fn cell() -> Module {
    Module::new(
        "flows",
        "Reads the datapath's events into enriched flows and serves them as Hubble's observer",
    )
    .config::<FlowsConfig>()
    .provide(Flows::new)
    .contribute(ObserverService::api)
    .contribute(HubbleObserver::api)
}

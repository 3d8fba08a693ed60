//! The `metrics` cell: the agent's Prometheus metrics.
//!
//! - **Owns** the metric registry and the HTTP listener that serves it (`GET /metrics`, text
//!   exposition format).
//! - **Provides** `Arc<Metrics>`: other cells register their metrics into it at construction.
//!   It invokes itself, so the endpoint is served whatever else the agent holds.
//! - **Depends on** the hive's `Health`, exported as `cellium_module_health{module,level}` (1 for
//!   the module's current level, 0 for the others; levels `ok`, `degraded`, `stopped`,
//!   `unknown`) and
//!   `cellium_module_health_changed_timestamp_seconds{module}`.
//! - **Config keys:** `metrics-addr` (default `127.0.0.1:9962`).
//! - **Degraded** when serving a scrape fails; failing to bind the address fails the start.

mod config;
mod health;
mod registry;
mod server;

use cellium_hive::Module;

pub use config::MetricsConfig;
pub use registry::Metrics;

/// The `metrics` module.
pub fn cell() -> Module {
    Module::new(
        "metrics",
        "Serves the agent's Prometheus metrics, module health included",
    )
    .config::<MetricsConfig>()
    .provide(Metrics::new)
    // Served even when no cell registers a metric: module health is always exported.
    .invoke(|_: std::sync::Arc<Metrics>| {})
}

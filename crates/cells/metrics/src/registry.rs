//! The registry other cells register into.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use cellium_hive::{Config, Health, Hook, Jobs, Lifecycle, Reporter};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::{Metric, Registry};

use crate::config::MetricsConfig;
use crate::health::HealthMetrics;
use crate::server;

/// The agent's metrics. Every name gets the `cellium_` prefix.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    health: Health,
    health_metrics: HealthMetrics,
    bound: Mutex<Option<SocketAddr>>,
}

impl Metrics {
    /// Declares the registry; the listener is bound by the start hook.
    pub fn new(
        cfg: Config<MetricsConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        health: Health,
        reporter: Reporter,
    ) -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("cellium");
        let health_metrics = HealthMetrics::default();
        health_metrics.register(&mut registry);
        let metrics = Arc::new(Metrics {
            registry: Mutex::new(registry),
            health,
            health_metrics,
            bound: Mutex::new(None),
        });
        let addr = cfg.metrics_addr;
        let this = metrics.clone();
        lc.append(Hook::new("serve-metrics").on_start(move |_| async move {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on metrics-addr {addr}: {e}"))?;
            let local = listener.local_addr()?;
            *this.bound.lock().unwrap_or_else(|p| p.into_inner()) = Some(local);
            tracing::info!(%local, "serving metrics");
            reporter.ok(format!("serving on {local}"));
            server::serve(&jobs, listener, this);
            Ok(())
        }));
        metrics
    }

    /// Registers a metric under `cellium_<name>`.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(name, help, metric);
    }

    /// Registers a collector, asked for its samples at every scrape.
    pub fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register_collector(collector);
    }

    /// The address the listener is bound to, once started.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        *self.bound.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every metric in the text exposition format, health refreshed first.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.health_metrics.refresh(&self.health);
        let mut out = String::new();
        encode(
            &mut out,
            &self.registry.lock().unwrap_or_else(|p| p.into_inner()),
        )?;
        Ok(out)
    }
}

//! The cell's object: switches the datapath's events on, reads them into the ring.
//!
//! Start order: the loader's start hook has loaded the datapath, the endpoint manager's has
//! restored the endpoints (both are dependencies, so their hooks ran first). The `observe`
//! hook sets the trace and verdict flags in `cel_config` as configured (clearing what is
//! off, so a previous run's setting does not linger) and opens a reader; the `read-events`
//! job reads until the agent stops. Every follow ends with a clear error as soon as the
//! agent begins to stop (the API server's graceful stop waits for calls in flight, and it
//! stops before this cell).

use std::sync::Arc;
use std::time::Duration;

use cellium_datapath_bpf::{Datapath, DatapathConfig, EventReader};
use cellium_endpoint_manager::EndpointManager;
use cellium_hive::{BoxError, Config, Hook, JobContext, Jobs, Lifecycle, Reporter, Shutdowner};
use cellium_identity::Identities;
use cellium_ipcache::Ipcache;
use cellium_loader::Loader;
use cellium_metrics::Metrics;
use cellium_svc_lb::ServiceLb;

use crate::config::FlowsConfig;
use crate::enrich::{Enricher, Sources};
use crate::ring::Ring;
use crate::sources::CellSources;
use crate::stats::{Stats, StatsCollector};

/// How often the datapath's lost-events counter is read.
const LOST_INTERVAL: Duration = Duration::from_secs(1);

/// The pause between batches of events (see [`Flows::read_events`]).
pub const BATCH_INTERVAL: Duration = Duration::from_millis(1);

/// The observer: the ring of flows, its counters, and the node's name.
#[derive(Debug)]
pub struct Flows {
    ring: Arc<Ring>,
    stats: Arc<Stats>,
    node_name: String,
    enabled: bool,
}

impl Flows {
    /// Declares the cell; its start hook switches the events on and starts the reader.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: Config<FlowsConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        loader: Arc<Loader>,
        endpoints: Arc<EndpointManager>,
        identities: Option<Arc<Identities>>,
        ipcache: Option<Arc<Ipcache>>,
        services: Option<Arc<ServiceLb>>,
        metrics: Option<Arc<Metrics>>,
        shutdowner: Shutdowner,
    ) -> Arc<Flows> {
        let flows = Arc::new(Flows::in_memory(&cfg, node_name()));
        if let Some(metrics) = metrics {
            metrics.register_collector(Box::new(StatsCollector {
                stats: flows.stats.clone(),
                ring: flows.ring.clone(),
            }));
        }
        let sources: Arc<dyn Sources> =
            Arc::new(CellSources::new(endpoints, identities, ipcache, services));
        let this = flows.clone();
        let cfg = (*cfg).clone();
        let ring = flows.ring.clone();
        lc.append(
            Hook::new("observe")
                .on_start(move |_| async move {
                    // Follows end as soon as the agent begins to stop, not at this cell's
                    // stop hook: the API server stops first and waits for calls in flight.
                    let stopping = this.ring.clone();
                    tokio::spawn(async move {
                        shutdowner.requested().await;
                        stopping.stop();
                    });
                    let dp = loader.datapath()?;
                    switch_events(&dp, &cfg)?;
                    if !cfg.enable_hubble {
                        reporter.ok("off (enable-hubble: false)");
                        return Ok(());
                    }
                    let reader = dp.events()?;
                    reporter.ok(format!(
                        "reading events into a ring of {} flows (traces {}, policy verdicts {})",
                        this.ring.capacity(),
                        on_off(cfg.bpf_events_trace_enabled),
                        on_off(cfg.bpf_events_policy_verdict_enabled),
                    ));
                    let state = std::sync::Mutex::new(Some((reader, Enricher::new(sources))));
                    let this = this.clone();
                    jobs.one_shot("read-events", move |ctx| {
                        let taken = state.lock().unwrap_or_else(|p| p.into_inner()).take();
                        let (this, dp) = (this.clone(), dp.clone());
                        async move {
                            let Some((reader, enricher)) = taken else {
                                return Ok(());
                            };
                            this.read(ctx, dp, reader, enricher).await
                        }
                    })
                    .add();
                    Ok(())
                })
                .on_stop(move |_| async move {
                    ring.stop();
                    Ok(())
                }),
        );
        flows
    }

    /// An observer with no reader, for tests and tools that push flows themselves.
    pub fn in_memory(cfg: &FlowsConfig, node_name: String) -> Flows {
        Flows {
            ring: Arc::new(Ring::new(cfg.capacity(), cfg.hubble_follow_queue_size)),
            stats: Arc::new(Stats::default()),
            node_name,
            enabled: cfg.enable_hubble,
        }
    }

    /// The ring.
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The node's name as flows carry it.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Whether the observer runs (`enable-hubble`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Keeps `flow` and counts it.
    pub fn record(&self, flow: crate::Flow) {
        self.stats.count(&flow);
        self.ring.push(flow);
    }

    async fn read(
        &self,
        ctx: JobContext,
        dp: Arc<Datapath>,
        reader: EventReader,
        enricher: Enricher,
    ) -> Result<(), BoxError> {
        // A one-shot job is not known to work until it says so: it reads from now on.
        ctx.reporter().ok("reading the datapath's events");
        self.read_events(&dp, reader, enricher, ctx.cancelled())
            .await
            .map_err(Into::into)
    }

    /// Reads the datapath's events into the ring until `stop` completes, and the datapath's
    /// lost-events counter every second. What the `read-events` job runs; public so that a
    /// benchmark measures exactly it.
    ///
    /// Events are read in batches: after the events available are taken, the reader waits
    /// [`BATCH_INTERVAL`] before it waits for more. A reader woken for every event costs a
    /// wakeup (and the datapath an irq_work) per event, several times the work of the event
    /// itself; the pause bounds that to a thousand a second, for at most 1 ms of delay.
    pub async fn read_events(
        &self,
        dp: &Datapath,
        mut reader: EventReader,
        mut enricher: Enricher,
        stop: impl std::future::Future<Output = ()>,
    ) -> cellium_datapath_bpf::Result<()> {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(LOST_INTERVAL);
        // The counter lives as long as the pinned map; only what is lost from now on is ours.
        let mut lost = dp.metrics().events_lost().unwrap_or(0);
        loop {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                event = reader.next() => {
                    self.record(enricher.flow(event?));
                    for event in reader.available()? {
                        self.record(enricher.flow(event));
                    }
                    tokio::select! {
                        _ = &mut stop => return Ok(()),
                        _ = tokio::time::sleep(BATCH_INTERVAL) => {}
                    }
                }
                _ = tick.tick() => {
                    if let Ok(now) = dp.metrics().events_lost() {
                        self.ring.lost(now.saturating_sub(lost));
                        lost = now;
                    }
                }
            }
        }
    }
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// Sets or clears the trace and verdict flags as configured (both off when the observer is).
fn switch_events(dp: &Datapath, cfg: &FlowsConfig) -> cellium_datapath_bpf::Result<()> {
    let config = dp.config();
    config.set_flag(
        DatapathConfig::TRACE_EVENTS,
        cfg.enable_hubble && cfg.bpf_events_trace_enabled,
    )?;
    config.set_flag(
        DatapathConfig::POLICY_VERDICT_EVENTS,
        cfg.enable_hubble && cfg.bpf_events_policy_verdict_enabled,
    )
}

/// `K8S_NODE_NAME`, else the host name, as the Kubernetes watchers name the node.
fn node_name() -> String {
    std::env::var("K8S_NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

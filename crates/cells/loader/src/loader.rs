//! Loading the datapath at start and keeping it for the other cells.

use std::sync::{Arc, OnceLock};

use cellium_datapath_bpf::{Datapath, DatapathConfig, DatapathOptions, MapOrigin};
use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter};
use cellium_metrics::Metrics;

use crate::config::LoaderConfig;
use crate::counters::Counters;
use crate::error::{Error, Result};

/// The loaded datapath, shared by every cell that writes maps or attaches programs.
#[derive(Debug)]
pub struct Loader {
    datapath: Arc<OnceLock<Arc<Datapath>>>,
}

impl Loader {
    /// Declares the loader; the object is loaded by the start hook.
    pub fn new(
        cfg: Config<LoaderConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        metrics: Option<Arc<Metrics>>,
    ) -> Arc<Loader> {
        let datapath = Arc::new(OnceLock::new());
        if let Some(metrics) = metrics {
            metrics.register_collector(Box::new(Counters(datapath.clone())));
        }
        let loader = Arc::new(Loader { datapath });
        let this = loader.clone();
        let root = cfg.bpf_root.clone();
        let attach_mode = cfg.attach_mode.into();
        let interval = cfg.conntrack_gc_interval;
        let accounting = cfg.bpf_conntrack_accounting;
        lc.append(Hook::new("load-datapath").on_start(move |_| async move {
            let options = DatapathOptions {
                bpf_root: root,
                attach_mode,
            };
            // Loading runs the verifier: seconds of CPU that must not stall the runtime.
            let dp = tokio::task::spawn_blocking(move || Datapath::open(options))
                .await?
                .map_err(Error::Load)?;
            dp.config()
                .set_flag(DatapathConfig::CT_ACCOUNTING, accounting)
                .map_err(Error::Accounting)?;
            reporter.ok(summary(&dp));
            let dp = Arc::new(dp);
            let _ = this.datapath.set(dp.clone());
            collect_conntrack(&jobs, dp, interval);
            Ok(())
        }));
        loader
    }

    /// The datapath; available from the loader's start on, so to every cell that depends on
    /// the loader from its own start hook on.
    pub fn datapath(&self) -> Result<Arc<Datapath>> {
        self.datapath.get().cloned().ok_or(Error::NotLoaded)
    }
}

/// "loaded from /sys/fs/bpf/cellium: 9 maps reused, 1 created", and each non-trivial
/// origin logged, so a restart that lost state says so.
fn summary(dp: &Datapath) -> String {
    let (mut reused, mut created, mut replaced) = (0, 0, 0);
    for report in dp.maps_report() {
        match &report.origin {
            MapOrigin::Reused => reused += 1,
            MapOrigin::Created => created += 1,
            other => {
                replaced += 1;
                tracing::warn!(map = %report.name, origin = ?other, "pinned map replaced");
            }
        }
    }
    let text = format!(
        "loaded from {}: {reused} maps reused, {created} created, {replaced} migrated or recreated",
        dp.bpf_root().display()
    );
    tracing::info!("{text}");
    text
}

fn collect_conntrack(jobs: &Jobs, dp: Arc<Datapath>, interval: std::time::Duration) {
    jobs.timer("conntrack-gc", interval, move |ctx| {
        let dp = dp.clone();
        async move {
            let stats = tokio::task::spawn_blocking(move || dp.conntrack().gc()).await??;
            if stats.deleted > 0 {
                tracing::debug!(
                    scanned = stats.scanned,
                    deleted = stats.deleted,
                    "conntrack collected"
                );
            }
            ctx.reporter().ok(format!(
                "{} connections, {} expired removed",
                stats.scanned - stats.deleted,
                stats.deleted
            ));
            Ok(())
        }
    })
    .add();
}

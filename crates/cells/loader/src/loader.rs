//! Loading the datapath at start and keeping it for the other cells.
//!
//! Loading is two hooks. `load-datapath` runs as early as the node is claimed and only starts
//! the load (the kernel verifier's hundreds of milliseconds) on a blocking thread: it needs
//! nothing but the BPF root, so it runs beside what the start does meanwhile (in Kubernetes
//! mode, the API server's lists). `datapath-loaded` waits for it, and comes before the first
//! hook of any cell that uses the datapath, since those depend on [`Loader`]: a failed load
//! fails the start there, naming why.

use std::sync::{Arc, Mutex, OnceLock};

use cellium_datapath_bpf::{Datapath, DatapathConfig, DatapathOptions, MapOrigin};
use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter, error_chain as chain};
use cellium_metrics::Metrics;
use tokio::task::JoinHandle;

use crate::config::LoaderConfig;
use crate::counters::Counters;
use crate::error::{Error, Result};

type Loading = JoinHandle<Result<Datapath, cellium_datapath_bpf::Error>>;

/// The load under way, started by the `load-datapath` hook; taken by [`Loader`]'s hook.
#[derive(Debug, Default)]
pub struct LoadJob {
    loading: Mutex<Option<Loading>>,
}

impl LoadJob {
    /// Declares the `load-datapath` hook. The module invokes this constructor, so that the
    /// hook comes right after the hooks of what is constructed before the loader (the node's
    /// claim on the BPF root), not where the first user of the datapath is constructed.
    pub(crate) fn new(cfg: Config<LoaderConfig>, lc: Lifecycle) -> Arc<LoadJob> {
        let job = Arc::new(LoadJob::default());
        let this = job.clone();
        let options = DatapathOptions {
            bpf_root: cfg.bpf_root.clone(),
            attach_mode: cfg.attach_mode.into(),
        };
        lc.append(Hook::new("load-datapath").on_start(move |_| async move {
            // Seconds of CPU in the verifier at worst: off the runtime, and not waited for here.
            let loading = tokio::task::spawn_blocking(move || {
                let loaded = Datapath::open(options);
                if let Err(e) = &loaded {
                    // Said now: the start may be waiting for something else meanwhile.
                    tracing::error!(error = %chain(e), "cannot load the datapath");
                }
                loaded
            });
            *this.slot() = Some(loading);
            Ok(())
        }));
        job
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Loading>> {
        self.loading.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the load started by `load-datapath`.
    async fn wait(&self) -> Result<Datapath, cellium_hive::BoxError> {
        let loading = self.slot().take().ok_or(Error::NotStarted)?;
        Ok(loading.await?.map_err(Error::Load)?)
    }
}

/// The loaded datapath, shared by every cell that writes maps or attaches programs.
#[derive(Debug)]
pub struct Loader {
    datapath: Arc<OnceLock<Arc<Datapath>>>,
}

impl Loader {
    /// Declares the `datapath-loaded` hook, which waits for the load `load-datapath` started.
    pub fn new(
        cfg: Config<LoaderConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        metrics: Option<Arc<Metrics>>,
        job: Arc<LoadJob>,
    ) -> Arc<Loader> {
        let datapath = Arc::new(OnceLock::new());
        if let Some(metrics) = metrics {
            metrics.register_collector(Box::new(Counters(datapath.clone())));
        }
        let loader = Arc::new(Loader { datapath });
        let this = loader.clone();
        let interval = cfg.conntrack_gc_interval;
        let accounting = cfg.bpf_conntrack_accounting;
        lc.append(Hook::new("datapath-loaded").on_start(move |_| async move {
            let dp = job.wait().await?;
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

/// "loaded from /sys/fs/bpf/cellium: programs reused, 9 maps reused, 1 created", and each
/// non-trivial origin logged, so a restart that lost state says so.
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
        "loaded from {}: programs {}, {reused} maps reused, {created} created, {replaced} migrated or recreated",
        dp.bpf_root().display(),
        dp.program_origin()
    );
    tracing::info!("{text}");
    text
}

fn collect_conntrack(jobs: &Jobs, dp: Arc<Datapath>, interval: std::time::Duration) {
    jobs.timer("conntrack-gc", interval, move |ctx| {
        let dp = dp.clone();
        async move {
            let stats = tokio::task::spawn_blocking(move || dp.conntrack().gc()).await??;
            if stats.deleted > 0 || stats.translations_deleted > 0 {
                tracing::debug!(
                    scanned = stats.scanned,
                    deleted = stats.deleted,
                    translations_deleted = stats.translations_deleted,
                    "conntrack collected"
                );
            }
            ctx.reporter().ok(format!(
                "{} connections, {} expired removed, {} source translations of closed connections removed",
                stats.scanned - stats.deleted,
                stats.deleted,
                stats.translations_deleted
            ));
            Ok(())
        }
    })
    .add();
}

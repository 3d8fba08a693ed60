//! The cell's object: restores at start, then follows services, slices, pods and endpoints.
//!
//! Start order, and why:
//! 1. Until this cell's start hook runs, nothing here touches the maps: the loader reused the
//!    pinned load-balancing maps, so the previous agent's frontends keep serving, and the
//!    programs attached to every pod keep using them (established connections keep their
//!    backends through their service conntrack entries).
//! 2. The hook (`restore-services`) runs after the resources cell has synced or applied its
//!    objects and the endpoint manager has restored the endpoints (both are dependencies, so
//!    their hooks come first). It tells the datapath what a new connection to a frontend
//!    without backends gets (`service-no-backend-response`) and turns socket-level load
//!    balancing on or off (`bpf-lb-sock`; the node's sockets are translated by the same
//!    maps). It does not wait for the first pass, unless the maps hold no frontend (a node's
//!    first start, or maps recreated; one key read per family tells): nothing serves the
//!    services then, and the hook runs the first pass itself, as below, before the pods' CNI
//!    calls are served.
//! 3. The first pass is the `reconcile` job's first run, at the start of the cell's jobs. It
//!    first adopts the backend and rev-NAT ids the maps hold (reading them whole), so
//!    established connections keep their backends and reverse translation; then frontends
//!    are rewritten only where they differ, and only then are the frontends and backends
//!    nobody wants removed. Removing them any earlier would drop services whose objects or
//!    endpoints had not been restored yet; the jobs start after the hook, so after both.
//!    Nothing needs the pass before the agent goes on: the pinned maps serve what they held
//!    meanwhile (as during the restart itself), the endpoints are already restored, and
//!    nothing else writes these maps. So the cells after this one and the API (whose
//!    `Services.List` waits for the first pass, never answering from an empty status) do not
//!    wait for it, and a node with thousands of services is back as soon as its endpoints.
//!    A pass whose takeover fails (a map it cannot read) writes nothing, is reported and
//!    retried like any other.
//! 4. The `watch-changes` job, subscribed before the first pass, turns every change of
//!    services, slices, pods and endpoints into a trigger of the `reconcile` job (triggers
//!    coalesce), which also runs every minute to repair drift; `revnat-gc` deletes the
//!    rev-NAT entries of removed frontends once no connection carries their id.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cellium_datapath_bpf::{Datapath, DatapathConfig};
use cellium_endpoint_manager::EndpointManager;
use cellium_hive::{BoxError, Config, Hook, Jobs, Lifecycle, Reporter, Trigger};
use cellium_loader::Loader;
use cellium_metrics::Metrics;
use cellium_resources::{ApiSource, LbAlgorithm, Resources};
use futures::{Stream, StreamExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::config::{LbMode, NoBackendResponse, SvcLbConfig};
use crate::desired::{Inputs, plans};
use crate::error::{Error, Result};
use crate::health_check_node_ports::HealthCheckServers;
use crate::host_ports::Refusal;
use crate::sync::{FrontendStatus, Programmer, SyncReport};

/// How often the maps are compared with the plans without any change.
const RESYNC_INTERVAL: Duration = Duration::from_secs(60);
/// How often removed frontends' rev-NAT entries are looked at.
const REV_NAT_GC_INTERVAL: Duration = Duration::from_secs(30);

/// The label of `cellium_host_ports_refused`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// ClusterIP load balancing: the services' frontends and backends in the datapath.
#[derive(Debug)]
pub struct ServiceLb {
    resources: Arc<Resources>,
    endpoints: Arc<EndpointManager>,
    loader: Arc<Loader>,
    reporter: Reporter,
    /// This node's name (`node-name`), from the API source, which knows it even standalone;
    /// `internalTrafficPolicy: Local` selects slice endpoints by it.
    node_name: Option<String>,
    /// `bpf-lb-algorithm`.
    lb_algorithm: LbAlgorithm,
    /// `enable-host-port`.
    host_ports: bool,
    /// `bpf-lb-sock`.
    sock: bool,
    state: Mutex<Programmer>,
    health_checks: HealthCheckServers,
    /// Whether the first pass has run (succeeded or not): `Services.List` waits for it.
    first_pass: watch::Sender<bool>,
    /// `cellium_host_ports_refused{reason}`: the host port frontends the last pass refused.
    host_ports_refused: Family<ReasonLabels, Gauge>,
}

impl ServiceLb {
    /// Declares the cell; the `restore-services` start hook readies the datapath, and its jobs
    /// take over the pinned maps and keep them in line with the tables.
    #[allow(clippy::too_many_arguments)] // the hive injects each dependency by type
    pub fn new(
        cfg: Config<SvcLbConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        resources: Arc<Resources>,
        endpoints: Arc<EndpointManager>,
        loader: Arc<Loader>,
        source: Option<Arc<dyn ApiSource>>,
        metrics: Option<Arc<Metrics>>,
    ) -> Arc<ServiceLb> {
        let lb = Arc::new(ServiceLb {
            resources,
            endpoints,
            loader,
            reporter,
            node_name: source.map(|s| s.node_name()),
            lb_algorithm: cfg.bpf_lb_algorithm,
            host_ports: cfg.enable_host_port,
            sock: cfg.bpf_lb_sock,
            state: Mutex::new(Programmer::with_maglev_table_size(
                cfg.bpf_lb_maglev_table_size,
            )),
            health_checks: HealthCheckServers::default(),
            first_pass: watch::Sender::new(false),
            host_ports_refused: Family::default(),
        });
        if let Some(metrics) = metrics {
            metrics.register(
                "host_ports_refused",
                "Host port frontends (pods' hostPorts, runtimes' portMappings) not served at the last pass, by reason",
                lb.host_ports_refused.clone(),
            );
        }
        let this = lb.clone();
        let reject = cfg.service_no_backend_response == NoBackendResponse::Reject;
        let mode = cfg.bpf_lb_mode;
        let sock = (*cfg).clone();
        lc.append(Hook::new("restore-services").on_start(move |_| async move {
            this.set_no_backend_response(reject)?;
            this.set_lb_mode(mode)?;
            let dp = this.loader.datapath()?;
            crate::sock_lb::apply(&dp, &sock)?;
            if !dp.services().holds_frontends() {
                // Maps without a frontend (a node's first start, or maps recreated) serve no
                // service: here the pods wait for the first pass, run by the hook (one that
                // fails is reported, and the job tries again).
                let _ = this.first_pass_now().await;
            }
            // Otherwise the first pass is the reconcile job's first run (see the module docs).
            this.follow(&jobs);
            Ok(())
        }));
        lb
    }

    /// Switches the datapath's answer to new connections for frontends without backends: a
    /// port unreachable (`reject`) or nothing (`drop`).
    fn set_no_backend_response(&self, reject: bool) -> Result<()> {
        let dp = self.loader.datapath()?;
        dp.config()
            .set_flag(DatapathConfig::SERVICE_REJECT, reject)
            .map_err(|source| Error::Config { source })?;
        tracing::info!(
            response = if reject { "reject" } else { "drop" },
            "service-no-backend-response"
        );
        Ok(())
    }

    /// Switches how a NodePort connection balanced to another node's backend reaches it: by
    /// source translation, or by direct server return (`bpf-lb-mode`).
    fn set_lb_mode(&self, mode: LbMode) -> Result<()> {
        let dp = self.loader.datapath()?;
        let config = dp.config();
        config
            .set_flag(DatapathConfig::DSR_TCP, mode.dsr_tcp())
            .and_then(|()| config.set_flag(DatapathConfig::DSR_UDP, mode.dsr_udp()))
            .map_err(|source| Error::Config { source })?;
        tracing::info!(?mode, "bpf-lb-mode");
        Ok(())
    }

    /// What of kube-proxy's job this node does, as Cilium's `KubeProxyReplacement`, at the end
    /// of the module's OK message in `cellium status`: `True` when kube-proxy can go
    /// (services for pods, outside clients and the node's own processes), else `False` with
    /// what still needs it.
    pub fn kube_proxy_replacement(&self) -> String {
        kube_proxy_replacement(self.sock, self.host_ports)
    }

    /// The frontends as the last pass left them, ordered by service and port; empty before
    /// the first pass (see [`ServiceLb::first_pass`]).
    pub fn frontends(&self) -> Vec<FrontendStatus> {
        self.state().status()
    }

    /// Completes once the first pass after the start has run, programmed or failed.
    pub async fn first_pass(&self) {
        let mut done = self.first_pass.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = done.wait_for(|ran| *ran).await;
    }

    /// Computes the plans from the tables and the endpoints and writes them; reports health.
    /// The first pass takes over the pinned maps' ids before it writes anything.
    pub async fn reconcile(self: &Arc<Self>) -> Result<SyncReport> {
        let this = self.clone();
        // Read at every pass (a change of the service tables, or the periodic one): a node
        // address added since gets its NodePort frontends within RESYNC_INTERVAL.
        let node_addresses = cellium_ipcache::node_addresses()
            .await
            .map_err(Error::NodeAddresses)?;
        let (report, health_checks, refused) = tokio::task::spawn_blocking(move || -> Result<_> {
            let dp = this.loader.datapath()?;
            this.take_over(&dp)?;
            let mut inputs = Inputs {
                lb_algorithm: this.lb_algorithm,
                host_ports: this.host_ports,
                ..Inputs::read(
                    &this.resources,
                    &this.endpoints.list(),
                    this.node_name.as_deref(),
                )
            };
            inputs.node_addresses = node_addresses.into_iter().collect();
            let plans = plans(&inputs);
            let health_checks = crate::health_check_node_ports::wanted(&inputs, &plans);
            let refused = crate::host_ports::refused(&plans);
            Ok((this.state().sync(&dp, plans)?, health_checks, refused))
        })
        .await??;
        let unserved = self.health_checks.apply(health_checks).await;
        for (reason, n) in &refused {
            let labels = ReasonLabels {
                reason: reason.as_str(),
            };
            self.host_ports_refused
                .get_or_create(&labels)
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.report(&report, &unserved, &refused);
        Ok(report)
    }

    /// Degraded for what should have been programmed and was not; frontends left out by
    /// design (`SyncReport::unsupported`) are named in the OK message only: a Degraded module
    /// fails CNI STATUS, and one Service's SCTP port must not keep every new pod off the node.
    fn report(
        &self,
        report: &SyncReport,
        unserved_health_checks: &[String],
        host_ports_refused: &[(Refusal, usize)],
    ) {
        let total = report.programmed + report.failed.len() + report.unsupported.len();
        let refused = refused_note(host_ports_refused);
        if let Some(first) = unserved_health_checks.first() {
            self.reporter.degraded(format!(
                "{} health check node ports not served: {first}",
                unserved_health_checks.len()
            ));
        } else if let Some(first) = report.failed.first() {
            self.reporter.degraded(format!(
                "{} of {total} frontends not programmed: {first}",
                report.failed.len()
            ));
        } else if let Some(first) = report.removal_errors.first() {
            self.reporter.degraded(format!(
                "{} stale entries not removed: {first}",
                report.removal_errors.len()
            ));
        } else if let Some(first) = report.unsupported.first() {
            self.reporter.ok(format!(
                "{} frontends programmed; {} left out as the datapath does not serve them: {first}; {refused}{}",
                report.programmed,
                report.unsupported.len(),
                self.kube_proxy_replacement()
            ));
        } else {
            self.reporter.ok(format!(
                "{total} frontends programmed; {refused}{}",
                self.kube_proxy_replacement()
            ));
        }
        if report.written + report.removed_frontends + report.removed_backends > 0 {
            tracing::info!(
                frontends = total,
                written = report.written,
                removed_frontends = report.removed_frontends,
                removed_backends = report.removed_backends,
                "services synchronised"
            );
        }
    }

    /// Takes over the ids the pinned maps hold, once: the first pass's first step.
    fn take_over(&self, dp: &Datapath) -> Result<()> {
        let mut state = self.state();
        if state.taken_over() {
            return Ok(());
        }
        let (frontends, backends, lingering) = state.adopt(dp)?;
        tracing::info!(
            "pinned services taken over: {frontends} frontends, {backends} backends, {lingering} rev-NAT entries of removed frontends"
        );
        Ok(())
    }

    /// A pass that [`first_pass`](ServiceLb::first_pass) waits for. One that fails is
    /// reported and retried like any other, not fatal: the maps keep serving what they held.
    async fn first_pass_now(self: &Arc<Self>) -> Result<SyncReport> {
        let pass = self.reconcile().await;
        if let Err(e) = &pass {
            self.reporter.degraded(crate::sync::error_chain(e));
        }
        self.first_pass.send_replace(true);
        pass
    }

    /// Starts the jobs that keep the maps in line (see the module docs).
    fn follow(self: &Arc<Self>, jobs: &Jobs) {
        let trigger = Trigger::new();
        let pull = trigger.clone();
        jobs.observer("watch-changes", self.signals(), move |(), _ctx| {
            pull.trigger();
            async { Ok(()) }
        })
        .add();
        let this = self.clone();
        jobs.timer("reconcile", RESYNC_INTERVAL, move |_ctx| {
            let this = this.clone();
            async move {
                this.first_pass_now().await?;
                Ok::<(), BoxError>(())
            }
        })
        .trigger(trigger)
        .add();
        let this = self.clone();
        jobs.timer("revnat-gc", REV_NAT_GC_INTERVAL, move |ctx| {
            let this = this.clone();
            async move {
                let (deleted, lingering) = tokio::task::spawn_blocking(move || -> Result<_> {
                    let dp = this.loader.datapath()?;
                    let mut state = this.state();
                    let deleted = state.collect_rev_nats(&dp)?;
                    Ok((deleted, state.lingering_rev_nats()))
                })
                .await??;
                if deleted > 0 {
                    tracing::info!(
                        deleted,
                        lingering,
                        "rev-NAT entries of removed frontends deleted"
                    );
                }
                ctx.reporter().ok(format!(
                    "{lingering} rev-NAT entries wait for their connections to end"
                ));
                Ok::<(), BoxError>(())
            }
        })
        .add();
    }

    /// One `()` per change of anything the plans derive from.
    fn signals(&self) -> impl Stream<Item = ()> + Send + Unpin + 'static {
        let unit = |_| ();
        futures::stream::select_all([
            WatchStream::from_changes(self.resources.services.revision())
                .map(unit)
                .boxed(),
            WatchStream::from_changes(self.resources.endpoint_slices.revision())
                .map(unit)
                .boxed(),
            WatchStream::from_changes(self.resources.pods.revision())
                .map(unit)
                .boxed(),
            WatchStream::from_changes(self.endpoints.changes())
                .map(unit)
                .boxed(),
        ])
    }

    fn state(&self) -> MutexGuard<'_, Programmer> {
        // Every pass rewrites the state from the maps, so a poisoned one is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `2 host ports refused (foreign-host-ip 1, taken-by-service 1); ` for the status line, or
/// nothing when none is.
fn refused_note(refused: &[(Refusal, usize)]) -> String {
    let total: usize = refused.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return String::new();
    }
    let by_reason: Vec<String> = refused
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    format!("{total} host ports refused ({}); ", by_reason.join(", "))
}

fn kube_proxy_replacement(sock: bool, host_ports: bool) -> String {
    let host = if host_ports {
        "host ports served"
    } else {
        "host ports need the portmap plugin (enable-host-port off)"
    };
    if sock {
        format!(
            "KubeProxyReplacement: True (ClusterIP, NodePort, ExternalIP and LoadBalancer for pods, outside clients and the node's processes; {host})"
        )
    } else {
        format!(
            "KubeProxyReplacement: False (bpf-lb-sock off: the node's own processes reach services only through kube-proxy; {host})"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{Refusal, kube_proxy_replacement, refused_note};

    #[test]
    fn the_status_line_counts_refused_host_ports_by_reason() {
        assert_eq!(refused_note(&[(Refusal::ForeignHostIp, 0)]), "");
        assert_eq!(
            refused_note(&[
                (Refusal::ForeignHostIp, 1),
                (Refusal::TakenByService, 0),
                (Refusal::TakenByPod, 2)
            ]),
            "3 host ports refused (foreign-host-ip 1, taken-by-pod 2); "
        );
    }

    #[test]
    fn kube_proxy_can_go_only_with_socket_lb() {
        assert!(kube_proxy_replacement(true, true).starts_with("KubeProxyReplacement: True"));
        let without = kube_proxy_replacement(false, true);
        assert!(
            without.starts_with("KubeProxyReplacement: False"),
            "{without}"
        );
        assert!(without.contains("bpf-lb-sock"), "{without}");
        assert!(kube_proxy_replacement(true, false).contains("portmap"));
    }
}

//! The ipcache: claims on prefixes, lookups, and the datapath mirror.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_datapath_bpf::{Datapath, DatapathConfig, IpcacheInfo};
use cellium_hive::{Config, Hook, Jobs, Lifecycle, Reporter, Trigger};
use cellium_identity::Reserved;
use cellium_loader::Loader;
use cellium_resources::NamedPort;
use ipnet::IpNet;
use tokio::sync::watch;

use crate::config::IpcacheConfig;
use crate::error::{Error, Result};
use crate::host;
use crate::named_ports::NamedPortTable;
use crate::source::Source;
use crate::sync::{self, SyncStats};
use crate::table::{Change, IpcacheEntry, PrefixTable};

/// The desired state and the mirror, under one lock so that the map sees writes in the
/// order they were made.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) table: PrefixTable,
    /// The named container ports of the pods behind claimed prefixes.
    pub(crate) named_ports: NamedPortTable,
    /// The datapath once the start hook ran; `None` in memory only.
    pub(crate) datapath: Option<Arc<Datapath>>,
    /// Whether stale map entries may be removed: set by `prune_stale`.
    pub(crate) pruned: bool,
}

/// IP prefixes to security identities, mirrored into the datapath's `cel_ipcache`.
///
/// Several owners claim prefixes ([`Source`]); the claim of highest precedence is in effect
/// and is what the datapath sees, and deleting it reveals the next one. The node's own
/// addresses are claimed by the ipcache itself, as [`Source::Host`] with the host identity,
/// read from the agent's network namespace at start and then periodically (loopback and
/// IPv6 link-local addresses are left out: no pod reaches the node through them).
///
/// The mirror: from the start hook on, every change is written to the map as it is made, and
/// [`upsert`](Ipcache::upsert) returns once the datapath sees it. At start the map is **not**
/// flushed: entries of the previous run keep the datapath enforcing until the owners have
/// restored theirs, and only [`prune_stale`](Ipcache::prune_stale) removes what nobody
/// claimed again. The `ipcache-sync` job repairs failed writes and, once pruned, drift.
///
/// ```
/// use cellium_ipcache::{Ipcache, Source};
///
/// let ipc = Ipcache::in_memory();
/// ipc.upsert("10.0.0.0/8".parse()?, 16_777_216, Source::Policy)?;
/// ipc.upsert("10.0.0.5/32".parse()?, 300, Source::Endpoint)?;
/// let (prefix, id, source) = ipc.lookup("10.0.0.5".parse()?).unwrap();
/// assert_eq!((prefix.to_string(), id, source), ("10.0.0.5/32".into(), 300, Source::Endpoint));
/// assert_eq!(ipc.lookup("10.9.9.9".parse()?).unwrap().1, 16_777_216);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Ipcache {
    state: Mutex<State>,
    sync: Trigger,
    host: Trigger,
    /// Counts changes that may have changed [`Ipcache::named_ports`].
    named_port_changes: watch::Sender<u64>,
}

impl Ipcache {
    /// The cell's constructor: the mirror starts in the `mirror-datapath` start hook; the
    /// `host-addresses` and `ipcache-sync` jobs run after it.
    pub fn new(
        cfg: Config<IpcacheConfig>,
        lc: Lifecycle,
        jobs: Jobs,
        reporter: Reporter,
        loader: Arc<Loader>,
    ) -> Arc<Ipcache> {
        let ipc = Arc::new(Ipcache::empty());
        let this = ipc.clone();
        lc.append(Hook::new("mirror-datapath").on_start(move |_| async move {
            let dp = loader.datapath().map_err(Error::Loader)?;
            let stats = tokio::task::spawn_blocking(move || this.attach(dp)).await??;
            reporter.ok(format!(
                "mirrored: {} entries, {} written at start",
                stats.entries, stats.written
            ));
            Ok(())
        }));
        // The first read of the node's addresses happens as soon as the jobs start.
        ipc.host.trigger();
        let this = ipc.clone();
        jobs.timer(
            "host-addresses",
            cfg.ipcache_host_refresh_interval,
            move |ctx| {
                let ipc = this.clone();
                async move {
                    let n = ipc.sync_host_addresses().await?;
                    ctx.reporter().ok(format!("{n} node addresses"));
                    Ok(())
                }
            },
        )
        .trigger(ipc.host.clone())
        .add();
        let this = ipc.clone();
        jobs.timer("ipcache-sync", cfg.ipcache_sync_interval, move |ctx| {
            let ipc = this.clone();
            async move {
                let stats = tokio::task::spawn_blocking(move || ipc.resync()).await??;
                ctx.reporter().ok(format!(
                    "{} entries in sync ({} repaired, {} stale removed)",
                    stats.entries, stats.written, stats.removed
                ));
                Ok(())
            }
        })
        .trigger(ipc.sync.clone())
        .add();
        ipc
    }

    /// An ipcache in memory only, not mirrored into a datapath and without the node's
    /// addresses: for tools, tests and benchmarks outside a hive.
    pub fn in_memory() -> Arc<Ipcache> {
        Arc::new(Ipcache::empty())
    }

    fn empty() -> Ipcache {
        Ipcache {
            state: Mutex::new(State::default()),
            sync: Trigger::new(),
            host: Trigger::new(),
            named_port_changes: watch::channel(0).0,
        }
    }

    /// Records `source`'s claim that `prefix` (host bits cleared) has `identity`, replacing
    /// its earlier claim of the prefix. When the claim is the one in effect and the mirror
    /// runs, the map is written before this returns.
    ///
    /// Errors: identity 0 (nothing changes); a failed map write ([`Error::Write`]): the
    /// claim is kept and the `ipcache-sync` job retries the write, the error tells the
    /// caller that the datapath does not see it yet.
    ///
    /// `info` is an identity, or an [`IpcacheInfo`] that also names the node hosting the
    /// prefix (tunnel mode).
    pub fn upsert(
        &self,
        prefix: IpNet,
        info: impl Into<IpcacheInfo>,
        source: Source,
    ) -> Result<()> {
        let info = info.into();
        if info.identity == 0 {
            return Err(Error::ZeroIdentity {
                prefix,
                claimant: source,
            });
        }
        let mut state = self.lock();
        let change = state.table.claim(prefix, source, info);
        // The prefix's ports may now count for another identity, or another claim's.
        if state.named_ports.has(prefix) {
            self.named_ports_changed();
        }
        self.mirror(&state, change)
    }

    /// Removes `source`'s claim of `prefix`; returns whether it had one. The next claim (in
    /// precedence order) takes effect, or the prefix is removed from the map when none is
    /// left. A failed map write is reported as in [`upsert`](Ipcache::upsert), the claim
    /// being removed all the same.
    pub fn delete(&self, prefix: IpNet, source: Source) -> Result<bool> {
        let mut state = self.lock();
        let Some(change) = state.table.unclaim(prefix, source) else {
            return Ok(false);
        };
        // The claim's ports go with it; another claim's may now be in effect.
        if state.named_ports.remove(prefix, source) || state.named_ports.has(prefix) {
            self.named_ports_changed();
        }
        self.mirror(&state, change)?;
        Ok(true)
    }

    /// Records the named container ports of the pod behind `source`'s claim on `prefix` (an
    /// empty list forgets them): the numbers egress policy rules' port names stand for when
    /// the prefix's identity is the peer. They live as long as the claim, move with its
    /// identity, and count only while it is the claim in effect. Returns whether anything
    /// changed; ports for a prefix `source` does not claim are ignored (`false`): the claim
    /// comes first.
    pub fn set_named_ports(&self, prefix: IpNet, source: Source, ports: &[NamedPort]) -> bool {
        let mut state = self.lock();
        if state.table.claim_of(prefix, source).is_none() {
            return false;
        }
        let changed = state.named_ports.set(prefix, source, ports);
        if changed {
            self.named_ports_changed();
        }
        changed
    }

    /// The named ports of the claims in effect, united per identity (each list sorted by
    /// name, protocol and port): for each identity, the numbers its pods give each name.
    pub fn named_ports(&self) -> BTreeMap<u32, Vec<NamedPort>> {
        let state = self.lock();
        state.named_ports.by_identity(&state.table)
    }

    /// A receiver whose value changes after every change that may have changed
    /// [`named_ports`](Ipcache::named_ports) (ports set, a claim with ports deleted, or the
    /// identity of a prefix with ports changed).
    pub fn named_port_changes(&self) -> watch::Receiver<u64> {
        self.named_port_changes.subscribe()
    }

    fn named_ports_changed(&self) {
        self.named_port_changes.send_modify(|n| *n += 1);
    }

    /// The longest prefix containing `ip`, with the identity in effect and its source.
    /// `None` means the datapath sees the world ([`Ipcache::world_identity`]).
    pub fn lookup(&self, ip: IpAddr) -> Option<(IpNet, u32, Source)> {
        self.lock().table.lookup(ip)
    }

    /// The identity the datapath gives `ip` when no prefix holds it: world (2), or
    /// world-ipv4 (9) or world-ipv6 (10) on a node whose datapath splits the world by family
    /// (a node with pods of both families, as Cilium's dual-stack mode). World in memory only.
    pub fn world_identity(&self, ip: IpAddr) -> u32 {
        let datapath = self.lock().datapath.clone();
        let per_family = datapath
            .and_then(|dp| dp.config().get().ok())
            .is_some_and(|c| c.flags & DatapathConfig::WORLD_PER_FAMILY != 0);
        match (per_family, ip) {
            (false, _) => Reserved::World.id(),
            (true, IpAddr::V4(_)) => Reserved::WorldIpv4.id(),
            (true, IpAddr::V6(_)) => Reserved::WorldIpv6.id(),
        }
    }

    /// The entry of exactly `prefix` (host bits cleared).
    pub fn get(&self, prefix: IpNet) -> Option<IpcacheEntry> {
        self.lock().table.get(prefix)
    }

    /// Every entry, ordered by prefix.
    pub fn list(&self) -> Vec<IpcacheEntry> {
        self.lock().table.list()
    }

    /// Removes from the datapath's map every entry that no claim backs (what a previous run
    /// left behind), corrects entries that differ, and from then on lets the `ipcache-sync`
    /// job remove such entries too. Returns what it did.
    ///
    /// Contract: the endpoint manager calls this once, after it restored every endpoint
    /// (and so re-claimed every pod address still in use), and after the policy repository
    /// claimed its prefixes. Before it, the map keeps the previous run's entries, so that
    /// traffic of pods not yet restored is still classified as before; calling it earlier
    /// would make those pods `world` for a moment.
    ///
    /// It walks the map (a few milliseconds per ten thousand entries) under the ipcache's
    /// lock: call it from a blocking context. Errors: the mirror has not started, or the
    /// map cannot be read or written.
    pub fn prune_stale(&self) -> Result<SyncStats> {
        let mut state = self.lock();
        if state.datapath.is_none() {
            return Err(Error::NotMirrored);
        }
        state.pruned = true;
        let stats = sync::reconcile(&state, true)?;
        tracing::info!(
            entries = stats.entries,
            removed = stats.removed,
            "stale ipcache entries pruned"
        );
        Ok(stats)
    }

    /// Asks for the node's addresses to be read again soon (after the endpoint manager
    /// created or addressed the host device, say). Returns at once; see
    /// [`sync_host_addresses`](Ipcache::sync_host_addresses) to wait for it.
    pub fn refresh_host_addresses(&self) {
        self.host.trigger();
    }

    /// Reads the node's addresses now and makes them exactly the [`Source::Host`] claims,
    /// each address as a /32 or /128 with the host identity. Returns how many there are.
    pub async fn sync_host_addresses(&self) -> Result<usize> {
        let addrs = host::node_addresses().await?;
        self.set_host_addresses(&addrs)?;
        Ok(addrs.len())
    }

    /// Makes `addrs` exactly the [`Source::Host`] claims; every claim is updated even when
    /// a map write fails, and the first failure is returned.
    pub(crate) fn set_host_addresses(&self, addrs: &BTreeSet<IpAddr>) -> Result<()> {
        let wanted: HashSet<IpNet> = addrs.iter().map(|a| IpNet::from(*a)).collect();
        let mut state = self.lock();
        let mut first_err = None;
        for gone in state.table.claimed_by(Source::Host) {
            if !wanted.contains(&gone)
                && let Some(change) = state.table.unclaim(gone, Source::Host)
            {
                tracing::info!(prefix = %gone, "node address gone");
                first_err = first_err.or(self.mirror(&state, change).err());
            }
        }
        for prefix in wanted {
            let host = Reserved::Host.id();
            if state.table.get(prefix).is_some_and(|e| {
                e.source == Source::Host && e.identity == host
                    || e.shadowed.contains(&(Source::Host, host))
            }) {
                continue;
            }
            tracing::info!(%prefix, "node address");
            let change = state.table.claim(prefix, Source::Host, host);
            first_err = first_err.or(self.mirror(&state, change).err());
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Starts the mirror on `dp`: writes what was claimed so far, removes nothing.
    fn attach(&self, dp: Arc<Datapath>) -> Result<SyncStats> {
        let mut state = self.lock();
        state.datapath = Some(dp);
        sync::reconcile(&state, false)
    }

    /// The `ipcache-sync` job's run.
    fn resync(&self) -> Result<SyncStats> {
        let state = self.lock();
        if state.datapath.is_none() {
            return Err(Error::NotMirrored);
        }
        let prune = state.pruned;
        sync::reconcile(&state, prune)
    }

    /// Writes a change in effect to the map, if the mirror runs.
    fn mirror(&self, state: &State, change: Change) -> Result<()> {
        if !change.is_visible() {
            return Ok(());
        }
        let Some(dp) = state.datapath.clone() else {
            return Ok(());
        };
        sync::write(&dp, change).inspect_err(|e| {
            tracing::warn!(prefix = %change.prefix, error = %e, "ipcache write failed; retrying");
            // The sync job compares the whole map, so it repairs this prefix too.
            self.sync.trigger();
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Each mutation leaves the table consistent before anything can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn claims_stack_by_precedence() {
        let ipc = Ipcache::in_memory();
        let p = net("10.0.0.5/32");
        ipc.upsert(p, 16_777_300, Source::Policy).unwrap();
        ipc.upsert(p, 300, Source::Endpoint).unwrap();
        assert_eq!(ipc.lookup(ip("10.0.0.5")), Some((p, 300, Source::Endpoint)));
        assert!(ipc.delete(p, Source::Endpoint).unwrap());
        assert!(!ipc.delete(p, Source::Endpoint).unwrap());
        assert_eq!(
            ipc.lookup(ip("10.0.0.5")),
            Some((p, 16_777_300, Source::Policy))
        );
        assert!(ipc.delete(p, Source::Policy).unwrap());
        assert_eq!(ipc.lookup(ip("10.0.0.5")), None);
    }

    #[test]
    fn identity_zero_is_refused_and_changes_nothing() {
        let ipc = Ipcache::in_memory();
        let err = ipc
            .upsert(net("10.0.0.0/8"), 0, Source::Policy)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "prefix 10.0.0.0/8 cannot map to identity 0 (claimed by policy)"
        );
        assert!(ipc.list().is_empty());
    }

    #[test]
    fn host_addresses_replace_the_previous_set() {
        let ipc = Ipcache::in_memory();
        ipc.upsert(net("10.0.0.1/32"), 300, Source::Endpoint)
            .unwrap();
        let set = |addrs: &[&str]| {
            let addrs: BTreeSet<IpAddr> = addrs.iter().map(|a| ip(a)).collect();
            ipc.set_host_addresses(&addrs).unwrap();
        };
        set(&["192.168.1.1", "fd00::1", "10.0.0.1"]);
        assert_eq!(
            ipc.lookup(ip("192.168.1.1")).map(|e| (e.1, e.2)),
            Some((1, Source::Host))
        );
        assert_eq!(
            ipc.lookup(ip("fd00::1")).map(|e| e.0),
            Some(net("fd00::1/128"))
        );
        // The endpoint's claim stays in effect; the host's waits under it.
        let e = ipc.get(net("10.0.0.1/32")).unwrap();
        assert_eq!(
            (e.source, e.shadowed.clone()),
            (Source::Endpoint, vec![(Source::Host, 1)])
        );
        set(&["192.168.1.2"]);
        assert_eq!(ipc.lookup(ip("192.168.1.1")), None);
        assert_eq!(ipc.lookup(ip("fd00::1")), None);
        assert_eq!(ipc.get(net("10.0.0.1/32")).unwrap().shadowed, vec![]);
        assert_eq!(ipc.list().len(), 2);
    }

    #[test]
    fn named_ports_follow_their_claim_and_announce_changes() {
        use cellium_resources::Protocol;
        let ipc = Ipcache::in_memory();
        let mut changes = ipc.named_port_changes();
        let http = |port| NamedPort {
            name: "http".into(),
            port,
            protocol: Protocol::Tcp,
        };
        let p = net("10.0.0.5/32");
        assert!(
            !ipc.set_named_ports(p, Source::Endpoint, &[http(80)]),
            "no claim yet"
        );
        ipc.upsert(p, 300, Source::Endpoint).unwrap();
        assert!(ipc.set_named_ports(p, Source::Endpoint, &[http(80)]));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert!(!ipc.set_named_ports(p, Source::Endpoint, &[http(80)]));
        assert!(!changes.has_changed().unwrap(), "nothing changed");
        assert_eq!(ipc.named_ports()[&300], vec![http(80)]);
        // A new identity for the address: its ports count for that identity now.
        ipc.upsert(p, 301, Source::Endpoint).unwrap();
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(
            ipc.named_ports().into_iter().collect::<Vec<_>>(),
            vec![(301, vec![http(80)])]
        );
        // The claim goes, its ports with it: a claim made again has none.
        assert!(ipc.delete(p, Source::Endpoint).unwrap());
        assert!(changes.has_changed().unwrap());
        assert!(ipc.named_ports().is_empty());
        ipc.upsert(p, 301, Source::Endpoint).unwrap();
        assert!(ipc.named_ports().is_empty());
    }

    #[test]
    fn the_mirror_needs_a_datapath() {
        let ipc = Ipcache::in_memory();
        assert!(matches!(ipc.prune_stale(), Err(Error::NotMirrored)));
        assert!(matches!(ipc.resync(), Err(Error::NotMirrored)));
    }

    #[tokio::test]
    async fn the_node_addresses_are_read_from_the_namespace() {
        // Read-only: lists the addresses of the test's own network namespace.
        let ipc = Ipcache::in_memory();
        let n = ipc.sync_host_addresses().await.unwrap();
        let host: Vec<IpcacheEntry> = ipc
            .list()
            .into_iter()
            .filter(|e| e.source == Source::Host)
            .collect();
        assert_eq!(host.len(), n);
        assert!(
            host.iter()
                .all(|e| e.identity == 1 && e.prefix.prefix_len() == e.prefix.max_prefix_len())
        );
        assert!(host.iter().all(|e| !e.prefix.addr().is_loopback()));
    }
}

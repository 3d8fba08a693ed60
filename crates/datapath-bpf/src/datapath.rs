//! [`Datapath`]: the loaded object, its pinned maps and its attachments.

use std::collections::BTreeMap;
use std::fs;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapHandle, OpenObject, PrintLevel, Program};

use crate::abi::{DatapathConfig, LAYOUT_VERSION};
use crate::attach::{
    self, AttachAction, AttachKind, AttachMode, Attacher, Attachment, Hook, Programs,
};
use crate::bpffs;
use crate::error::{Error, Result};
use crate::events::EventReader;
use crate::maps::TypedMap;
use crate::maps::affinity::AffinityMatch;
use crate::maps::config::ConfigMap;
use crate::maps::conntrack::Conntrack;
use crate::maps::endpoints::Endpoints;
use crate::maps::frag::Fragments;
use crate::maps::ipcache::Ipcache;
use crate::maps::ipmasq::NonMasquerade;
use crate::maps::lb::{FamilyMaps, Services};
use crate::maps::maglev::MaglevTables;
use crate::maps::metrics::Metrics;
use crate::maps::policy::PolicyMap;
use crate::maps::snat::SnatTable;
use crate::maps::source_range::SourceRanges;
use crate::pinning::{self, MapOrigin, MapReport};
use crate::programs::{self, Parts, ProgramOrigin};
use crate::skel::DatapathSkelBuilder;
use crate::sock::{self, SockHook};
use crate::sys;

/// How to open the datapath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatapathOptions {
    /// Where maps (`maps/`) and links (`links/`) are pinned. Mounted as
    /// bpffs if it is not one already.
    pub bpf_root: PathBuf,
    /// tcx, clsact, or tcx with a clsact fallback.
    pub attach_mode: AttachMode,
}

impl Default for DatapathOptions {
    fn default() -> Self {
        Self {
            bpf_root: PathBuf::from("/sys/fs/bpf/cellium"),
            attach_mode: AttachMode::Auto,
        }
    }
}

/// What attaching did on one hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookAttach {
    /// The hook.
    pub hook: Hook,
    /// tcx or clsact.
    pub kind: AttachKind,
    /// Created or replaced.
    pub action: AttachAction,
}

/// The loaded datapath. Cheap to share (`Send + Sync`, put it in an `Arc`):
/// map operations and attachments are independent kernel calls.
///
/// Dropping it detaches nothing and unpins nothing: programs stay attached
/// through their pinned links and maps through their pins, which is what
/// lets a restarted agent pick up where this one stopped.
#[derive(Debug)]
pub struct Datapath {
    root: PathBuf,
    endpoints: Endpoints,
    ipcache: Ipcache,
    ipmasq: NonMasquerade,
    /// `cel_netdevs`: the devices `cel_from_netdev` is attached to (masquerading leaves by
    /// them only).
    netdevs: TypedMap<u32, u8>,
    policy: PolicyMap,
    conntrack: Conntrack,
    fragments: Fragments,
    services: Services,
    maglev: MaglevTables,
    affinity_match: AffinityMatch,
    source_ranges: SourceRanges,
    config: ConfigMap,
    metrics: Metrics,
    events: MapHandle,
    from_container: OwnedFd,
    to_container: OwnedFd,
    from_overlay: OwnedFd,
    to_overlay: OwnedFd,
    from_netdev: OwnedFd,
    /// The socket-level load balancer's programs, in [`SockHook::ALL`]'s order.
    sock: [OwnedFd; 8],
    attacher: Attacher,
    maps_report: Vec<MapReport>,
    program_origin: ProgramOrigin,
}

/// libbpf's own messages go to `tracing` instead of stderr: expected
/// failures (probing a clsact filter that does not exist yet) are not
/// worth a warning, and the agent's log is the one place to look.
fn route_libbpf_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        fn log(level: PrintLevel, msg: String) {
            let msg = msg.trim_end();
            match level {
                PrintLevel::Warn => tracing::debug!(target: "libbpf", "{msg}"),
                _ => tracing::trace!(target: "libbpf", "{msg}"),
            }
        }
        libbpf_rs::set_print(Some((PrintLevel::Debug, log)));
    });
}

impl Parts {
    fn map(&mut self, name: &'static str) -> Result<MapHandle> {
        self.maps.remove(name).ok_or_else(|| missing(name))
    }

    fn typed<K, V>(&mut self, name: &'static str) -> Result<TypedMap<K, V>>
    where
        K: crate::abi::Plain,
        V: crate::abi::Plain,
    {
        Ok(TypedMap::new(name, self.map(name)?))
    }

    fn prog(&mut self, name: &'static str) -> Result<OwnedFd> {
        self.progs.remove(name).ok_or_else(|| missing(name))
    }
}

fn missing(name: &'static str) -> Error {
    Error::Handle {
        object: name,
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "not in the object"),
    }
}

fn handle_error(name: &str, e: impl std::fmt::Display) -> Error {
    Error::Handle {
        object: "a map or program of the object",
        source: std::io::Error::other(format!("{name}: {e}")),
    }
}

/// Loads the object (the verifier runs), creating or reusing the pinned maps, and pins its
/// programs for the next open of this build.
fn load(
    mut open: crate::skel::OpenDatapathSkel<'_>,
    maps_dir: &Path,
    programs_dir: &Path,
) -> Result<(Parts, Vec<MapReport>)> {
    let plan = pinning::prepare(open.open_object_mut(), maps_dir)?;
    let skel = open.load().map_err(Error::LoadObject)?;
    let object = skel.object();
    let mut parts = Parts {
        maps: BTreeMap::new(),
        progs: BTreeMap::new(),
    };
    for map in object.maps() {
        let name = map.name().to_string_lossy().into_owned();
        let handle = MapHandle::try_from(&map).map_err(|e| handle_error(&name, e))?;
        parts.maps.insert(name, handle);
    }
    for prog in object.progs() {
        let name = prog.name().to_string_lossy().into_owned();
        let fd = prog
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| handle_error(&name, e))?;
        parts.progs.insert(name, fd);
    }
    // The object's own descriptors close with it; ours keep everything.
    drop(skel);

    let mut reports = plan.reports;
    for m in plan.migrations {
        let Some(new) = parts.maps.get(&m.name) else {
            continue;
        };
        let entries = pinning::migrate(&m, new);
        if let Some(r) = reports.iter_mut().find(|r| r.name == m.name) {
            r.origin = MapOrigin::Migrated {
                reason: m.reason,
                entries,
            };
        }
    }

    let pins: Vec<_> = parts
        .progs
        .iter()
        .map(|(name, fd)| (name.clone(), fd.as_fd()))
        .collect();
    if let Err(error) = programs::pin(programs_dir, &pins) {
        // Loaded all the same: the next start verifies again.
        tracing::warn!(%error, dir = %programs_dir.display(), "cannot pin the programs for the next start");
    }
    Ok((parts, reports))
}

impl Datapath {
    /// Mounts bpffs if needed, creates or reuses the pinned maps (see [`crate::pinning`])
    /// and loads the programs, or takes those an earlier open of this build loaded against
    /// the same maps (see [`crate::programs`]). Nothing is attached yet.
    pub fn open(options: DatapathOptions) -> Result<Self> {
        route_libbpf_logs();
        let root = options.bpf_root;
        bpffs::ensure_bpffs(&root)?;
        let maps_dir = root.join("maps");
        let programs_dir = root.join("programs");
        let links_dir = attach::links_dir(&root);
        for dir in [&maps_dir, &links_dir] {
            fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
                path: dir.clone(),
                source,
            })?;
        }

        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let open = DatapathSkelBuilder::default()
            .open(&mut storage)
            .map_err(Error::OpenObject)?;
        let (parts, maps_report, program_origin) =
            match programs::reuse(open.open_object(), &programs_dir, &maps_dir) {
                Ok(parts) => {
                    let reports = parts
                        .maps
                        .keys()
                        .map(|name| MapReport {
                            name: name.clone(),
                            origin: MapOrigin::Reused,
                        })
                        .collect();
                    tracing::info!("reusing the programs pinned by this build");
                    (parts, reports, ProgramOrigin::Reused)
                }
                Err(reason) => {
                    tracing::info!(%reason, "loading the programs");
                    let (parts, reports) = load(open, &maps_dir, &programs_dir)?;
                    (parts, reports, ProgramOrigin::Loaded { reason })
                }
            };
        let dp = Self::assemble(
            parts,
            root,
            Attacher::new(links_dir, options.attach_mode),
            maps_report,
            program_origin,
        )?;
        if dp.config.get()?.layout_version != LAYOUT_VERSION {
            dp.config.set(&DatapathConfig::default())?;
        }
        let restored = dp.policy.reconcile_pins()?;
        if restored > 0 {
            tracing::info!(
                maps = restored,
                "endpoint policy maps put back into cel_policy"
            );
        }
        Ok(dp)
    }

    fn assemble(
        mut p: Parts,
        root: PathBuf,
        attacher: Attacher,
        maps_report: Vec<MapReport>,
        program_origin: ProgramOrigin,
    ) -> Result<Self> {
        Ok(Self {
            endpoints: Endpoints::new(p.typed("cel_endpoints")?),
            ipcache: Ipcache::new(p.typed("cel_ipcache")?),
            ipmasq: NonMasquerade::new(p.typed("cel_ipmasq")?),
            netdevs: p.typed("cel_netdevs")?,
            policy: PolicyMap::new(p.map("cel_policy")?, root.join("maps")),
            conntrack: Conntrack::new(
                p.typed("cel_ct4")?,
                p.typed("cel_ct6")?,
                SnatTable {
                    snat: p.typed("cel_snat4")?,
                },
                SnatTable {
                    snat: p.typed("cel_snat6")?,
                },
            ),
            fragments: Fragments::new(p.typed("cel_frag4")?, p.typed("cel_frag6")?),
            services: Services::new(
                FamilyMaps {
                    services: p.typed("cel_lb4_services")?,
                    backends: p.typed("cel_lb4_backends")?,
                    revnat: p.typed("cel_lb4_revnat")?,
                },
                FamilyMaps {
                    services: p.typed("cel_lb6_services")?,
                    backends: p.typed("cel_lb6_backends")?,
                    revnat: p.typed("cel_lb6_revnat")?,
                },
            ),
            maglev: MaglevTables::new(p.typed("cel_lb_maglev")?),
            affinity_match: AffinityMatch::new(p.typed("cel_lb_affinity_match")?),
            source_ranges: SourceRanges::new(
                p.typed("cel_lb4_source_range")?,
                p.typed("cel_lb6_source_range")?,
            ),
            config: ConfigMap::new(p.typed("cel_config")?),
            metrics: Metrics::new(p.typed("cel_metrics")?),
            events: p.map("cel_events")?,
            from_container: p.prog("cel_from_container")?,
            to_container: p.prog("cel_to_container")?,
            from_overlay: p.prog("cel_from_overlay")?,
            to_overlay: p.prog("cel_to_overlay")?,
            from_netdev: p.prog("cel_from_netdev")?,
            sock: [
                p.prog("cel_sock4_connect")?,
                p.prog("cel_sock4_sendmsg")?,
                p.prog("cel_sock4_recvmsg")?,
                p.prog("cel_sock4_getpeername")?,
                p.prog("cel_sock6_connect")?,
                p.prog("cel_sock6_sendmsg")?,
                p.prog("cel_sock6_recvmsg")?,
                p.prog("cel_sock6_getpeername")?,
            ],
            attacher,
            root,
            maps_report,
            program_origin,
        })
    }

    /// The BPF root.
    pub fn bpf_root(&self) -> &Path {
        &self.root
    }

    /// What happened to each map at open (reused, created, ...).
    pub fn maps_report(&self) -> &[MapReport] {
        &self.maps_report
    }

    /// Whether the programs were loaded at open or taken from an earlier open's pins.
    pub fn program_origin(&self) -> &ProgramOrigin {
        &self.program_origin
    }

    /// Local endpoints.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// Prefix -> identity.
    pub fn ipcache(&self) -> &Ipcache {
        &self.ipcache
    }

    /// The destinations masquerading leaves alone.
    pub fn ipmasq(&self) -> &NonMasquerade {
        &self.ipmasq
    }

    /// Policy entries.
    pub fn policy(&self) -> &PolicyMap {
        &self.policy
    }

    /// Connection tracking.
    pub fn conntrack(&self) -> &Conntrack {
        &self.conntrack
    }

    /// Datagrams being fragmented, with their first fragment's ports.
    pub fn fragments(&self) -> &Fragments {
        &self.fragments
    }

    /// ClusterIP services, backends and reverse NAT.
    pub fn services(&self) -> &Services {
        &self.services
    }

    /// The maglev tables of the frontends balanced by maglev.
    pub fn maglev(&self) -> &MaglevTables {
        &self.maglev
    }

    /// Which backends each frontend with session affinity has.
    pub fn affinity_match(&self) -> &AffinityMatch {
        &self.affinity_match
    }

    /// The load balancer source range maps (`cel_lb4_source_range`, `cel_lb6_source_range`).
    pub fn source_ranges(&self) -> &SourceRanges {
        &self.source_ranges
    }

    /// Datapath-wide settings.
    pub fn config(&self) -> &ConfigMap {
        &self.config
    }

    /// Counters by direction and reason.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A new reader of the events ring buffer.
    pub fn events(&self) -> Result<EventReader> {
        let map = MapHandle::try_from(&self.events).map_err(|e| Error::Handle {
            object: "cel_events",
            source: std::io::Error::other(e.to_string()),
        })?;
        EventReader::new(map)
    }

    /// Kernel ids of the loaded (from-container, to-container) programs.
    pub fn program_ids(&self) -> Result<(u32, u32)> {
        let id = |name: &'static str, fd: &OwnedFd| {
            Program::id_from_fd(fd.as_fd()).map_err(|e| Error::Handle {
                object: name,
                source: std::io::Error::other(e.to_string()),
            })
        };
        Ok((
            id("cel_from_container", &self.from_container)?,
            id("cel_to_container", &self.to_container)?,
        ))
    }

    fn programs(&self) -> Programs<'_> {
        Programs {
            from_container: self.from_container.as_fd(),
            to_container: self.to_container.as_fd(),
            from_overlay: self.from_overlay.as_fd(),
            to_overlay: self.to_overlay.as_fd(),
            from_netdev: self.from_netdev.as_fd(),
        }
    }

    /// Attaches both programs to a pod's host-side veth (in the calling
    /// thread's network namespace), or switches an existing attachment to
    /// this datapath's programs without a moment in between.
    pub fn attach(&self, ifindex: u32) -> Result<Vec<HookAttach>> {
        self.attach_hooks(ifindex, &Hook::ENDPOINT)
    }

    /// Detaches both programs from `ifindex`. Nothing attached is fine.
    pub fn detach(&self, ifindex: u32) -> Result<()> {
        self.attacher
            .detach(&self.programs(), ifindex, &Hook::ENDPOINT)
    }

    /// Attaches `cel_from_overlay` and `cel_to_overlay` to the node's VXLAN device (tunnel
    /// mode), or switches existing attachments to this datapath's programs.
    pub fn attach_overlay(&self, ifindex: u32) -> Result<Vec<HookAttach>> {
        self.attach_hooks(ifindex, &Hook::OVERLAY)
    }

    /// Detaches the overlay programs from `ifindex`. Nothing attached is fine.
    pub fn detach_overlay(&self, ifindex: u32) -> Result<()> {
        self.attacher
            .detach(&self.programs(), ifindex, &Hook::OVERLAY)
    }

    /// Attaches `cel_from_netdev` to the ingress of a device holding one of the node's
    /// addresses, or switches an existing attachment to this datapath's program.
    /// The device is then one masquerading may leave by (`cel_netdevs`).
    pub fn attach_netdev(&self, ifindex: u32) -> Result<Vec<HookAttach>> {
        let done = self.attach_hooks(ifindex, &Hook::NETDEV)?;
        self.netdevs.put(&ifindex, &1)?;
        Ok(done)
    }

    /// Detaches `cel_from_netdev` from `ifindex`. Nothing attached is fine.
    pub fn detach_netdev(&self, ifindex: u32) -> Result<()> {
        self.netdevs.delete(&ifindex)?;
        self.attacher
            .detach(&self.programs(), ifindex, &Hook::NETDEV)
    }

    fn attach_hooks(&self, ifindex: u32, hooks: &[Hook]) -> Result<Vec<HookAttach>> {
        Ok(self
            .attacher
            .attach(&self.programs(), ifindex, hooks)?
            .into_iter()
            .map(|(hook, kind, action)| HookAttach { hook, kind, action })
            .collect())
    }

    /// Turns the socket-level load balancer on for the sockets of the calling thread's
    /// network namespace (the node's) in the cgroup v2 directory `cgroup` and below: attaches
    /// the `cel_sock*` programs there, or moves the pinned links to this datapath's programs,
    /// then names the namespace in `cel_config`.
    pub fn attach_sock_lb(&self, cgroup: &Path) -> Result<Vec<(SockHook, AttachAction)>> {
        let progs = self.sock.each_ref().map(|fd| fd.as_fd());
        let done = sock::attach(&attach::links_dir(&self.root), &progs, cgroup)?;
        let cookie = sys::netns_cookie().map_err(|source| Error::Handle {
            object: "the network namespace's cookie (SO_NETNS_COOKIE)",
            source,
        })?;
        self.config.set_host_netns_cookie(cookie)?;
        Ok(done)
    }

    /// Turns the socket-level load balancer off: no namespace in `cel_config` (sockets are
    /// left as they are from now on), then the links detached and unpinned. Returns how many
    /// links there were.
    pub fn detach_sock_lb(&self) -> Result<usize> {
        self.config.set_host_netns_cookie(0)?;
        sock::detach(&attach::links_dir(&self.root))
    }

    /// The socket-level load balancer's attached hooks, with the id of their cgroup.
    pub fn sock_lb_attached(&self) -> Result<Vec<(SockHook, u64)>> {
        sock::attached(&attach::links_dir(&self.root))
    }

    /// Current attachments: live pinned tcx links, and clsact filters
    /// attached by this process.
    pub fn attached(&self) -> Result<Vec<Attachment>> {
        self.attacher.list()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Send + Sync>() {}
    fn movable<T: Send>() {}

    #[test]
    fn the_datapath_can_be_shared_across_tasks() {
        shareable::<Datapath>();
        shareable::<std::sync::Arc<Datapath>>();
        movable::<EventReader>();
    }
}

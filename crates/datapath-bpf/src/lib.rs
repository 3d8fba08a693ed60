//! The Cellium eBPF datapath, from Rust.
//!
//! `bpf/datapath.bpf.c` is compiled into a libbpf skeleton at build time.
//! [`Datapath::open`] mounts bpffs at the configured root if needed, creates
//! or reuses the maps pinned under `<root>/maps` (a restarted agent keeps
//! conntrack, policy and services), and loads the programs, or takes those an
//! earlier open of the same build pinned under `<root>/programs` ([`programs`]);
//! [`Datapath::attach`] puts `cel_from_container` and `cel_to_container` on
//! a pod's host-side veth with pinned tcx links (clsact as fallback) and
//! replaces the programs of an existing attachment atomically.
//!
//! Every map has a typed wrapper ([`maps`]) speaking `IpAddr` (each family's maps behind
//! one wrapper: conntrack, fragments, services), [`MacAddr`],
//! [`Direction`], [`Protocol`]; the raw `#[repr(C)]` mirrors of the C
//! structs live in [`abi`] and are tested against the headers. The policy
//! model (directions, protocols, verdicts, rules, their compilation and the
//! decision over the entries) is the `cellium-policy` crate's, re-exported
//! here; [`compile_policy`] compiles an endpoint's rules into its policy map
//! entries. [`events::EventReader`] reads drops and verdicts, blocking or
//! async; [`maps::conntrack::Conntrack::gc`] removes expired connections and
//! [`maps::conntrack::Conntrack::flush_addresses`] those of a removed endpoint.
//!
//! Where to start: `docs/datapath.md` describes the packet walk and maps.
//!
//! ```no_run
//! use std::net::Ipv4Addr;
//! use cellium_datapath_bpf::{Datapath, DatapathOptions, EndpointFlags, EndpointInfo, MacAddr};
//!
//! # fn main() -> cellium_datapath_bpf::Result<()> {
//! let dp = Datapath::open(DatapathOptions::default())?;
//! let info = EndpointInfo {
//!     ifindex: 12,
//!     id: 1,
//!     flags: EndpointFlags::NONE,
//!     identity: 1000,
//!     host_mac: "02:00:00:00:00:01".parse()?,
//!     pod_mac: "02:00:00:00:00:02".parse::<MacAddr>()?,
//!     cluster_identity: 1000,
//! };
//! dp.endpoints().put(Ipv4Addr::new(10, 200, 0, 2).into(), &info)?;
//! dp.attach(12)?;
//! # Ok(())
//! # }
//! ```

pub mod abi;
mod attach;
pub mod bpffs;
mod clock;
mod datapath;
mod error;
pub mod events;
pub mod maps;
pub mod pinning;
pub mod programs;
mod sock;
mod sys;
mod types;

// SAFETY: the generated skeleton dereferences libbpf's object pointers
// right after libbpf created them; the code is libbpf-cargo's, not ours.
#[allow(unsafe_code, missing_docs, clippy::all, unused_imports)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/datapath.skel.rs"));
}

pub use abi::{DatapathConfig, EndpointInfo, LAYOUT_VERSION};
pub use attach::{AttachAction, AttachKind, AttachMode, Attachment, Hook};
pub use cellium_policy::{
    Decision, Direction, L4Match, PolicyEntry, PolicyRule, Protocol, Verdict,
};
pub use clock::ktime_now_ns;
pub use datapath::{Datapath, DatapathOptions, HookAttach};
pub use error::{Error, Result};
pub use events::{Event, EventKind, EventReader, PolicyMatch};
pub use ipnet::IpNet;
pub use maps::affinity::AffinityMatch;
pub use maps::config::VXLAN_OVERHEAD;
pub use maps::conntrack::{CtState, CtTuple, GcStats};
pub use maps::frag::Fragmented;
pub use maps::ipcache::IpcacheInfo;
pub use maps::lb::{
    Backend, Frontend, SERVICE_EXTERNAL, SERVICE_LOCAL, SERVICE_SOURCE_RANGE, ServiceEntry,
};
pub use maps::maglev::MaglevTables;
pub use maps::metrics::MetricSample;
pub use maps::policy::{SyncStats, compile_policy};
pub use maps::source_range::SourceRanges;
pub use pinning::{MapOrigin, MapReport};
pub use programs::ProgramOrigin;
pub use sock::SockHook;
pub use types::{EndpointFlags, MacAddr, Reason};

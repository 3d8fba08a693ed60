//! Reading `cel_events`: drops, policy verdicts and traces of new connections, blocking or
//! async.
//!
//! Trap: the ring buffer is shared by every reader of the node and a full
//! buffer loses events (never packets), so read continuously; counters in
//! `cel_metrics` are the lossless record.

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::{MapHandle, RingBuffer, RingBufferBuilder};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::abi::{Plain, RawEvent, ip_of};
use crate::error::{Error, Result};
use crate::types::{Direction, Protocol, Reason};

/// The map name.
pub const NAME: &str = "cel_events";

/// `CEL_VERDICT_DENIED`.
const VERDICT_DENIED: u8 = 1;
/// `CEL_VERDICT_AUDIT`.
const VERDICT_AUDIT: u8 = 2;

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A dropped packet.
    Drop,
    /// The policy decision for a new connection (when enabled).
    PolicyVerdict,
    /// A new connection forwarded, after policy and service translation (when enabled).
    Trace,
    /// A number this version does not know.
    Unknown(u8),
}

/// Which kind of policy entry let a connection through (Cilium's policy match types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PolicyMatch {
    /// Denied, or not decided where the event was emitted.
    None = 0,
    /// An entry for the peer's identity, any protocol and port.
    L3Only = 1,
    /// An entry for the peer's identity and the port.
    L3L4 = 2,
    /// An entry for any identity and the port.
    L4Only = 3,
    /// An entry for anything, or the direction is not enforced.
    All = 4,
}

impl PolicyMatch {
    fn from_nibble(n: u8) -> Self {
        match n & 0x0f {
            1 => PolicyMatch::L3Only,
            2 => PolicyMatch::L3L4,
            3 => PolicyMatch::L4Only,
            4 => PolicyMatch::All,
            _ => PolicyMatch::None,
        }
    }

    /// The name `hubble observe` prints: `L3-Only`, `L3-L4`, `L4-Only`, `all`, `none`.
    pub fn name(self) -> &'static str {
        match self {
            PolicyMatch::None => "none",
            PolicyMatch::L3Only => "L3-Only",
            PolicyMatch::L3L4 => "L3-L4",
            PolicyMatch::L4Only => "L4-Only",
            PolicyMatch::All => "all",
        }
    }
}

/// One datapath event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()` when it happened.
    pub ktime_ns: u64,
    /// Drop or policy verdict.
    pub kind: EventKind,
    /// The drop reason, or `Forwarded` for an allowed verdict.
    pub reason: Reason,
    /// Direction relative to `endpoint_id`.
    pub direction: Direction,
    /// The packet's protocol (IPv6: the next header after the fixed header, which may be
    /// an extension header's number).
    pub protocol: Protocol,
    /// The endpoint whose hook or policy decided.
    pub endpoint_id: u16,
    /// Source identity (0 when not yet resolved).
    pub src_identity: u32,
    /// Destination identity (0 when not yet resolved).
    pub dst_identity: u32,
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// Source port (ICMP echo request: identifier).
    pub sport: u16,
    /// Destination port (ICMP echo reply: identifier).
    pub dport: u16,
    /// The interface the program ran on.
    pub ifindex: u32,
    /// Packet length.
    pub len: u32,
    /// Whether the packet was let through (policy verdicts).
    pub allowed: bool,
    /// Policy verdicts: a policy drop an audit let through (`reason` says which drop).
    pub audited: bool,
    /// TCP: the packet's flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10, ...).
    pub tcp_flags: u8,
    /// Policy verdicts: the match of this decision; traces: the egress decision of the hook.
    pub egress_match: PolicyMatch,
    /// Traces: the destination's ingress decision when taken by the same hook.
    pub ingress_match: PolicyMatch,
    /// Traces: the rev-NAT id of the service frontend the connection went through (0: none).
    pub rev_nat_id: u16,
    /// ICMP and ICMPv6 (not a later fragment): the message's type and code.
    pub icmp: (u8, u8),
}

impl Event {
    fn decode(bytes: &[u8]) -> Option<Self> {
        let raw = RawEvent::decode(bytes.get(..RawEvent::SIZE)?)?;
        Some(Self {
            ktime_ns: raw.ktime,
            kind: match raw.kind {
                1 => EventKind::Drop,
                2 => EventKind::PolicyVerdict,
                3 => EventKind::Trace,
                n => EventKind::Unknown(n),
            },
            reason: Reason::from(raw.reason),
            direction: Direction::from_u8(raw.direction)?,
            protocol: Protocol::from(raw.protocol),
            endpoint_id: raw.endpoint_id,
            src_identity: raw.src_identity,
            dst_identity: raw.dst_identity,
            saddr: ip_of(raw.family, raw.saddr)?,
            daddr: ip_of(raw.family, raw.daddr)?,
            sport: u16::from_be(raw.sport),
            dport: u16::from_be(raw.dport),
            ifindex: raw.ifindex,
            len: raw.len,
            // An audited drop passed.
            allowed: raw.verdict != VERDICT_DENIED,
            audited: raw.verdict == VERDICT_AUDIT,
            tcp_flags: raw.tcp_flags,
            egress_match: PolicyMatch::from_nibble(raw.match_type),
            ingress_match: PolicyMatch::from_nibble(raw.match_type >> 4),
            rev_nat_id: raw.rev_nat_id,
            icmp: (raw.icmp_type, raw.icmp_code),
        })
    }
}

/// A reader of the events ring buffer. `Send`, so it can move into a
/// tokio task; each reader sees every event submitted while it reads.
pub struct EventReader {
    // A duplicate of the ring buffer's epoll descriptor, registered with
    // the tokio reactor on first use.
    async_fd: Option<AsyncFd<OwnedFd>>,
    ring: RingBuffer<'static>,
    queue: Arc<Mutex<VecDeque<Event>>>,
    malformed: Arc<AtomicU64>,
    _map: MapHandle,
}

impl std::fmt::Debug for EventReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReader")
            .field("malformed", &self.malformed())
            .finish_non_exhaustive()
    }
}

impl EventReader {
    pub(crate) fn new(map: MapHandle) -> Result<Self> {
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let malformed = Arc::new(AtomicU64::new(0));
        let (q, m) = (queue.clone(), malformed.clone());
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&map, move |bytes: &[u8]| {
                match Event::decode(bytes) {
                    Some(e) => q.lock().unwrap_or_else(|p| p.into_inner()).push_back(e),
                    None => {
                        m.fetch_add(1, Ordering::Relaxed);
                    }
                }
                0
            })
            .map_err(|e| Error::Events {
                op: "register the map",
                source: io::Error::other(e.to_string()),
            })?;
        let ring = builder.build().map_err(|e| Error::Events {
            op: "build",
            source: io::Error::other(e.to_string()),
        })?;
        Ok(Self {
            async_fd: None,
            ring,
            queue,
            malformed,
            _map: map,
        })
    }

    fn pop(&self) -> Option<Event> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    fn drain(&self) -> Vec<Event> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }

    fn consume(&self) -> Result<()> {
        self.ring.consume().map_err(|e| Error::Events {
            op: "consume",
            source: io::Error::other(e.to_string()),
        })
    }

    /// Waits up to `timeout` for events and returns all that are available.
    /// Blocks the thread: use [`EventReader::next`] from async code.
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        self.consume()?;
        if self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            self.ring.poll(timeout).map_err(|e| Error::Events {
                op: "poll",
                source: io::Error::other(e.to_string()),
            })?;
        }
        Ok(self.drain())
    }

    /// Every event available now, without waiting (none: an empty list).
    pub fn available(&mut self) -> Result<Vec<Event>> {
        self.consume()?;
        Ok(self.drain())
    }

    /// The next event, waiting without blocking the executor. Must run
    /// inside a tokio runtime (with I/O enabled).
    pub async fn next(&mut self) -> Result<Event> {
        if self.async_fd.is_none() {
            self.async_fd = Some(self.register()?);
        }
        loop {
            if let Some(e) = self.pop() {
                return Ok(e);
            }
            self.consume()?;
            if let Some(e) = self.pop() {
                return Ok(e);
            }
            let Some(fd) = self.async_fd.as_ref() else {
                continue;
            };
            let mut guard = fd
                .readable()
                .await
                .map_err(|source| Error::Events { op: "wait", source })?;
            // Cleared before the next consume: data arriving after this
            // point raises readiness again, so nothing is missed.
            guard.clear_ready();
        }
    }

    #[allow(unsafe_code)]
    fn register(&self) -> Result<AsyncFd<OwnedFd>> {
        // SAFETY: epoll_fd() is the descriptor the ring buffer owns while
        // `self.ring` lives; it is only borrowed here to duplicate it.
        let epoll = unsafe { BorrowedFd::borrow_raw(self.ring.epoll_fd()) };
        let owned = epoll.try_clone_to_owned().map_err(|source| Error::Events {
            op: "duplicate the epoll fd",
            source,
        })?;
        // SAFETY: `owned` moves into the AsyncFd, so the descriptor stays
        // open and refers to the same epoll instance for its whole life.
        unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }.map_err(|e| {
            Error::Events {
                op: "register with the runtime",
                source: e.into(),
            }
        })
    }

    /// Records that could not be decoded (a layout mismatch) so far.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{c, family_and_bytes};
    use std::net::Ipv4Addr;

    fn raw(src: IpAddr, dst: IpAddr) -> RawEvent {
        let (family, saddr) = family_and_bytes(src);
        let (_, daddr) = family_and_bytes(dst);
        RawEvent {
            ktime: 99,
            kind: 1,
            reason: 2,
            direction: 1,
            protocol: 6,
            endpoint_id: 4,
            family,
            src_identity: 1000,
            dst_identity: 2000,
            saddr,
            daddr,
            sport: 5555u16.to_be(),
            dport: 80u16.to_be(),
            ifindex: 3,
            len: 60,
            verdict: 1,
            ..Default::default()
        }
    }

    #[test]
    fn events_decode_from_the_c_layout() {
        let src = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let e = Event::decode(&raw(src, Ipv4Addr::new(10, 0, 0, 2).into()).encode()).unwrap();
        assert_eq!(e.kind, EventKind::Drop);
        assert_eq!(e.reason, Reason::PolicyDeny);
        assert_eq!(e.direction, Direction::Egress);
        assert_eq!(e.saddr, src);
        assert_eq!(e.dport, 80);
        assert!(!e.allowed && !e.audited);
        assert!(Event::decode(&[0u8; 8]).is_none());
        let mut audit = raw(src, Ipv4Addr::new(10, 0, 0, 2).into());
        (audit.kind, audit.verdict) = (2, VERDICT_AUDIT);
        let e = Event::decode(&audit.encode()).unwrap();
        assert!(e.allowed && e.audited, "an audited drop passed");
        assert_eq!(
            (u64::from(VERDICT_DENIED), u64::from(VERDICT_AUDIT)),
            (c::CEL_VERDICT_DENIED, c::CEL_VERDICT_AUDIT)
        );
    }

    #[test]
    fn traces_carry_both_matches_and_the_service() {
        let mut r = raw(
            Ipv4Addr::new(10, 0, 0, 1).into(),
            Ipv4Addr::new(10, 0, 0, 2).into(),
        );
        r.kind = 3;
        r.reason = 0;
        r.verdict = 0;
        r.match_type = 2 | (4 << 4);
        r.rev_nat_id = 7;
        r.tcp_flags = 0x02;
        let e = Event::decode(&r.encode()).unwrap();
        assert_eq!(e.kind, EventKind::Trace);
        assert_eq!(e.egress_match, PolicyMatch::L3L4);
        assert_eq!(e.ingress_match, PolicyMatch::All);
        assert_eq!((e.rev_nat_id, e.tcp_flags), (7, 0x02));
        assert!(e.allowed);
    }

    #[test]
    fn ipv6_events_carry_both_addresses_and_an_unknown_family_is_malformed() {
        let (src, dst): (IpAddr, IpAddr) = ("fd00::5".parse().unwrap(), "fd00::6".parse().unwrap());
        let mut r = raw(src, dst);
        r.reason = 12;
        let e = Event::decode(&r.encode()).unwrap();
        assert_eq!((e.saddr, e.daddr), (src, dst));
        assert_eq!(e.reason, Reason::ExtensionHeader);
        r.family = 0;
        assert!(Event::decode(&r.encode()).is_none());
    }
}

//! Watching traffic over time: a [`Hammer`] tries a denied flow again and again and records
//! every attempt that got through; a [`Stream`] keeps an allowed, established flow busy and
//! records every round trip. Both run on their own thread until finished, so that an agent
//! can be stopped and started under them and the records say what happened at every moment.
//!
//! Each attempt of a hammer is a new flow for the datapath's policy:
//! - UDP: one connected socket sending a datagram every quarter millisecond. A denied datagram leaves
//!   no conntrack entry, so every datagram is decided by policy afresh; the first one let
//!   through would be answered (and its reply would open the tuple for good).
//! - ICMP: echo requests every quarter millisecond with one identifier, likewise.
//! - TCP: a new connection (a new source port) every millisecond, each given 50 ms.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, getpeername, getsockopt,
    socket, sockopt,
};

use crate::error::{Error, Result};
use crate::lab::OpenFlow;
use crate::netns::NetNs;
use crate::reach::{self, Outcome, Probe};
use crate::wait::Rounds;

/// What a hammer saw.
#[derive(Debug, Default)]
pub struct HammerLog {
    /// What it hammered (`dev/tool -> shop/db udp/53`).
    pub what: String,
    /// When each attempt was made.
    pub attempts: Vec<Instant>,
    /// Attempts that got through (answered, or refused by the destination's stack), with what
    /// happened.
    pub breaches: Vec<(Instant, String)>,
}

impl HammerLog {
    /// How many attempts were made in `[from, to)`.
    pub fn attempts_between(&self, from: Instant, to: Instant) -> usize {
        self.attempts
            .iter()
            .filter(|t| **t >= from && **t < to)
            .count()
    }
}

/// A thread trying one denied flow over and over; see the module docs.
#[derive(Debug)]
pub struct Hammer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<HammerLog>>,
}

impl Hammer {
    /// Starts hammering `dst` (IPv4 or IPv6) with `probe` from inside `ns`, from `src` (of
    /// `dst`'s family) when given.
    pub fn start(
        what: String,
        ns: &NetNs,
        src: Option<IpAddr>,
        dst: IpAddr,
        probe: Probe,
    ) -> Hammer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let ns = NetNs::existing(ns.name());
        let thread = std::thread::spawn(move || {
            ns.run(move || {
                let mut log = HammerLog {
                    what,
                    ..HammerLog::default()
                };
                match (probe, dst) {
                    (Probe::Udp(port), _) => udp(&mut log, &flag, src, SocketAddr::new(dst, port))?,
                    (Probe::Tcp(port), _) => tcp(&mut log, &flag, src, SocketAddr::new(dst, port))?,
                    (Probe::Icmp, IpAddr::V4(dst)) => {
                        let src = src.and_then(|s| match s {
                            IpAddr::V4(v4) => Some(v4),
                            IpAddr::V6(_) => None,
                        });
                        icmp(&mut log, &flag, src, dst)?
                    }
                    (Probe::Icmp, IpAddr::V6(dst)) => {
                        let src = src.and_then(|s| match s {
                            IpAddr::V6(v6) => Some(v6),
                            IpAddr::V4(_) => None,
                        });
                        icmp6(&mut log, &flag, src, dst)?
                    }
                }
                Ok(log)
            })?
        });
        Hammer { stop, thread }
    }

    /// Stops and returns the record.
    pub fn finish(self) -> Result<HammerLog> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| Error::Unexpected {
            what: "hammer",
            detail: "its thread panicked".into(),
        })?
    }
}

/// The pause between two attempts of the UDP and ICMP hammers.
const PACE: Duration = Duration::from_micros(250);

/// How long a TCP attempt may wait for its SYN to be answered.
const SYN_DEADLINE: Duration = Duration::from_millis(50);

fn udp(log: &mut HammerLog, stop: &AtomicBool, src: Option<IpAddr>, dst: SocketAddr) -> Result<()> {
    let err = |source| Error::Probe {
        probe: "udp hammer",
        target: dst.to_string(),
        source,
    };
    let any = match dst {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let sock = UdpSocket::bind(SocketAddr::new(src.unwrap_or(any), 0)).map_err(err)?;
    sock.connect(dst).map_err(err)?;
    // Sending never waits for an answer: answers are collected as they come.
    sock.set_nonblocking(true).map_err(err)?;
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::Relaxed) {
        log.attempts.push(Instant::now());
        let _ = sock.send(b"ping");
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => log.breaches.push((
                    Instant::now(),
                    format!("answered {:?}", String::from_utf8_lossy(&buf[..n])),
                )),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    log.breaches.push((Instant::now(), "refused".into()))
                }
                Err(_) => break,
            }
        }
        std::thread::sleep(PACE);
    }
    Ok(())
}

/// New connections without waiting for each: a non-blocking connect every millisecond, each
/// checked once its deadline has passed.
fn tcp(log: &mut HammerLog, stop: &AtomicBool, src: Option<IpAddr>, dst: SocketAddr) -> Result<()> {
    let err = |e: Errno| Error::Probe {
        probe: "tcp hammer",
        target: dst.to_string(),
        source: e.into(),
    };
    let mut pending: VecDeque<(Instant, OwnedFd)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) || !pending.is_empty() {
        if !stop.load(Ordering::Relaxed) {
            let family = match dst {
                SocketAddr::V4(_) => AddressFamily::Inet,
                SocketAddr::V6(_) => AddressFamily::Inet6,
            };
            let fd = socket(
                family,
                SockType::Stream,
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                None,
            )
            .map_err(err)?;
            if let Some(ip) = src {
                bind(
                    fd.as_raw_fd(),
                    &SockaddrStorage::from(SocketAddr::new(ip, 0)),
                )
                .map_err(err)?;
            }
            let now = Instant::now();
            log.attempts.push(now);
            match connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
                Ok(()) | Err(Errno::EINPROGRESS) => pending.push_back((now, fd)),
                Err(e) => log.breaches.push((now, format!("connect: {e}"))),
            }
        }
        while let Some((sent, _)) = pending.front() {
            if sent.elapsed() < SYN_DEADLINE && !stop.load(Ordering::Relaxed) {
                break;
            }
            let Some((sent, fd)) = pending.pop_front() else {
                break;
            };
            // Connected, or refused by the peer's stack: either way the SYN got through.
            if getpeername::<SockaddrStorage>(fd.as_raw_fd()).is_ok() {
                log.breaches.push((sent, "connected".into()));
            } else if let Ok(e) = getsockopt(&fd, sockopt::SocketError)
                && e != 0
            {
                log.breaches
                    .push((sent, format!("connect: {}", Errno::from_raw(e))));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn icmp(
    log: &mut HammerLog,
    stop: &AtomicBool,
    src: Option<Ipv4Addr>,
    dst: Ipv4Addr,
) -> Result<()> {
    let fd = reach::icmp_socket(src, Duration::from_millis(1))?;
    let id = reach::echo_id();
    let mut seq: u16 = 0;
    while !stop.load(Ordering::Relaxed) {
        seq = seq.wrapping_add(1);
        log.attempts.push(Instant::now());
        let _ = reach::send_echo(&fd, dst, id, seq);
        for got in reach::drain_echo_replies(&fd, dst, id) {
            log.breaches
                .push((Instant::now(), format!("echo reply {got}")));
        }
        std::thread::sleep(PACE);
    }
    Ok(())
}

fn icmp6(
    log: &mut HammerLog,
    stop: &AtomicBool,
    src: Option<Ipv6Addr>,
    dst: Ipv6Addr,
) -> Result<()> {
    let err = |e: Errno| Error::Probe {
        probe: "icmpv6 socket",
        target: dst.to_string(),
        source: e.into(),
    };
    let fd = reach::icmp6_socket(src, Duration::from_millis(1)).map_err(err)?;
    // Collecting answers never waits: a receive timeout rounds up to a scheduler tick.
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(err)?;
    let id = reach::echo_id();
    let mut seq: u16 = 0;
    while !stop.load(Ordering::Relaxed) {
        seq = seq.wrapping_add(1);
        log.attempts.push(Instant::now());
        let _ = reach::send_echo6(&fd, dst, id, seq);
        for got in reach::drain_echo6_replies(&fd, dst, id) {
            log.breaches
                .push((Instant::now(), format!("echo reply {got}")));
        }
        std::thread::sleep(PACE);
    }
    Ok(())
}

/// What a stream saw.
#[derive(Debug, Default)]
pub struct StreamLog {
    /// When each round trip completed.
    pub rounds: Vec<Instant>,
    /// The round trip that failed, if one did (the stream stops there).
    pub failure: Option<(Instant, String)>,
}

impl StreamLog {
    /// The longest time between two round trips.
    pub fn max_gap(&self) -> Duration {
        crate::probe::max_gap(&self.rounds)
    }

    /// How many round trips completed in `[from, to)`.
    pub fn rounds_between(&self, from: Instant, to: Instant) -> usize {
        self.rounds
            .iter()
            .filter(|t| **t >= from && **t < to)
            .count()
    }
}

/// A thread making round trips on an open flow, back to back, until finished.
#[derive(Debug)]
pub struct Stream {
    stop: Arc<AtomicBool>,
    rounds: Rounds,
    thread: JoinHandle<StreamLog>,
}

impl Stream {
    /// Starts the round trips on `flow`.
    pub fn start(mut flow: OpenFlow) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let rounds = Rounds::default();
        let counted = rounds.clone();
        let thread = std::thread::spawn(move || {
            let mut log = StreamLog::default();
            while !flag.load(Ordering::Relaxed) {
                match flow.round_trip() {
                    Outcome::Answered => {
                        log.rounds.push(Instant::now());
                        counted.done();
                    }
                    other => {
                        log.failure = Some((Instant::now(), other.to_string()));
                        break;
                    }
                }
                // About a thousand round trips a second: enough to see any stall.
                std::thread::sleep(Duration::from_micros(500));
            }
            log
        });
        Stream {
            stop,
            rounds,
            thread,
        }
    }

    /// Waits until `n` more round trips complete (or one failed: [`Stream::finish`] says which).
    pub fn wait_rounds(&self, n: usize) {
        self.rounds.wait_more(n, || self.thread.is_finished());
    }

    /// Stops and returns the record.
    pub fn finish(self) -> Result<StreamLog> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| Error::Unexpected {
            what: "stream",
            detail: "its thread panicked".into(),
        })
    }
}

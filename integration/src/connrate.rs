//! New TCP connections, for the services benchmark: a server that accepts and forgets, and a
//! client that opens connections to addresses chosen at random among many (services' cluster
//! IPs) and times each `connect()`: the handshake's round trip, the translation of its first
//! packet included.
//!
//! ```no_run
//! use std::time::Duration;
//! use cellium_integration::connrate;
//!
//! std::thread::spawn(|| connrate::serve("10.244.0.12:8080".parse().unwrap()));
//! let vips: Vec<_> = (1..=1000u32).map(|i| std::net::Ipv4Addr::from(0x0a60_0000 + i).into()).collect();
//! let rate = connrate::run(&vips, 80, Duration::from_secs(3)).unwrap();
//! println!("{} per s, p50 {:?}", rate.per_second(), rate.p50());
//! ```

use std::io::{Error, ErrorKind};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt, sockopt,
};

/// Accepts every connection to `addr` and holds it until 1,024 newer ones came (the client has
/// reset it by then), until the process ends; returns only if the listener fails.
///
/// The accept queue is long: the server may wait for a CPU while the client goes on, and a
/// full queue drops a SYN, which costs the client a second. The server never closes first: an
/// end in TIME_WAIT on its side would refuse the client's next connection from the same port
/// (PAWS), which the client cannot know about; and a reset from it could reach the client
/// before its `connect()` returned.
pub fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = nix::sys::socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    )?;
    listen(&fd, Backlog::new(4096)?)?;
    let listener = TcpListener::from(fd);
    let mut held = std::collections::VecDeque::with_capacity(1024);
    // Accept errors (a connection reset while queued) concern one connection only.
    for conn in listener.incoming().flatten() {
        reset_on_close(&conn)?;
        if held.len() == 1024 {
            held.pop_front();
        }
        held.push_back(conn);
    }
    Ok(())
}

/// Makes closing `stream` send a reset (linger 0): neither end keeps it in TIME_WAIT.
fn reset_on_close(stream: &TcpStream) -> std::io::Result<()> {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    Ok(setsockopt(stream, sockopt::Linger, &linger)?)
}

/// The connections of one run.
#[derive(Debug, Clone, Default)]
pub struct ConnRate {
    connects: Vec<Duration>,
    failed: usize,
    elapsed: Duration,
}

impl ConnRate {
    /// Connections established per second.
    pub fn per_second(&self) -> f64 {
        self.connects.len() as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// The median time `connect()` took.
    pub fn p50(&self) -> Duration {
        let mut sorted = self.connects.clone();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied().unwrap_or_default()
    }

    /// Connections that failed (refused or timed out).
    pub fn failed(&self) -> usize {
        self.failed
    }
}

/// Opens connections one after the other for `duration`, each to one of `vips` at `port`
/// chosen at random, and closes each with a reset, so that the client never runs out of
/// ports.
pub fn run(vips: &[IpAddr], port: u16, duration: Duration) -> std::io::Result<ConnRate> {
    if vips.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "no address to connect to",
        ));
    }
    let mut rate = ConnRate::default();
    // A fixed-seed xorshift: the same sequence of services in every run and arm, so the
    // arms differ only in what translates the packets.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let began = Instant::now();
    while began.elapsed() < duration {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let vip = vips[(state % vips.len() as u64) as usize];
        let start = Instant::now();
        match TcpStream::connect_timeout(&SocketAddr::new(vip, port), Duration::from_secs(1)) {
            Ok(stream) => {
                rate.connects.push(start.elapsed());
                reset_on_close(&stream)?;
            }
            Err(_) => rate.failed += 1,
        }
    }
    rate.elapsed = began.elapsed();
    Ok(rate)
}

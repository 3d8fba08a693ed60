//! Traffic probes run inside pod namespaces: ping, and small TCP and UDP
//! servers and clients with timeouts. Servers answer with a banner so a
//! client can tell which backend served it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::netns::NetNs;
use crate::wait::Rounds;

fn probe_err(probe: &'static str, target: impl ToString) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Probe {
        probe,
        target: target.to_string(),
        source,
    }
}

/// Pings `dst` (IPv4 or IPv6) from `ns` `count` times; true if every echo was answered.
pub fn ping(ns: &NetNs, dst: impl Into<IpAddr>, count: u32) -> Result<bool> {
    ping_size(ns, dst, count, 56)
}

/// [`ping`] with `size` bytes of echo data (`ping -s`): more than the path's MTU holds makes
/// every request and reply a fragmented datagram.
pub fn ping_size(ns: &NetNs, dst: impl Into<IpAddr>, count: u32, size: u32) -> Result<bool> {
    let dst = dst.into();
    let out = crate::cmd::output(
        "ip",
        &[
            "netns",
            "exec",
            ns.name(),
            "ping",
            "-n",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "1",
            "-s",
            &size.to_string(),
            &dst.to_string(),
        ],
    )?;
    Ok(out.status.success())
}

/// A TCP server in a namespace: sends `<banner>\n`, then echoes. Stops on drop.
#[derive(Debug)]
pub struct TcpServer {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl TcpServer {
    /// Listens on `addr` (IPv4 or IPv6) inside `ns`.
    pub fn start(ns: &NetNs, addr: impl Into<SocketAddr>, banner: &str) -> Result<Self> {
        let addr = addr.into();
        let listener = ns
            .run(move || TcpListener::bind(addr))?
            .map_err(probe_err("tcp listen", addr))?;
        listener
            .set_nonblocking(true)
            .map_err(probe_err("tcp listen", addr))?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let (s, r, banner) = (stop.clone(), received.clone(), format!("{banner}\n"));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (s, r, b) = (s.clone(), r.clone(), banner.clone());
                        std::thread::spawn(move || serve_echo(conn, &b, &s, &r));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Self {
            stop,
            received,
            thread: Some(thread),
            addr,
        })
    }

    /// Bytes received over all connections so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn serve_echo(mut conn: TcpStream, banner: &str, stop: &AtomicBool, received: &AtomicU64) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    if conn.write_all(banner.as_bytes()).is_err() {
        return;
    }
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                received.fetch_add(n as u64, Ordering::Relaxed);
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects from inside `ns` to `dst` within `timeout`.
pub fn tcp_connect(ns: &NetNs, dst: impl Into<SocketAddr>, timeout: Duration) -> Result<TcpStream> {
    let dst = dst.into();
    let stream = ns
        .run(move || TcpStream::connect_timeout(&dst, timeout))?
        .map_err(probe_err("tcp connect", dst))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(probe_err("tcp connect", dst))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(probe_err("tcp connect", dst))?;
    Ok(stream)
}

/// Connects from inside `ns`, from source port `sport` (so a test controls the flow's whole
/// tuple, as a load balancer's hash sees it), to `dst` within `timeout`.
pub fn tcp_connect_from(
    ns: &NetNs,
    sport: u16,
    dst: impl Into<SocketAddr>,
    timeout: Duration,
) -> Result<TcpStream> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, setsockopt, socket,
        sockopt,
    };
    use std::os::fd::AsRawFd;
    let dst = dst.into();
    let (family, any) = if dst.is_ipv4() {
        (AddressFamily::Inet, IpAddr::from(Ipv4Addr::UNSPECIFIED))
    } else {
        (AddressFamily::Inet6, IpAddr::from(Ipv6Addr::UNSPECIFIED))
    };
    let stream = ns
        .run(move || -> nix::Result<TcpStream> {
            let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
            setsockopt(&fd, sockopt::ReuseAddr, &true)?;
            bind(
                fd.as_raw_fd(),
                &SockaddrStorage::from(SocketAddr::new(any, sport)),
            )?;
            connect(fd.as_raw_fd(), &SockaddrStorage::from(dst))?;
            Ok(TcpStream::from(fd))
        })?
        .map_err(|e| Error::Probe {
            probe: "tcp connect from a port",
            target: dst.to_string(),
            source: e.into(),
        })?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(probe_err("tcp connect from a port", dst))?;
    Ok(stream)
}

/// One connection from `ns`'s port `sport` to a [`TcpServer`] at `dst`: its banner. Closed with
/// a reset (linger 0), so that neither side keeps the tuple in TIME-WAIT and the next
/// connection from the same port is a new one for the datapath.
pub fn banner_from(
    ns: &NetNs,
    sport: u16,
    dst: impl Into<SocketAddr>,
    timeout: Duration,
) -> Result<String> {
    use nix::sys::socket::{setsockopt, sockopt};
    let dst = dst.into();
    let stream = tcp_connect_from(ns, sport, dst, timeout)?;
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    setsockopt(&stream, sockopt::Linger, &linger).map_err(|e| Error::Probe {
        probe: "tcp linger",
        target: dst.to_string(),
        source: e.into(),
    })?;
    let mut banner = String::new();
    BufReader::new(&stream)
        .read_line(&mut banner)
        .map_err(probe_err("tcp banner", dst))?;
    Ok(banner.trim_end().to_string())
}

/// A UDP socket of `ns` connected to `dst` (bound to its family's unspecified address, an
/// ephemeral port), its reads timing out after `timeout`: one end of a UDP connection a test
/// keeps.
pub fn udp_connect(ns: &NetNs, dst: SocketAddr, timeout: Duration) -> Result<UdpSocket> {
    ns.run(move || -> std::io::Result<UdpSocket> {
        let any: IpAddr = if dst.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
        sock.connect(dst)?;
        sock.set_read_timeout(Some(timeout))?;
        Ok(sock)
    })?
    .map_err(probe_err("udp connect", dst))
}

/// A datagram to `dst` from a connected UDP socket inside `ns`, then a read within `timeout`:
/// how the read failed (`ConnectionRefused` once an ICMP port unreachable came back), or
/// `None` if an answer came.
pub fn udp_error(
    ns: &NetNs,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<Option<std::io::ErrorKind>> {
    let sock = udp_connect(ns, dst, timeout)?;
    let outcome = sock
        .send(b"anyone?")
        .and_then(|_| sock.recv(&mut [0u8; 64]));
    Ok(outcome.err().map(|e| e.kind()))
}

/// What a TCP request saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpReply {
    /// The server's banner.
    pub banner: String,
    /// The address the connection's packets came from.
    pub peer: SocketAddr,
}

/// Connects, reads the banner, sends a message and checks its echo.
pub fn tcp_request(ns: &NetNs, dst: impl Into<SocketAddr>, timeout: Duration) -> Result<TcpReply> {
    let dst = dst.into();
    let stream = tcp_connect(ns, dst, timeout)?;
    let peer = stream.peer_addr().map_err(probe_err("tcp request", dst))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(probe_err("tcp request", dst))?);
    let mut banner = String::new();
    reader
        .read_line(&mut banner)
        .map_err(probe_err("tcp banner", dst))?;
    let mut writer = stream;
    writer
        .write_all(b"hello cellium")
        .map_err(probe_err("tcp send", dst))?;
    let mut echo = [0u8; 13];
    reader
        .read_exact(&mut echo)
        .map_err(probe_err("tcp echo", dst))?;
    if &echo != b"hello cellium" {
        return Err(Error::Unexpected {
            what: "tcp echo",
            detail: String::from_utf8_lossy(&echo).into_owned(),
        });
    }
    let _ = writer.shutdown(Shutdown::Both);
    Ok(TcpReply {
        banner: banner.trim_end().to_owned(),
        peer,
    })
}

/// A TCP server in a namespace that answers each connection with the address it sees as the
/// client's (`<ip>\n`), then closes it: what source translation left of the client. Stops on
/// drop.
#[derive(Debug)]
pub struct PeerServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeerServer {
    /// Listens on `addr` inside `ns`.
    pub fn start(ns: &NetNs, addr: impl Into<SocketAddr>) -> Result<Self> {
        let addr = addr.into();
        let listener = ns
            .run(move || TcpListener::bind(addr))?
            .map_err(probe_err("tcp listen", addr))?;
        listener
            .set_nonblocking(true)
            .map_err(probe_err("tcp listen", addr))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, peer)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.write_all(format!("{}\n", peer.ip()).as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects from `ns` to a [`PeerServer`] (directly or through a service) and reads the
/// address it saw as the client's.
pub fn seen_from(ns: &NetNs, to: SocketAddr) -> std::io::Result<IpAddr> {
    ns.run(move || -> std::io::Result<IpAddr> {
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        line.trim()
            .parse()
            .map_err(|e| std::io::Error::other(format!("{line:?}: {e}")))
    })
    .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// [`seen_from`] with the client's socket bound to `src` (one of `ns`'s addresses), giving up
/// after `timeout`: what a client of that address gets.
pub fn seen_from_source(
    ns: &NetNs,
    src: IpAddr,
    to: SocketAddr,
    timeout: Duration,
) -> std::io::Result<IpAddr> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, setsockopt, socket,
        sockopt,
    };
    use std::os::fd::AsRawFd;
    let family = if to.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    ns.run(move || -> std::io::Result<IpAddr> {
        let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
        // A blocking connect gives up after the send timeout.
        let tv = nix::sys::time::TimeVal::new(
            i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            i64::from(timeout.subsec_micros()),
        );
        setsockopt(&fd, sockopt::SendTimeout, &tv)?;
        bind(
            fd.as_raw_fd(),
            &SockaddrStorage::from(SocketAddr::new(src, 0)),
        )?;
        connect(fd.as_raw_fd(), &SockaddrStorage::from(to))?;
        let stream = TcpStream::from(fd);
        stream.set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        line.trim()
            .parse()
            .map_err(|e| std::io::Error::other(format!("{line:?}: {e}")))
    })
    .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// A UDP server in a namespace: answers each datagram with `<banner>:<payload>` (payloads up
/// to the largest datagram, so large ones come back fragmented as they went).
#[derive(Debug)]
pub struct UdpServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpServer {
    /// Binds `addr` (IPv4 or IPv6) inside `ns`.
    pub fn start(ns: &NetNs, addr: impl Into<SocketAddr>, banner: &str) -> Result<Self> {
        let addr = addr.into();
        let sock = ns
            .run(move || UdpSocket::bind(addr))?
            .map_err(probe_err("udp bind", addr))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(probe_err("udp bind", addr))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, banner) = (stop.clone(), banner.to_owned());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    let mut reply = format!("{banner}:").into_bytes();
                    reply.extend_from_slice(&buf[..n]);
                    let _ = sock.send_to(&reply, from);
                }
            }
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a UDP request saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpReply {
    /// The server's banner.
    pub banner: String,
    /// The source of the reply datagram.
    pub from: SocketAddr,
}

/// Sends one datagram from inside `ns` and waits for the answer.
pub fn udp_request(ns: &NetNs, dst: impl Into<SocketAddr>, timeout: Duration) -> Result<UdpReply> {
    udp_exchange(ns, dst, b"ping", timeout)
}

/// Sends `payload` in one datagram from inside `ns` to a [`UdpServer`] and waits for the
/// answer, which must carry the same payload back.
pub fn udp_exchange(
    ns: &NetNs,
    dst: impl Into<SocketAddr>,
    payload: &[u8],
    timeout: Duration,
) -> Result<UdpReply> {
    let dst = dst.into();
    let any: IpAddr = match dst {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let local = SocketAddr::new(any, 0);
    let sock = ns
        .run(move || UdpSocket::bind(local))?
        .map_err(probe_err("udp bind", local))?;
    sock.set_read_timeout(Some(timeout))
        .map_err(probe_err("udp request", dst))?;
    sock.send_to(payload, dst)
        .map_err(probe_err("udp send", dst))?;
    let mut buf = vec![0u8; 65536];
    let (n, from) = sock
        .recv_from(&mut buf)
        .map_err(probe_err("udp reply", dst))?;
    let reply = &buf[..n];
    let banner = reply
        .strip_suffix(payload)
        .and_then(|b| b.strip_suffix(b":"))
        .ok_or_else(|| Error::Unexpected {
            what: "udp reply",
            detail: format!(
                "{} bytes, not <banner>:<the {} bytes sent>: {:?}",
                n,
                payload.len(),
                String::from_utf8_lossy(&reply[..n.min(64)])
            ),
        })?;
    Ok(UdpReply {
        banner: String::from_utf8_lossy(banner).into_owned(),
        from,
    })
}

/// A client that keeps a [`TcpServer`] connection busy in lock-step rounds (16 KiB out, the
/// same 16 KiB echoed back) and records when each round completed, so a test can show that a
/// stream kept flowing across an event and measure its longest pause.
#[derive(Debug)]
pub struct EchoStream {
    stop: Arc<AtomicBool>,
    rounds: Rounds,
    thread: JoinHandle<std::io::Result<Vec<std::time::Instant>>>,
}

/// Bytes sent (and echoed) per round of an [`EchoStream`].
pub const ECHO_ROUND_BYTES: usize = 16 * 1024;

/// The longest time between two successive rounds of `rounds` (those [`EchoStream::stop`]
/// returns): how long the stream stalled at most.
pub fn max_gap(rounds: &[std::time::Instant]) -> Duration {
    rounds
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

impl EchoStream {
    /// Starts the rounds on `stream`, a connection to a [`TcpServer`] (its banner is read first).
    pub fn start(stream: TcpStream) -> EchoStream {
        let stop = Arc::new(AtomicBool::new(false));
        let running = stop.clone();
        let rounds = Rounds::default();
        let counted = rounds.clone();
        let thread = std::thread::spawn(move || {
            let mut reader = BufReader::new(stream.try_clone()?);
            let mut banner = String::new();
            reader.read_line(&mut banner)?;
            let mut writer = stream;
            let chunk = vec![0x5a_u8; ECHO_ROUND_BYTES];
            let mut echo = vec![0u8; chunk.len()];
            let mut rounds = Vec::new();
            while !running.load(Ordering::Relaxed) {
                writer.write_all(&chunk)?;
                reader.read_exact(&mut echo)?;
                rounds.push(std::time::Instant::now());
                counted.done();
            }
            Ok(rounds)
        });
        EchoStream {
            stop,
            rounds,
            thread,
        }
    }

    /// Waits until `n` more rounds complete (or the stream broke: [`EchoStream::stop`] says how).
    pub fn wait_rounds(&self, n: usize) {
        self.rounds.wait_more(n, || self.thread.is_finished());
    }

    /// Stops after the current round; returns when each round completed, or the error that
    /// broke the stream.
    pub fn stop(self) -> std::io::Result<Vec<std::time::Instant>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the stream's thread panicked")))
    }
}

//! Reachability probes that tell a policy drop from every other outcome: one TCP connection,
//! one UDP datagram or one ICMP (ICMPv6) echo, over IPv4 or IPv6, from inside a namespace,
//! optionally from a chosen source address, with a deadline.
//!
//! A policy drop is silent: the SYN, the datagram or the echo request simply vanishes, so the
//! probe ends in [`Outcome::Dropped`] at its deadline. A refusal (a TCP reset, an ICMP port
//! unreachable) means the packet got through and nothing listened there: for a test whose
//! servers listen on every probed port that is an error of the test, not a verdict, and is
//! reported as such. [`Outcome::Answered`] needs the whole exchange: the banner and the echo of
//! a [`TcpServer`](crate::probe::TcpServer), the answer of a
//! [`UdpServer`](crate::probe::UdpServer), the echo reply.
//!
//! Every probe is a new flow for the datapath: a fresh socket (so a fresh source port) for TCP
//! and UDP, a fresh echo identifier for ICMP, so conntrack entries of earlier probes never
//! decide a later one.

use std::fmt;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream, UdpSocket,
};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6,
    SockaddrStorage, bind, connect, recv, recvfrom, sendto, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use crate::error::{Error, Result};
use crate::netns::NetNs;

/// What a probe sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Probe {
    /// A TCP connection to the port, then a banner and an echo.
    Tcp(u16),
    /// A UDP datagram to the port and its answer.
    Udp(u16),
    /// An ICMP echo request and its reply.
    Icmp,
}

impl Probe {
    /// The port a server must listen on for this probe (ICMP needs none).
    pub fn port(self) -> Option<u16> {
        match self {
            Probe::Tcp(p) | Probe::Udp(p) => Some(p),
            Probe::Icmp => None,
        }
    }
}

impl fmt::Display for Probe {
    /// `tcp/80`, `udp/53`, `icmp`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Tcp(p) => write!(f, "tcp/{p}"),
            Probe::Udp(p) => write!(f, "udp/{p}"),
            Probe::Icmp => f.write_str("icmp"),
        }
    }
}

/// How a probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered: the flow is allowed.
    Answered,
    /// Nothing came back before the deadline: the flow was dropped.
    Dropped,
    /// The destination refused (reset, port unreachable): the packet got through but nothing
    /// listened.
    Refused,
    /// Something else went wrong (a socket error, an unexpected answer).
    Failed(String),
}

impl Outcome {
    /// Whether the flow got through to a server.
    pub fn answered(&self) -> bool {
        matches!(self, Outcome::Answered)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Answered => f.write_str("answered"),
            Outcome::Dropped => f.write_str("dropped"),
            Outcome::Refused => f.write_str("refused"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// Runs one probe from inside `ns` to `dst`, from `src` when given (an address of `ns`, of
/// `dst`'s family), and waits at most `timeout` for each step.
pub fn probe(
    ns: &NetNs,
    src: Option<IpAddr>,
    dst: impl Into<IpAddr>,
    what: Probe,
    timeout: Duration,
) -> Result<Outcome> {
    let dst = dst.into();
    ns.run(move || probe_here(src, dst, what, timeout))
}

/// [`probe`] from the network namespace of the calling thread.
pub fn probe_here(src: Option<IpAddr>, dst: IpAddr, what: Probe, timeout: Duration) -> Outcome {
    match (what, dst) {
        (Probe::Tcp(port), _) => tcp(src, SocketAddr::new(dst, port), timeout),
        (Probe::Udp(port), _) => udp(src, SocketAddr::new(dst, port), timeout),
        (Probe::Icmp, IpAddr::V4(dst)) => match src {
            Some(IpAddr::V6(s)) => failed("source", format!("{s} is not of {dst}'s family")),
            Some(IpAddr::V4(s)) => icmp(Some(s), dst, timeout),
            None => icmp(None, dst, timeout),
        },
        (Probe::Icmp, IpAddr::V6(dst)) => match src {
            Some(IpAddr::V4(s)) => failed("source", format!("{s} is not of {dst}'s family")),
            Some(IpAddr::V6(s)) => icmp6(Some(s), dst, timeout),
            None => icmp6(None, dst, timeout),
        },
    }
}

fn failed(step: &str, e: impl fmt::Display) -> Outcome {
    Outcome::Failed(format!("{step}: {e}"))
}

fn timeval(d: Duration) -> TimeVal {
    TimeVal::new(d.as_secs() as _, d.subsec_micros() as _)
}

fn family_of(dst: SocketAddr) -> AddressFamily {
    match dst {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn tcp(src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Outcome {
    let fd = match socket(
        family_of(dst),
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) {
        Ok(fd) => fd,
        Err(e) => return failed("socket", e),
    };
    // A blocking connect gives up after SO_SNDTIMEO, which bounds the wait for a dropped SYN.
    if let Err(e) = setsockopt(&fd, sockopt::SendTimeout, &timeval(timeout)) {
        return failed("SO_SNDTIMEO", e);
    }
    if let Some(ip) = src
        && let Err(e) = bind(
            fd.as_raw_fd(),
            &SockaddrStorage::from(SocketAddr::new(ip, 0)),
        )
    {
        return failed("bind", e);
    }
    match connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Ok(()) => {}
        Err(Errno::ECONNREFUSED) => return Outcome::Refused,
        Err(Errno::EINPROGRESS | Errno::EAGAIN | Errno::ETIMEDOUT) => return Outcome::Dropped,
        Err(e) => return failed("connect", e),
    }
    exchange(TcpStream::from(fd), timeout)
}

/// Reads the banner, sends a message and reads its echo.
fn exchange(stream: TcpStream, timeout: Duration) -> Outcome {
    let run = || -> std::io::Result<bool> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut banner = String::new();
        reader.read_line(&mut banner)?;
        (&stream).write_all(b"policy probe")?;
        let mut echo = [0u8; 12];
        reader.read_exact(&mut echo)?;
        Ok(&echo == b"policy probe")
    };
    match run() {
        Ok(true) => Outcome::Answered,
        Ok(false) => Outcome::Failed("the echo differs".into()),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Outcome::Refused,
        // Connected but silent: the handshake passed and data did not, which no policy does.
        Err(e) => failed("after connecting", e),
    }
}

fn udp(src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Outcome {
    let any = match dst {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let local = SocketAddr::new(src.unwrap_or(any), 0);
    let sock = match UdpSocket::bind(local) {
        Ok(s) => s,
        Err(e) => return failed("bind", e),
    };
    // Connected, so that an ICMP port unreachable is reported as a refusal.
    if let Err(e) = sock
        .connect(dst)
        .and_then(|()| sock.set_read_timeout(Some(timeout)))
    {
        return failed("connect", e);
    }
    if let Err(e) = sock.send(b"ping") {
        return failed("send", e);
    }
    let mut buf = [0u8; 2048];
    match sock.recv(&mut buf) {
        Ok(n) if buf[..n].ends_with(b":ping") => Outcome::Answered,
        Ok(n) => Outcome::Failed(format!(
            "unexpected answer {:?}",
            String::from_utf8_lossy(&buf[..n])
        )),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Outcome::Refused,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Outcome::Dropped
        }
        Err(e) => failed("recv", e),
    }
}

/// Echo identifiers: distinct per probe in this process, so that every echo is a new flow.
static NEXT_ID: AtomicU16 = AtomicU16::new(0);

/// A new ICMP echo identifier.
pub fn echo_id() -> u16 {
    (std::process::id() as u16)
        .wrapping_mul(31)
        .wrapping_add(NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// An ICMP echo request (type 8) with its checksum.
pub fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let mut pkt = vec![8, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(b"cellium policy probe");
    let sum = checksum(&pkt);
    pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    pkt
}

/// The Internet checksum (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A raw ICMP socket (root), bound to `src` when given, with a receive timeout.
pub fn icmp_socket(src: Option<Ipv4Addr>, timeout: Duration) -> Result<OwnedFd> {
    let err = |e: Errno| Error::Probe {
        probe: "icmp socket",
        target: src.map(|s| s.to_string()).unwrap_or_default(),
        source: e.into(),
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Icmp,
    )
    .map_err(err)?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &timeval(timeout)).map_err(err)?;
    if let Some(ip) = src {
        bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(ip, 0))).map_err(err)?;
    }
    Ok(fd)
}

/// Sends echo request (`id`, `seq`) to `dst` on `fd`.
pub fn send_echo(fd: &OwnedFd, dst: Ipv4Addr, id: u16, seq: u16) -> nix::Result<()> {
    sendto(
        fd.as_raw_fd(),
        &echo_request(id, seq),
        &SockaddrIn::from(SocketAddrV4::new(dst, 0)),
        MsgFlags::empty(),
    )
    .map(|_| ())
}

/// Waits until `deadline` for an echo reply from `from` with identifier `id`; returns its
/// sequence number. A raw socket sees every ICMP packet of the namespace: others are skipped.
pub fn recv_echo_reply(
    fd: &OwnedFd,
    from: Ipv4Addr,
    id: u16,
    deadline: Instant,
) -> nix::Result<Option<u16>> {
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let n = match recvfrom::<SockaddrIn>(fd.as_raw_fd(), &mut buf) {
            Ok((n, _)) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(e) => return Err(e),
        };
        if let Some(seq) = echo_reply(&buf[..n], from, id) {
            return Ok(Some(seq));
        }
    }
    Ok(None)
}

/// The sequence numbers of the echo replies from `from` with identifier `id` that have
/// arrived on `fd` so far, without waiting.
pub fn drain_echo_replies(fd: &OwnedFd, from: Ipv4Addr, id: u16) -> Vec<u16> {
    let mut buf = [0u8; 1500];
    let mut out = Vec::new();
    while let Ok(n) = recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        if let Some(seq) = echo_reply(&buf[..n], from, id) {
            out.push(seq);
        }
    }
    out
}

/// The sequence number of `packet` (an IPv4 packet as a raw socket receives it) if it is an
/// echo reply from `from` with identifier `id`.
fn echo_reply(packet: &[u8], from: Ipv4Addr, id: u16) -> Option<u16> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let src = Ipv4Addr::new(
        *packet.get(12)?,
        *packet.get(13)?,
        *packet.get(14)?,
        *packet.get(15)?,
    );
    let icmp = packet.get(ihl..)?;
    let is_reply = *icmp.first()? == 0 && *icmp.get(1)? == 0;
    let got_id = u16::from_be_bytes([*icmp.get(4)?, *icmp.get(5)?]);
    (is_reply && src == from && got_id == id).then(|| u16::from_be_bytes([icmp[6], icmp[7]]))
}

fn icmp(src: Option<Ipv4Addr>, dst: Ipv4Addr, timeout: Duration) -> Outcome {
    let fd = match icmp_socket(src, Duration::from_millis(100)) {
        Ok(fd) => fd,
        Err(e) => return failed("socket", e),
    };
    let id = echo_id();
    if let Err(e) = send_echo(&fd, dst, id, 1) {
        return failed("send", e);
    }
    match recv_echo_reply(&fd, dst, id, Instant::now() + timeout) {
        Ok(Some(_)) => Outcome::Answered,
        Ok(None) => Outcome::Dropped,
        Err(e) => failed("recv", e),
    }
}

/// A raw ICMPv6 socket (root), bound to `src` when given, with a receive timeout. The kernel
/// computes ICMPv6 checksums on such sockets and strips the IPv6 header from what they read.
pub fn icmp6_socket(src: Option<Ipv6Addr>, timeout: Duration) -> nix::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Inet6,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::IcmpV6,
    )?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &timeval(timeout))?;
    if let Some(ip) = src {
        bind(
            fd.as_raw_fd(),
            &SockaddrIn6::from(SocketAddrV6::new(ip, 0, 0, 0)),
        )?;
    }
    Ok(fd)
}

/// An ICMPv6 echo request (type 128); its checksum is the kernel's.
fn echo6_request(id: u16, seq: u16) -> Vec<u8> {
    let mut pkt = vec![128, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(b"cellium policy probe");
    pkt
}

/// Sends ICMPv6 echo request (`id`, `seq`) to `dst` on `fd`.
pub fn send_echo6(fd: &OwnedFd, dst: Ipv6Addr, id: u16, seq: u16) -> nix::Result<()> {
    let to = SockaddrIn6::from(SocketAddrV6::new(dst, 0, 0, 0));
    sendto(
        fd.as_raw_fd(),
        &echo6_request(id, seq),
        &to,
        MsgFlags::empty(),
    )
    .map(|_| ())
}

/// The sequence number of `message` (an ICMPv6 message from `src`, as a raw socket reads it)
/// if it is an echo reply from `from` with identifier `id`.
fn echo6_reply(message: &[u8], src: Option<Ipv6Addr>, from: Ipv6Addr, id: u16) -> Option<u16> {
    let is_reply = *message.first()? == 129 && *message.get(1)? == 0;
    let got_id = u16::from_be_bytes([*message.get(4)?, *message.get(5)?]);
    (is_reply && src == Some(from) && got_id == id)
        .then(|| u16::from_be_bytes([message[6], message[7]]))
}

/// The sequence numbers of the ICMPv6 echo replies from `from` with identifier `id` that have
/// arrived on `fd` so far, without waiting.
pub fn drain_echo6_replies(fd: &OwnedFd, from: Ipv6Addr, id: u16) -> Vec<u16> {
    let mut buf = [0u8; 1500];
    let mut out = Vec::new();
    while let Ok((n, src)) = nix::sys::socket::recvfrom::<SockaddrIn6>(fd.as_raw_fd(), &mut buf) {
        if let Some(seq) = echo6_reply(&buf[..n], src.map(|s| s.ip()), from, id) {
            out.push(seq);
        }
    }
    out
}

fn icmp6(src: Option<Ipv6Addr>, dst: Ipv6Addr, timeout: Duration) -> Outcome {
    let fd = match icmp6_socket(src, Duration::from_millis(100)) {
        Ok(fd) => fd,
        Err(e) => return failed("socket", e),
    };
    let id = echo_id();
    if let Err(e) = send_echo6(&fd, dst, id, 1) {
        return failed("send", e);
    }
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let (n, from) = match recvfrom::<SockaddrIn6>(fd.as_raw_fd(), &mut buf) {
            Ok(got) => got,
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(e) => return failed("recv", e),
        };
        if echo6_reply(&buf[..n], from.map(|f| f.ip()), dst, id).is_some() {
            return Outcome::Answered;
        }
    }
    Outcome::Dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_requests_carry_a_valid_checksum() {
        let pkt = echo_request(0x1234, 7);
        assert_eq!(&pkt[..2], &[8, 0]);
        assert_eq!(&pkt[4..8], &[0x12, 0x34, 0, 7]);
        // A packet including its own checksum sums to zero.
        assert_eq!(checksum(&pkt), 0);
    }

    #[test]
    fn only_matching_echo_replies_are_taken() {
        let from = Ipv4Addr::new(10, 0, 0, 2);
        let mut pkt = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1,
        ];
        let mut icmp = echo_request(9, 3);
        icmp[0] = 0;
        pkt.extend_from_slice(&icmp);
        assert_eq!(echo_reply(&pkt, from, 9), Some(3));
        assert_eq!(echo_reply(&pkt, from, 8), None);
        assert_eq!(echo_reply(&pkt, Ipv4Addr::new(10, 0, 0, 3), 9), None);
        pkt[20] = 8;
        assert_eq!(echo_reply(&pkt, from, 9), None, "a request is not a reply");
        assert_eq!(echo_reply(&pkt[..10], from, 9), None);
    }

    #[test]
    fn probes_display_as_tables_show_them() {
        assert_eq!(Probe::Tcp(80).to_string(), "tcp/80");
        assert_eq!(Probe::Udp(53).to_string(), "udp/53");
        assert_eq!(Probe::Icmp.to_string(), "icmp");
    }
}

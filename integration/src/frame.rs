//! Hand-made frames sent through a packet socket, for tests that must show what the datapath
//! does with headers no socket API produces: a hop limit of 254 on a neighbour solicitation,
//! an extension header in front of it, a source address the sender does not own, a fragment
//! whose first fragment never was.
//!
//! ```no_run
//! use cellium_integration::frame::{self, Ipv6Packet, DSTOPTS};
//! use cellium_integration::NetNs;
//!
//! let pod = NetNs::new().unwrap();
//! let (src, dst) = ("fe80::1".parse().unwrap(), "ff02::1:ff00:5".parse().unwrap());
//! let ns = Ipv6Packet::solicitation(src, dst, "fd00::5".parse().unwrap()).behind(DSTOPTS);
//! frame::send(&pod, "eth0", ns.frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])).unwrap();
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, LinkAddr, MsgFlags, SockFlag, SockType, SockaddrLike, bind, recv, sendto,
    setsockopt, socket, sockopt,
};

use crate::error::{Error, Result};
use crate::netns::NetNs;

/// Next-header number of hop-by-hop options.
pub const HOPOPTS: u8 = 0;
/// Next-header number of destination options.
pub const DSTOPTS: u8 = 60;
/// Next-header number of the routing header.
pub const ROUTING: u8 = 43;
/// Next-header number of the fragment header.
pub const FRAGMENT: u8 = 44;
/// Next-header number of the mobility header, an extension header the datapath does not parse.
pub const MOBILITY: u8 = 135;
/// Next-header number of ICMPv6.
pub const ICMPV6: u8 = 58;
/// Next-header number of UDP.
pub const UDP: u8 = 17;

/// An MLDv2 report without records (type 143).
pub const MLD2_REPORT: [u8; 8] = [143, 0, 0, 0, 0, 0, 0, 0];
/// An ICMPv6 echo request (type 128), identifier 1, sequence 1.
pub const ECHO_REQUEST: [u8; 8] = [128, 0, 0, 0, 0, 1, 0, 1];

/// One IPv6 packet: the fixed header's fields and what follows it. Checksums are left zero:
/// the datapath decides before any stack checks them (and a stack then drops the packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Packet {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Hop limit.
    pub hop_limit: u8,
    /// The fixed header's next header.
    pub next: u8,
    /// Extension headers and the upper layer.
    pub rest: Vec<u8>,
}

impl Ipv6Packet {
    /// An ICMPv6 `message` right after the fixed header.
    pub fn icmp(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, message: &[u8]) -> Ipv6Packet {
        Ipv6Packet {
            src,
            dst,
            hop_limit,
            next: ICMPV6,
            rest: message.to_vec(),
        }
    }

    /// A neighbour solicitation for `target`, hop limit 255, as neighbour discovery sends it.
    pub fn solicitation(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Ipv6Packet {
        let mut m = vec![135, 0, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&target.octets());
        Ipv6Packet::icmp(src, dst, 255, &m)
    }

    /// An MLDv2 report to `ff02::16`, hop limit 1, behind a hop-by-hop header, as MLD sends
    /// it.
    pub fn listener_report(src: Ipv6Addr) -> Ipv6Packet {
        let all_mld_routers = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);
        Ipv6Packet::icmp(src, all_mld_routers, 1, &MLD2_REPORT).behind(HOPOPTS)
    }

    /// A UDP datagram (port 12345 to 7000, no payload), hop limit 64.
    pub fn udp(src: Ipv6Addr, dst: Ipv6Addr) -> Ipv6Packet {
        Ipv6Packet {
            src,
            dst,
            hop_limit: 64,
            next: UDP,
            rest: vec![0x30, 0x39, 0x1b, 0x58, 0, 8, 0, 0],
        }
    }

    /// The same packet with hop limit `hop_limit`.
    pub fn hop_limit(self, hop_limit: u8) -> Ipv6Packet {
        Ipv6Packet { hop_limit, ..self }
    }

    /// The same packet with an 8-octet `header` (`HOPOPTS`, with a router alert, or
    /// `DSTOPTS`, with padding) inserted right after the fixed header.
    pub fn behind(self, header: u8) -> Ipv6Packet {
        let options: [u8; 6] = if header == HOPOPTS {
            [5, 2, 0, 0, 1, 0]
        } else {
            [1, 4, 0, 0, 0, 0]
        };
        self.behind_header(header, options)
    }

    /// The same packet with an 8-octet extension header of type `kind` inserted right after
    /// the fixed header: the next header, a length of 0, then `body` (for `ROUTING`: the
    /// routing type, the segments left and four reserved bytes).
    pub fn behind_header(self, kind: u8, body: [u8; 6]) -> Ipv6Packet {
        let mut rest = vec![self.next, 0];
        rest.extend_from_slice(&body);
        rest.extend_from_slice(&self.rest);
        Ipv6Packet {
            next: kind,
            rest,
            ..self
        }
    }

    /// The same packet as the fragment at `offset` (in 8-octet units) of datagram `id`: a
    /// fragment header inserted right after the fixed header, what followed it as the
    /// fragment's data.
    pub fn fragment(self, id: u32, offset: u16, more: bool) -> Ipv6Packet {
        let field = (offset << 3) | u16::from(more);
        let [a, b] = field.to_be_bytes();
        let [c, d, e, f] = id.to_be_bytes();
        self.behind_header(FRAGMENT, [a, b, c, d, e, f])
    }

    /// The Ethernet frame carrying it from `src_mac` to `dst_mac`.
    pub fn frame(&self, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
        let len = u16::try_from(self.rest.len()).unwrap_or(u16::MAX);
        let mut f = Vec::with_capacity(54 + self.rest.len());
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&[self.next, self.hop_limit]);
        f.extend_from_slice(&self.src.octets());
        f.extend_from_slice(&self.dst.octets());
        f.extend_from_slice(&self.rest);
        f
    }
}

/// One IPv4 packet, fragment fields included: what a test needs to send a fragment whose
/// first fragment never was (the header checksum is computed; the payload is sent as given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Packet {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// The protocol number.
    pub protocol: u8,
    /// The identification.
    pub id: u16,
    /// The fragment offset in units of 8 octets (0: the first or only fragment).
    pub offset: u16,
    /// Whether more fragments follow.
    pub more: bool,
    /// What follows the header.
    pub payload: Vec<u8>,
}

impl Ipv4Packet {
    /// The Ethernet frame carrying it from `src_mac` to `dst_mac`.
    pub fn frame(&self, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
        let total = u16::try_from(20 + self.payload.len()).unwrap_or(u16::MAX);
        let frag = (self.offset & 0x1fff) | if self.more { 0x2000 } else { 0 };
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&self.id.to_be_bytes());
        ip.extend_from_slice(&frag.to_be_bytes());
        ip.extend_from_slice(&[64, self.protocol, 0, 0]);
        ip.extend_from_slice(&self.src.octets());
        ip.extend_from_slice(&self.dst.octets());
        let checksum = internet_checksum(&ip);
        ip[10..12].copy_from_slice(&checksum.to_be_bytes());
        let mut f = Vec::with_capacity(34 + self.payload.len());
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&self.payload);
        f
    }
}

/// `frame` (Ethernet, then an IPv4 header without options) with `option` (a multiple of 4
/// bytes) added to its IPv4 header: the header length, total length and checksum follow
/// (an L4 checksum does not cover the IP header's options).
pub fn with_ipv4_option(frame: &[u8], option: &[u8]) -> Vec<u8> {
    assert!(
        option.len().is_multiple_of(4) && frame[14] == 0x45,
        "an option to a plain header"
    );
    let mut f = frame[..34].to_vec();
    f.extend_from_slice(option);
    f.extend_from_slice(&frame[34..]);
    f[14] = 0x45 + (option.len() / 4) as u8;
    let total = u16::from_be_bytes([f[16], f[17]]) + option.len() as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let checksum = internet_checksum(&f[14..34 + option.len()]);
    f[24..26].copy_from_slice(&checksum.to_be_bytes());
    f
}

/// An ICMP port unreachable (ICMPv6's, type 1 code 4, for IPv6) from `from` to `to`, framed
/// from `macs.0` to `macs.1`, quoting a UDP datagram `quoted.0` -> `quoted.1` (its IP header
/// and UDP header, 8 bytes of payload): what a pod forging an error about someone else's
/// connection sends. Every checksum a stack checks is valid (the ICMP one, the quoted IPv4
/// header's).
pub fn port_unreachable(
    from: IpAddr,
    to: IpAddr,
    quoted: (SocketAddr, SocketAddr),
    macs: ([u8; 6], [u8; 6]),
) -> Vec<u8> {
    let mut udp = quoted.0.port().to_be_bytes().to_vec();
    udp.extend(quoted.1.port().to_be_bytes());
    udp.extend([0, 16, 0, 0]);
    match (from, to, quoted.0.ip(), quoted.1.ip()) {
        (IpAddr::V4(from), IpAddr::V4(to), IpAddr::V4(qs), IpAddr::V4(qd)) => {
            let mut quote = vec![0x45, 0, 0, 36, 0, 1, 0x40, 0, 64, 17, 0, 0];
            quote.extend(qs.octets());
            quote.extend(qd.octets());
            let check = internet_checksum(&quote);
            quote[10..12].copy_from_slice(&check.to_be_bytes());
            quote.extend(udp);
            let mut icmp = vec![3, 3, 0, 0, 0, 0, 0, 0];
            icmp.extend(quote);
            let check = internet_checksum(&icmp);
            icmp[2..4].copy_from_slice(&check.to_be_bytes());
            let packet = Ipv4Packet {
                src: from,
                dst: to,
                protocol: 1,
                id: 7,
                offset: 0,
                more: false,
                payload: icmp,
            };
            packet.frame(macs.0, macs.1)
        }
        (IpAddr::V6(from), IpAddr::V6(to), IpAddr::V6(qs), IpAddr::V6(qd)) => {
            let mut icmp = vec![1, 4, 0, 0, 0, 0, 0, 0, 0x60, 0, 0, 0, 0, 16, 17, 64];
            icmp.extend(qs.octets());
            icmp.extend(qd.octets());
            icmp.extend(udp);
            let mut pseudo = from.octets().to_vec();
            pseudo.extend(to.octets());
            pseudo.extend((icmp.len() as u32).to_be_bytes());
            pseudo.extend([0, 0, 0, 58]);
            pseudo.extend(&icmp);
            let check = internet_checksum(&pseudo);
            icmp[2..4].copy_from_slice(&check.to_be_bytes());
            Ipv6Packet::icmp(from, to, 64, &icmp).frame(macs.0, macs.1)
        }
        _ => panic!("{from}, {to} and {quoted:?} are not of one family"),
    }
}

/// The one's complement of the one's complement sum of `bytes` as 16-bit words.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A broadcast ARP request from `src_mac` (`sender`) for `target`.
pub fn arp_request(src_mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}

/// Sends `frame` as it is on `ifname` inside `ns`. The packet's protocol is the frame's
/// EtherType (what a program on the interface's own egress sees as `skb->protocol`).
///
/// Trap: a frame that a program on the interface's own egress drops (`cel_to_container` on a
/// host veth) is reported to the sender as ENOBUFS; that is a verdict, not a failure, and
/// counts as sent here.
pub fn send(ns: &NetNs, ifname: &str, frame: Vec<u8>) -> Result<()> {
    let name = ifname.to_string();
    let sent = ns.run(move || -> nix::Result<usize> {
        let (fd, ifindex) = packet_socket(&name)?;
        let ethertype = frame
            .get(12..14)
            .map_or(0, |t| u16::from_be_bytes([t[0], t[1]]));
        let to = link_addr(ifindex, ethertype)?;
        sendto(fd.as_raw_fd(), &frame, &to, MsgFlags::empty())
    })?;
    match sent {
        Ok(_) | Err(nix::errno::Errno::ENOBUFS) => Ok(()),
        Err(e) => Err(Error::Probe {
            probe: "packet socket send",
            target: format!("{ifname} in {}", ns.name()),
            source: e.into(),
        }),
    }
}

/// A raw packet socket, and the index of `ifname` (in the calling thread's namespace).
fn packet_socket(ifname: &str) -> nix::Result<(OwnedFd, u32)> {
    let ifindex = nix::net::if_::if_nametoindex(ifname)?;
    let fd = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::empty(),
        None,
    )?;
    Ok((fd, ifindex))
}

/// Every protocol, as a packet socket binds to it (`ETH_P_ALL`).
const ETH_P_ALL: u16 = 0x0003;

/// The frames an interface sees (both ways), read through a packet socket opened inside its
/// namespace: for tests that must check what arrived byte for byte, checksums included, which
/// no socket API shows.
#[derive(Debug)]
pub struct Capture {
    fd: OwnedFd,
    what: String,
}

impl Capture {
    /// Starts capturing on `ifname` in `ns`; frames from now on are kept until read.
    pub fn open(ns: &NetNs, ifname: &str) -> Result<Capture> {
        let name = ifname.to_string();
        let fd = ns.run(move || -> nix::Result<OwnedFd> {
            let (fd, ifindex) = packet_socket(&name)?;
            bind(fd.as_raw_fd(), &link_addr(ifindex, ETH_P_ALL)?)?;
            Ok(fd)
        })?;
        let what = format!("{ifname} in {}", ns.name());
        let fd = fd.map_err(|e| Error::Probe {
            probe: "packet socket capture",
            target: what.clone(),
            source: e.into(),
        })?;
        Ok(Capture { fd, what })
    }

    /// The first frame `wanted` accepts, waiting up to `timeout` for it.
    pub fn next(&self, timeout: Duration, wanted: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let n = setsockopt(
                &self.fd,
                sockopt::ReceiveTimeout,
                &nix::sys::time::TimeVal::new(
                    left.as_secs() as _,
                    left.subsec_micros().max(1) as _,
                ),
            )
            .and_then(|()| recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()))
            .map_err(|e| Error::Probe {
                probe: "packet socket capture",
                target: self.what.clone(),
                source: e.into(),
            })?;
            if wanted(&buf[..n]) {
                return Ok(buf[..n].to_vec());
            }
        }
    }
}

/// The packet-socket address of interface `ifindex` for frames of `ethertype` (nix has no
/// safe constructor for it).
#[allow(unsafe_code)]
fn link_addr(ifindex: u32, ethertype: u16) -> nix::Result<LinkAddr> {
    let ll = nix::libc::sockaddr_ll {
        sll_family: nix::libc::AF_PACKET as u16,
        sll_protocol: ethertype.to_be(),
        sll_ifindex: i32::try_from(ifindex).map_err(|_| nix::errno::Errno::EINVAL)?,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 0,
        sll_addr: [0; 8],
    };
    let len = u32::try_from(std::mem::size_of_val(&ll)).map_err(|_| nix::errno::Errno::EINVAL)?;
    // SAFETY: `ll` is a fully initialised sockaddr_ll that lives across the call, and `len` is
    // its size; `from_raw` copies it.
    unsafe { LinkAddr::from_raw(std::ptr::from_ref(&ll).cast(), Some(len)) }
        .ok_or(nix::errno::Errno::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_the_fixed_header_and_extension_headers_in_order() {
        let (src, dst) = (
            "fe80::1".parse().unwrap(),
            "ff02::1:ff00:5".parse().unwrap(),
        );
        let p = Ipv6Packet::solicitation(src, dst, "fd00::5".parse().unwrap());
        let f = p.clone().behind(DSTOPTS).frame([1; 6], [2; 6]);
        assert_eq!(&f[..6], &[2; 6]);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!(f[14] >> 4, 6);
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 8 + 24);
        assert_eq!((f[20], f[21]), (DSTOPTS, 255));
        assert_eq!(&f[22..38], &src.octets());
        assert_eq!((f[54], f[55]), (ICMPV6, 0));
        assert_eq!(f[62], 135);
        let v4 = Ipv4Packet {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            protocol: UDP,
            id: 0x1234,
            offset: 185,
            more: false,
            payload: vec![0; 16],
        }
        .frame([1; 6], [2; 6]);
        assert_eq!(&v4[12..14], &[0x08, 0x00]);
        assert_eq!(u16::from_be_bytes([v4[16], v4[17]]), 36);
        assert_eq!(u16::from_be_bytes([v4[20], v4[21]]), 185);
        assert_eq!(
            internet_checksum(&v4[14..34]),
            0,
            "the header checksums to zero"
        );
        let frag = Ipv6Packet::udp(src, src).fragment(0x0102_0304, 185, true);
        assert_eq!(frag.next, FRAGMENT);
        assert_eq!(&frag.rest[..8], &[UDP, 0, 0x05, 0xc9, 1, 2, 3, 4]);
        let r = Ipv6Packet::listener_report(src);
        assert_eq!(
            (r.next, r.hop_limit, r.rest[0], r.rest[8]),
            (HOPOPTS, 1, ICMPV6, 143)
        );
        assert_eq!(p.hop_limit(254).hop_limit, 254);
    }
}

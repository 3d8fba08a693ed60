//! `#[repr(C)]` mirrors of the structs in `bpf/include/cellium/*.h`, and
//! their byte encoding for map keys and values.
//!
//! Fields typed `__be16`/`__be32` in C hold network-order bytes; here they
//! are `u16`/`u32` whose in-memory bytes are those network-order bytes
//! (use [`be32`], [`ipv4_of`], [`u16::to_be`], [`u16::from_be`]). The
//! encoding writes each field at its `offset_of!`, so it is exactly the
//! `repr(C)` layout, which the tests below compare with what the C
//! compiler produced for the headers (`build/layout.c`).

use std::mem::{offset_of, size_of};
use std::net::{IpAddr, Ipv4Addr};

use crate::types::{EndpointFlags, MacAddr};

/// Constants generated from the C headers at build time.
#[allow(missing_docs, non_upper_case_globals, dead_code)]
pub(crate) mod c {
    include!(concat!(env!("OUT_DIR"), "/layout.rs"));
}

/// The layout version of this build (`CEL_LAYOUT_VERSION`).
pub const LAYOUT_VERSION: u32 = 1;

/// A type that is a key or value of a datapath map.
pub trait Plain: Sized {
    /// Size in bytes, as in C.
    const SIZE: usize;
    /// The bytes the kernel expects; padding is zero.
    fn encode(&self) -> Vec<u8>;
    /// Decodes bytes read from the kernel; `None` if the length is wrong.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

/// One field's bytes at the start of a slice.
trait Field: Sized {
    fn put(&self, out: &mut [u8]);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn put(&self, out: &mut [u8]) {
                out[..size_of::<$t>()].copy_from_slice(&self.to_ne_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut b = [0u8; size_of::<$t>()];
                b.copy_from_slice(&bytes[..size_of::<$t>()]);
                <$t>::from_ne_bytes(b)
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64);

impl<T: Field + Copy + Default, const N: usize> Field for [T; N] {
    fn put(&self, out: &mut [u8]) {
        for (i, v) in self.iter().enumerate() {
            v.put(&mut out[i * size_of::<T>()..]);
        }
    }
    fn get(bytes: &[u8]) -> Self {
        let mut a = [T::default(); N];
        for (i, v) in a.iter_mut().enumerate() {
            *v = T::get(&bytes[i * size_of::<T>()..]);
        }
        a
    }
}

impl Field for MacAddr {
    fn put(&self, out: &mut [u8]) {
        self.0.put(out)
    }
    fn get(bytes: &[u8]) -> Self {
        MacAddr(Field::get(bytes))
    }
}

impl Field for EndpointFlags {
    fn put(&self, out: &mut [u8]) {
        self.0.put(out)
    }
    fn get(bytes: &[u8]) -> Self {
        EndpointFlags(Field::get(bytes))
    }
}

/// Implements [`Plain`] from the list of every field (padding included).
macro_rules! plain {
    ($ty:ident { $($f:ident),* $(,)? }) => {
        impl Plain for $ty {
            const SIZE: usize = size_of::<$ty>();
            fn encode(&self) -> Vec<u8> {
                let mut out = vec![0u8; Self::SIZE];
                $( Field::put(&self.$f, &mut out[offset_of!($ty, $f)..]); )*
                out
            }
            fn decode(bytes: &[u8]) -> Option<Self> {
                if bytes.len() != Self::SIZE {
                    return None;
                }
                Some(Self { $( $f: Field::get(&bytes[offset_of!($ty, $f)..]), )* })
            }
        }
    };
}

pub mod releases;

impl Plain for u32 {
    const SIZE: usize = 4;
    fn encode(&self) -> Vec<u8> {
        self.to_ne_bytes().to_vec()
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == 4).then(|| Field::get(bytes))
    }
}

impl Plain for u8 {
    const SIZE: usize = 1;
    fn encode(&self) -> Vec<u8> {
        vec![*self]
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == 1).then(|| bytes[0])
    }
}

impl Plain for u16 {
    const SIZE: usize = 2;
    fn encode(&self) -> Vec<u8> {
        self.to_ne_bytes().to_vec()
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == 2).then(|| Field::get(bytes))
    }
}

/// An IPv4 address as a `__be32` field.
pub fn be32(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// The IPv4 address in a `__be32` field.
pub fn ipv4_of(be: u32) -> Ipv4Addr {
    Ipv4Addr::from(be.to_ne_bytes())
}

/// Family number and 16 address bytes (IPv4 in the first four).
pub fn family_and_bytes(ip: IpAddr) -> (u8, [u8; 16]) {
    let mut addr = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => {
            addr[..4].copy_from_slice(&v4.octets());
            (4, addr)
        }
        IpAddr::V6(v6) => (6, v6.octets()),
    }
}

/// The address for a family number and 16 bytes, if the family is known.
pub fn ip_of(family: u8, addr: [u8; 16]) -> Option<IpAddr> {
    match family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            addr[0], addr[1], addr[2], addr[3],
        ))),
        6 => Some(IpAddr::V6(addr.into())),
        _ => None,
    }
}

/// `struct endpoint_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EndpointKey {
    /// Address bytes, IPv4 in `addr[0..4]`.
    pub addr: [u8; 16],
    /// 4 or 6.
    pub family: u8,
    /// Zero.
    pub pad: [u8; 3],
}
plain!(EndpointKey { addr, family, pad });

impl EndpointKey {
    /// The key of an endpoint address.
    pub fn new(ip: IpAddr) -> Self {
        let (family, addr) = family_and_bytes(ip);
        Self {
            addr,
            family,
            pad: [0; 3],
        }
    }

    /// The address, if the family is valid.
    pub fn ip(&self) -> Option<IpAddr> {
        ip_of(self.family, self.addr)
    }
}

/// `struct endpoint_info`: what the datapath knows about a local pod.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EndpointInfo {
    /// Host-side veth ifindex (node netns).
    pub ifindex: u32,
    /// Endpoint id: the policy map's key.
    pub id: u16,
    /// Which directions enforce policy.
    pub flags: EndpointFlags,
    /// Security identity of the pod.
    pub identity: u32,
    /// MAC of the host-side veth.
    pub host_mac: MacAddr,
    /// MAC of the pod's eth0.
    pub pod_mac: MacAddr,
    /// The identity other nodes know the pod by (the VNI it sends with): that of its labels
    /// without `cidr:` labels, which differs from `identity` (node-local then) only when a
    /// policy's ipBlock covers its address.
    pub cluster_identity: u32,
}
plain!(EndpointInfo {
    ifindex,
    id,
    flags,
    identity,
    host_mac,
    pod_mac,
    cluster_identity
});

/// `struct ipcache_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpcacheKey {
    /// 32 + IP prefix length.
    pub prefixlen: u32,
    /// 4 or 6.
    pub family: u8,
    /// Zero.
    pub pad: [u8; 3],
    /// Address bytes.
    pub addr: [u8; 16],
}
plain!(IpcacheKey {
    prefixlen,
    family,
    pad,
    addr
});

/// `struct ipcache_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpcacheValue {
    /// Security identity.
    pub identity: u32,
    /// Tunnel mode: the IPv4 address of the node hosting the prefix, as its four bytes in
    /// network order read natively (`u32::from_ne_bytes(ip.octets())`); 0 when traffic to it
    /// is not tunnelled.
    pub tunnel_endpoint: u32,
}
plain!(IpcacheValue {
    identity,
    tunnel_endpoint
});

/// `struct policy_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PolicyKey {
    /// Key bits that count: 64, 80, 80 + port prefix, 96.
    pub prefixlen: u32,
    /// Endpoint id.
    pub endpoint_id: u16,
    /// 0 ingress, 1 egress.
    pub direction: u8,
    /// Zero.
    pub pad1: u8,
    /// Peer identity, 0 = any.
    pub identity: u32,
    /// IP protocol number.
    pub protocol: u8,
    /// Zero.
    pub pad2: u8,
    /// Destination port, network order.
    pub dport: u16,
}
plain!(PolicyKey {
    prefixlen,
    endpoint_id,
    direction,
    pad1,
    identity,
    protocol,
    pad2,
    dport
});

/// `struct policy_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PolicyValue {
    /// 1 = deny, 0 = allow.
    pub deny: u8,
    /// `CEL_POLICY_F_*`.
    pub flags: u8,
    /// Reserved for an allow's L7 proxy redirect (network order); zero.
    pub proxy_port: u16,
    /// Reserved for the rule that made the entry; zero (flows name the deciding policies
    /// from the agent's resolved policy).
    pub cookie: u32,
}
plain!(PolicyValue {
    deny,
    flags,
    proxy_port,
    cookie
});

/// `struct ct_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtKey {
    /// Source, network order.
    pub saddr: u32,
    /// Destination, network order.
    pub daddr: u32,
    /// Source port (ICMP echo request: identifier), network order.
    pub sport: u16,
    /// Destination port (ICMP echo reply: identifier), network order.
    pub dport: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// `CEL_CT_F_SERVICE` for client -> VIP entries.
    pub flags: u8,
    /// Zero.
    pub pad: u16,
}
plain!(CtKey {
    saddr,
    daddr,
    sport,
    dport,
    protocol,
    flags,
    pad
});

/// `struct ct6_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ct6Key {
    /// Source address bytes.
    pub saddr: [u8; 16],
    /// Destination address bytes.
    pub daddr: [u8; 16],
    /// Source port (ICMPv6 echo request: identifier), network order.
    pub sport: u16,
    /// Destination port (ICMPv6 echo reply: identifier), network order.
    pub dport: u16,
    /// The upper-layer protocol number.
    pub protocol: u8,
    /// `CEL_CT_F_SERVICE` for client -> VIP entries.
    pub flags: u8,
    /// Zero.
    pub pad: u16,
}
plain!(Ct6Key {
    saddr,
    daddr,
    sport,
    dport,
    protocol,
    flags,
    pad
});

/// `struct ct_entry`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtEntry {
    /// Deadline on the CLOCK_MONOTONIC scale of `bpf_ktime_get_ns`.
    pub expires_ns: u64,
    /// Creation time, same clock.
    pub created_ns: u64,
    /// Packets [forward, reply].
    pub packets: [u64; 2],
    /// Bytes [forward, reply].
    pub bytes: [u64; 2],
    /// Service entries: the chosen backend.
    pub backend_id: u32,
    /// Non-zero: replies are reverse-NATed with this id.
    pub rev_nat_id: u16,
    /// TCP flags seen [forward, reply].
    pub tcp_flags: [u8; 2],
    /// `CEL_CT_STATE_*`.
    pub state: u8,
    /// `CEL_CT_F_SRC_LOCAL` / `CEL_CT_F_DST_LOCAL`: the ends delivered to a local endpoint
    /// past its ingress policy (zero in entries of older builds: checked once more).
    pub flags: u8,
    /// A tuple clash's source port translation, network order (0: none): on a service entry
    /// the port the client's packets get, on the translated entry the client's own port.
    pub nat_port: u16,
    /// Zero.
    pub pad2: u32,
}
plain!(CtEntry {
    expires_ns,
    created_ns,
    packets,
    bytes,
    backend_id,
    rev_nat_id,
    tcp_flags,
    state,
    flags,
    nat_port,
    pad2
});

/// `struct frag4_key`: one IPv4 datagram being fragmented.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Frag4Key {
    /// Source, network order.
    pub saddr: u32,
    /// Destination, network order.
    pub daddr: u32,
    /// The IP identification, network order.
    pub id: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Zero.
    pub pad: u8,
}
plain!(Frag4Key {
    saddr,
    daddr,
    id,
    protocol,
    pad
});

/// `struct frag6_key`: one IPv6 datagram being fragmented.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Frag6Key {
    /// Source address bytes.
    pub saddr: [u8; 16],
    /// Destination address bytes.
    pub daddr: [u8; 16],
    /// The fragment header's identification, network order.
    pub id: u32,
    /// The fragment header's next header.
    pub protocol: u8,
    /// Zero.
    pub pad: [u8; 3],
}
plain!(Frag6Key {
    saddr,
    daddr,
    id,
    protocol,
    pad
});

/// `struct frag_ports`: the upper-layer protocol and ports a datagram's first fragment
/// carried.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FragPorts {
    /// Source port (ICMP echo request: identifier), network order.
    pub sport: u16,
    /// Destination port (ICMP echo reply: identifier), network order.
    pub dport: u16,
    /// The upper-layer protocol number.
    pub protocol: u8,
    /// Zero.
    pub pad: [u8; 3],
}
plain!(FragPorts {
    sport,
    dport,
    protocol,
    pad
});

/// `struct lb4_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb4Key {
    /// Frontend address, network order.
    pub vip: u32,
    /// Frontend port, network order.
    pub dport: u16,
    /// 0 = the service, 1..=count = backend slots.
    pub slot: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Zero.
    pub pad: [u8; 3],
}
plain!(Lb4Key {
    vip,
    dport,
    slot,
    protocol,
    pad
});

/// `struct lb4_service`: slot 0 is the service, other slots a backend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb4Service {
    /// Backend id (slots >= 1); slot 0: the session affinity timeout in seconds, 0 = none.
    pub backend_id: u32,
    /// Number of backend slots (slot 0).
    pub count: u16,
    /// Reverse NAT id (slot 0).
    pub rev_nat_id: u16,
    /// Reserved.
    pub flags: u8,
    /// Zero.
    pub pad: [u8; 3],
}
plain!(Lb4Service {
    backend_id,
    count,
    rev_nat_id,
    flags,
    pad
});

/// `struct lb4_src_range_key`: a client prefix the frontend `rev_nat_id` admits.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb4SrcRangeKey {
    /// `CEL_LB_SRC_RANGE_STATIC_PREFIX` + the client prefix's length.
    pub prefixlen: u32,
    /// The frontend.
    pub rev_nat_id: u16,
    /// Zero.
    pub pad: u16,
    /// The prefix's address bytes.
    pub addr: [u8; 4],
}
plain!(Lb4SrcRangeKey {
    prefixlen,
    rev_nat_id,
    pad,
    addr
});

/// `struct lb6_src_range_key`: [`Lb4SrcRangeKey`] for IPv6 clients.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb6SrcRangeKey {
    /// `CEL_LB_SRC_RANGE_STATIC_PREFIX` + the client prefix's length.
    pub prefixlen: u32,
    /// The frontend.
    pub rev_nat_id: u16,
    /// Zero.
    pub pad: u16,
    /// The prefix's address bytes.
    pub addr: [u8; 16],
}
plain!(Lb6SrcRangeKey {
    prefixlen,
    rev_nat_id,
    pad,
    addr
});

/// `struct lb_affinity_match`: backend `backend_id` is one of the frontend `rev_nat_id`'s
/// (for session affinity).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LbAffinityMatch {
    /// The backend.
    pub backend_id: u32,
    /// The frontend.
    pub rev_nat_id: u16,
    /// Zero.
    pub pad: u16,
}
plain!(LbAffinityMatch {
    backend_id,
    rev_nat_id,
    pad
});

/// `struct lb4_backend`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb4Backend {
    /// Address, network order.
    pub addr: u32,
    /// Port, network order.
    pub port: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Reserved.
    pub flags: u8,
}
plain!(Lb4Backend {
    addr,
    port,
    protocol,
    flags
});

/// `struct lb4_reverse_nat`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb4ReverseNat {
    /// Frontend address, network order.
    pub vip: u32,
    /// Frontend port, network order.
    pub port: u16,
    /// Zero.
    pub pad: u16,
}
plain!(Lb4ReverseNat { vip, port, pad });

/// `struct snat4_value`: a `cel_snat4` value, the address and port a tuple translates to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Snat4Value {
    /// Address, network order.
    pub addr: u32,
    /// Port (ICMP echo: identifier), network order.
    pub port: u16,
    /// Zero.
    pub pad: u16,
}
plain!(Snat4Value { addr, port, pad });

/// `struct snat6_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Snat6Value {
    /// Address bytes.
    pub addr: [u8; 16],
    /// Port (ICMPv6 echo: identifier), network order.
    pub port: u16,
    /// Zero.
    pub pad: u16,
}
plain!(Snat6Value { addr, port, pad });

/// `CEL_SNAT_F_FORWARD`: a `cel_snat*` key that is a client's tuple (its value: the
/// translated source), not a reply's (its value: the client).
pub const SNAT_F_FORWARD: u8 = 1 << 1;

/// `struct lb6_key` (its slots hold [`Lb4Service`] values, as IPv4's).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb6Key {
    /// Frontend address bytes.
    pub vip: [u8; 16],
    /// Frontend port, network order.
    pub dport: u16,
    /// 0 = the service, 1..=count = backend slots.
    pub slot: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Zero.
    pub pad: [u8; 3],
}
plain!(Lb6Key {
    vip,
    dport,
    slot,
    protocol,
    pad
});

/// `struct lb6_backend`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb6Backend {
    /// Address bytes.
    pub addr: [u8; 16],
    /// Port, network order.
    pub port: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Reserved.
    pub flags: u8,
}
plain!(Lb6Backend {
    addr,
    port,
    protocol,
    flags
});

/// `struct lb6_reverse_nat`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lb6ReverseNat {
    /// Frontend address bytes.
    pub vip: [u8; 16],
    /// Frontend port, network order.
    pub port: u16,
    /// Zero.
    pub pad: u16,
}
plain!(Lb6ReverseNat { vip, port, pad });

/// `struct datapath_config`: datapath-wide settings (timeouts in seconds).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatapathConfig {
    /// Layout version of the writer; always first.
    pub layout_version: u32,
    /// `CEL_CFG_F_*` (see [`DatapathConfig::POLICY_VERDICT_EVENTS`]).
    pub flags: u32,
    /// TCP connections that have not completed the handshake.
    pub ct_tcp_syn: u32,
    /// Established TCP connections.
    pub ct_tcp_established: u32,
    /// TCP connections after RST or FIN from both sides.
    pub ct_tcp_closing: u32,
    /// UDP and SCTP flows.
    pub ct_udp: u32,
    /// ICMP flows.
    pub ct_icmp: u32,
    /// Other protocols.
    pub ct_other: u32,
    /// Tunnel mode: the ifindex of the node's VXLAN device; 0 in native routing.
    pub tunnel_ifindex: u32,
    /// Tunnel mode: the VXLAN device's UDP port, network order; 0 in native routing.
    pub tunnel_port: u16,
    /// Zero.
    pub pad: u16,
    /// Socket-level load balancing: the cookie of the node's network namespace, whose
    /// sockets the cgroup hooks translate; 0 translates none.
    pub host_netns_cookie: u64,
}
plain!(DatapathConfig {
    layout_version,
    flags,
    ct_tcp_syn,
    ct_tcp_established,
    ct_tcp_closing,
    ct_udp,
    ct_icmp,
    ct_other,
    tunnel_ifindex,
    tunnel_port,
    pad,
    host_netns_cookie
});

impl DatapathConfig {
    /// Emit a policy-verdict event for every new connection.
    pub const POLICY_VERDICT_EVENTS: u32 = 1 << 0;
    /// The node has pods of both families: an address outside the ipcache is world-ipv4 (9)
    /// or world-ipv6 (10), as in Cilium's dual-stack mode, instead of world (2).
    pub const WORLD_PER_FAMILY: u32 = 1 << 1;
    /// Emit a trace event for every new connection forwarded (with its policy match and
    /// service). Tested once per new connection, so established traffic pays nothing.
    pub const TRACE_EVENTS: u32 = 1 << 2;
    /// A new connection to a frontend without backends is refused with an ICMP (ICMPv6) port
    /// unreachable sent back into the client pod; clear, it is only dropped.
    pub const SERVICE_REJECT: u32 = 1 << 3;
    /// Count every packet and byte of a connection in its conntrack entry; clear, an entry
    /// holds its first packet's only, and established traffic writes nothing to it.
    pub const CT_ACCOUNTING: u32 = 1 << 4;
    /// Direct server return for TCP: a NodePort connection balanced to another node's backend
    /// keeps the client's source (native routing only).
    pub const DSR_TCP: u32 = 1 << 5;
    /// Direct server return for UDP, as [`Self::DSR_TCP`].
    pub const DSR_UDP: u32 = 1 << 6;
    /// BPF masquerading of pods' IPv4 connections to the world (`enable-bpf-masquerade` with
    /// `enable-ipv4-masquerade`): their source becomes the address of the node's device they
    /// leave by.
    pub const MASQ4: u32 = 1 << 7;
    /// BPF masquerading of pods' IPv6, as [`Self::MASQ4`].
    pub const MASQ6: u32 = 1 << 8;
}

impl Default for DatapathConfig {
    /// The header's defaults, stamped with this build's layout version.
    fn default() -> Self {
        Self {
            layout_version: LAYOUT_VERSION,
            flags: 0,
            ct_tcp_syn: 60,
            ct_tcp_established: 21600,
            ct_tcp_closing: 10,
            ct_udp: 60,
            ct_icmp: 60,
            ct_other: 60,
            tunnel_ifindex: 0,
            tunnel_port: 0,
            pad: 0,
            host_netns_cookie: 0,
        }
    }
}

/// `struct metrics_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MetricsValue {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}
plain!(MetricsValue { packets, bytes });

/// `struct event`: a ring-buffer record.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawEvent {
    /// bpf_ktime_get_ns().
    pub ktime: u64,
    /// `CEL_EVENT_*`.
    pub kind: u8,
    /// `CEL_REASON_*`.
    pub reason: u8,
    /// `CEL_DIR_*`.
    pub direction: u8,
    /// IP protocol number (IPv6: the fixed header's next header).
    pub protocol: u8,
    /// Endpoint whose hook or policy decided.
    pub endpoint_id: u16,
    /// 4 or 6.
    pub family: u8,
    /// TCP: the packet's flags byte.
    pub tcp_flags: u8,
    /// Source identity (0 if not yet known).
    pub src_identity: u32,
    /// Destination identity (0 if not yet known).
    pub dst_identity: u32,
    /// Source address bytes, IPv4 in `saddr[0..4]`.
    pub saddr: [u8; 16],
    /// Destination address bytes, IPv4 in `daddr[0..4]`.
    pub daddr: [u8; 16],
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// Interface the program ran on.
    pub ifindex: u32,
    /// Packet length.
    pub len: u32,
    /// `CEL_VERDICT_*`.
    pub verdict: u8,
    /// `CEL_MATCH_*`: egress in the low four bits, ingress in the high four.
    pub match_type: u8,
    /// Traces: the rev-NAT id of the frontend the connection was translated through.
    pub rev_nat_id: u16,
    /// ICMP and ICMPv6: the message's type.
    pub icmp_type: u8,
    /// ICMP and ICMPv6: the message's code.
    pub icmp_code: u8,
    /// Padding, zero.
    pub pad: [u8; 6],
}
plain!(RawEvent {
    ktime,
    kind,
    reason,
    direction,
    protocol,
    endpoint_id,
    family,
    tcp_flags,
    src_identity,
    dst_identity,
    saddr,
    daddr,
    sport,
    dport,
    ifindex,
    len,
    verdict,
    match_type,
    rev_nat_id,
    icmp_type,
    icmp_code,
    pad
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Compares size and field offsets of a mirror with the C struct.
    macro_rules! check {
        ($ty:ident, $c:ident { $($f:ident => $cf:ident),* $(,)? }) => {{
            assert_eq!(
                size_of::<$ty>(),
                generated(&format!("SIZEOF_{}", stringify!($c))),
                concat!("size of ", stringify!($ty))
            );
            $(
                assert_eq!(
                    offset_of!($ty, $f),
                    generated(&format!("OFFSETOF_{}_{}", stringify!($c), stringify!($cf))),
                    concat!(stringify!($ty), ".", stringify!($f))
                );
            )*
        }};
    }

    /// Looks a generated `usize` constant of `layout.rs` up by name.
    fn generated(name: &str) -> usize {
        let text = include_str!(concat!(env!("OUT_DIR"), "/layout.rs"));
        text.lines()
            .find_map(|l| {
                let rest = l.strip_prefix("pub const ")?;
                let (n, v) = rest.split_once(": usize = ")?;
                (n == name)
                    .then(|| v.trim_end_matches(';').parse().ok())
                    .flatten()
            })
            .unwrap_or_else(|| panic!("no {name} in layout.rs"))
    }

    #[test]
    fn layouts_match_the_headers() {
        check!(EndpointKey, endpoint_key { addr => addr, family => family });
        check!(EndpointInfo, endpoint_info {
            ifindex => ifindex, id => id, flags => flags, identity => identity,
            host_mac => host_mac, pod_mac => pod_mac, cluster_identity => cluster_identity,
        });
        check!(IpcacheKey, ipcache_key { prefixlen => prefixlen, family => family, addr => addr });
        check!(IpcacheValue, ipcache_value { identity => identity, tunnel_endpoint => tunnel_endpoint });
        check!(PolicyKey, policy_key {
            prefixlen => prefixlen, endpoint_id => endpoint_id, direction => direction,
            identity => identity, protocol => protocol, dport => dport,
        });
        check!(PolicyValue, policy_value {
            deny => deny, flags => flags, proxy_port => proxy_port, cookie => cookie,
        });
        check!(CtKey, ct_key {
            saddr => saddr, daddr => daddr, sport => sport, dport => dport,
            protocol => protocol, flags => flags,
        });
        check!(CtEntry, ct_entry {
            expires_ns => expires_ns, created_ns => created_ns, packets => packets, bytes => bytes,
            backend_id => backend_id, rev_nat_id => rev_nat_id, tcp_flags => tcp_flags,
            state => state, flags => flags, nat_port => nat_port,
        });
        check!(Frag4Key, frag4_key {
            saddr => saddr, daddr => daddr, id => id, protocol => protocol,
        });
        check!(Frag6Key, frag6_key {
            saddr => saddr, daddr => daddr, id => id, protocol => protocol,
        });
        check!(FragPorts, frag_ports { sport => sport, dport => dport, protocol => protocol });
        check!(Ct6Key, ct6_key {
            saddr => saddr, daddr => daddr, sport => sport, dport => dport,
            protocol => protocol, flags => flags,
        });
        check!(Lb4Key, lb4_key { vip => vip, dport => dport, slot => slot, protocol => protocol });
        check!(Lb4Service, lb4_service {
            backend_id => backend_id, count => count, rev_nat_id => rev_nat_id, flags => flags,
        });
        check!(Lb4SrcRangeKey, lb4_src_range_key {
            prefixlen => prefixlen, rev_nat_id => rev_nat_id, pad => pad, addr => addr,
        });
        check!(Lb6SrcRangeKey, lb6_src_range_key {
            prefixlen => prefixlen, rev_nat_id => rev_nat_id, pad => pad, addr => addr,
        });
        check!(LbAffinityMatch, lb_affinity_match { backend_id => backend_id, rev_nat_id => rev_nat_id });
        check!(Lb4Backend, lb4_backend { addr => addr, port => port, protocol => protocol, flags => flags });
        check!(Lb4ReverseNat, lb4_reverse_nat { vip => vip, port => port });
        check!(Lb6Key, lb6_key { vip => vip, dport => dport, slot => slot, protocol => protocol });
        check!(Lb6Backend, lb6_backend { addr => addr, port => port, protocol => protocol, flags => flags });
        check!(Lb6ReverseNat, lb6_reverse_nat { vip => vip, port => port });
        check!(Snat4Value, snat4_value { addr => addr, port => port, pad => pad });
        check!(Snat6Value, snat6_value { addr => addr, port => port, pad => pad });
        check!(DatapathConfig, datapath_config {
            layout_version => layout_version, flags => flags, ct_tcp_syn => ct_tcp_syn,
            ct_tcp_established => ct_tcp_established, ct_tcp_closing => ct_tcp_closing,
            ct_udp => ct_udp, ct_icmp => ct_icmp, ct_other => ct_other,
            tunnel_ifindex => tunnel_ifindex, tunnel_port => tunnel_port, pad => pad,
            host_netns_cookie => host_netns_cookie,
        });
        check!(MetricsValue, metrics_value { packets => packets, bytes => bytes });
        check!(RawEvent, event {
            ktime => ktime, kind => type, reason => reason, direction => direction,
            protocol => protocol, endpoint_id => endpoint_id, family => family,
            src_identity => src_identity,
            dst_identity => dst_identity, saddr => saddr, daddr => daddr, sport => sport,
            dport => dport, ifindex => ifindex, len => len, verdict => verdict,
            tcp_flags => tcp_flags, match_type => match, rev_nat_id => rev_nat_id,
            icmp_type => icmp_type, icmp_code => icmp_code, pad => pad,
        });
    }

    #[test]
    fn constants_match_the_headers() {
        assert_eq!(u64::from(LAYOUT_VERSION), c::CEL_LAYOUT_VERSION);
        assert_eq!(u64::from(SNAT_F_FORWARD), c::CEL_SNAT_F_FORWARD);
        assert_eq!(
            u64::from(DatapathConfig::POLICY_VERDICT_EVENTS),
            c::CEL_CFG_F_POLICY_VERDICT_EVENTS
        );
        assert_eq!(
            u64::from(DatapathConfig::WORLD_PER_FAMILY),
            c::CEL_CFG_F_WORLD_PER_FAMILY
        );
        assert_eq!(
            u64::from(DatapathConfig::TRACE_EVENTS),
            c::CEL_CFG_F_TRACE_EVENTS
        );
        assert_eq!(
            u64::from(DatapathConfig::SERVICE_REJECT),
            c::CEL_CFG_F_SERVICE_REJECT
        );
        assert_eq!(
            u64::from(DatapathConfig::CT_ACCOUNTING),
            c::CEL_CFG_F_CT_ACCOUNTING
        );
        assert_eq!(u64::from(DatapathConfig::DSR_TCP), c::CEL_CFG_F_DSR_TCP);
        assert_eq!(u64::from(DatapathConfig::DSR_UDP), c::CEL_CFG_F_DSR_UDP);
        assert_eq!(u64::from(DatapathConfig::MASQ4), c::CEL_CFG_F_MASQ4);
        assert_eq!(u64::from(DatapathConfig::MASQ6), c::CEL_CFG_F_MASQ6);
        assert_eq!(
            u64::from(crate::maps::ipmasq::NATIVE_ROUTING),
            c::CEL_IPMASQ_NATIVE_ROUTING
        );
        assert_eq!(u64::from(crate::maps::ipmasq::AGENT), c::CEL_IPMASQ_AGENT);
        assert_eq!(
            u64::from(crate::maps::lb::SERVICE_SOURCE_RANGE),
            c::CEL_SVC_F_SOURCE_RANGE
        );
        assert_eq!(
            u64::from(crate::maps::source_range::STATIC_PREFIX),
            c::CEL_LB_SRC_RANGE_STATIC_PREFIX
        );
        assert_eq!(
            u64::from(crate::maps::ipmasq::POD_CIDR),
            c::CEL_IPMASQ_POD_CIDR
        );
        assert_eq!(c::CEL_EVENT_TRACE, 3);
        assert_eq!(
            u64::from(crate::maps::metrics::EVENTS_LOST_REASON),
            c::CEL_REASON_EVENTS_LOST
        );
        for (ours, theirs) in [
            (crate::events::PolicyMatch::None, c::CEL_MATCH_NONE),
            (crate::events::PolicyMatch::L3Only, c::CEL_MATCH_L3_ONLY),
            (crate::events::PolicyMatch::L3L4, c::CEL_MATCH_L3_L4),
            (crate::events::PolicyMatch::L4Only, c::CEL_MATCH_L4_ONLY),
            (crate::events::PolicyMatch::All, c::CEL_MATCH_ALL),
        ] {
            assert_eq!(u64::from(ours as u8), theirs);
        }
        let d = DatapathConfig::default();
        assert_eq!(u64::from(d.ct_tcp_syn), c::CEL_CT_DEFAULT_TCP_SYN);
        assert_eq!(
            u64::from(d.ct_tcp_established),
            c::CEL_CT_DEFAULT_TCP_ESTABLISHED
        );
        assert_eq!(u64::from(d.ct_tcp_closing), c::CEL_CT_DEFAULT_TCP_CLOSING);
        assert_eq!(u64::from(d.ct_udp), c::CEL_CT_DEFAULT_UDP);
        assert_eq!(u64::from(d.ct_icmp), c::CEL_CT_DEFAULT_ICMP);
        assert_eq!(u64::from(d.ct_other), c::CEL_CT_DEFAULT_OTHER);
    }

    #[test]
    fn encoding_is_the_native_layout() {
        let key = CtKey {
            saddr: be32(Ipv4Addr::new(10, 0, 0, 1)),
            daddr: be32(Ipv4Addr::new(10, 0, 0, 2)),
            sport: 1234u16.to_be(),
            dport: 80u16.to_be(),
            protocol: 6,
            flags: 1,
            pad: 0,
        };
        let bytes = key.encode();
        assert_eq!(
            bytes,
            [10, 0, 0, 1, 10, 0, 0, 2, 0x04, 0xd2, 0, 80, 6, 1, 0, 0]
        );
        assert_eq!(CtKey::decode(&bytes), Some(key));
        assert_eq!(CtKey::decode(&bytes[1..]), None);

        let info = EndpointInfo {
            ifindex: 7,
            id: 3,
            flags: EndpointFlags::ENFORCE_EGRESS,
            identity: 0x01020304,
            host_mac: MacAddr([1, 2, 3, 4, 5, 6]),
            pod_mac: MacAddr([7, 8, 9, 10, 11, 12]),
            cluster_identity: 0x0506,
        };
        let round = EndpointInfo::decode(&info.encode());
        assert_eq!(round, Some(info));
    }

    #[test]
    fn endpoint_keys_carry_the_family() {
        let k = EndpointKey::new("10.1.2.3".parse().unwrap());
        assert_eq!(k.family, 4);
        assert_eq!(&k.addr[..4], &[10, 1, 2, 3]);
        assert_eq!(k.ip(), Some("10.1.2.3".parse().unwrap()));
        let k6 = EndpointKey::new("fd00::1".parse().unwrap());
        assert_eq!(k6.family, 6);
        assert_eq!(k6.ip(), Some("fd00::1".parse().unwrap()));
    }
}

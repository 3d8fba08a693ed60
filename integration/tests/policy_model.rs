//! The policy model against the datapath: rules compiled by `cellium_policy::compile` are
//! written into the real `cel_policy` map, and for a sample of peer identities, protocols and
//! ports, what the real programs decide about a new connection is what
//! `cellium_policy::decide` says (allowed, denied by a deny entry, or denied because nothing
//! matched), in both directions and both families.
//!
//! Root: `cargo test -p cellium-integration --test policy_model`.
//!
//! The programs run on crafted frames with `BPF_PROG_TEST_RUN`, in the node namespace of a
//! one-pod topology (the run's `ifindex` is the pod's host veth, so the source check passes):
//! `cel_from_container` for egress (the pod sends to a peer address), `cel_to_container` for
//! ingress (a peer address sends to the pod). Peer addresses resolve to identities through the
//! ipcache map (an IPv4 /16 and an IPv6 /32 per identity; outside them the world); every
//! probe uses an address of its own, so each is a new connection to conntrack and gets a
//! policy decision. The reason is read from the per-reason counters. IPv6 probes carry ICMPv6
//! where IPv4 ones carry ICMP: both are protocol-wide in policy.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use cellium_datapath_bpf::{
    Datapath, DatapathOptions, Direction, EndpointFlags, IpNet, PolicyRule, Protocol, Reason,
    Verdict,
};
use cellium_integration::{BpffsMount, Topology};
use cellium_policy::{Decision, decide};

/// TC verdicts (`linux/pkt_cls.h`).
const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

/// The pod's endpoint id and identity.
const ENDPOINT: u16 = 1;
const POD_IDENTITY: u32 = 1001;

/// Peer identities, each with the /16 its addresses come from (`None`: no ipcache entry, the
/// world). 16777216 is a CIDR identity's number.
const PEERS: [(u32, Option<u8>); 7] = [
    (2, None),
    (1, Some(98)),
    (300, Some(100)),
    (301, Some(101)),
    (302, Some(102)),
    (303, Some(103)),
    (16_777_216, Some(104)),
];

/// ICMPv6, to the policy model another protocol without ports.
const ICMPV6: Protocol = Protocol::Other(58);

/// The protocols probed in a family.
fn protocols(v6: bool) -> [Protocol; 5] {
    let icmp = if v6 { ICMPV6 } else { Protocol::Icmp };
    [
        Protocol::Tcp,
        Protocol::Udp,
        Protocol::Sctp,
        icmp,
        Protocol::Other(47),
    ]
}

/// The pod's IPv6 address (the endpoint map's entry is all the programs need).
const POD_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xaaaa, 0, 0, 0, 0, 0, 1);

/// Runs a TC program once on a frame, as if it arrived on `ifindex`.
#[allow(unsafe_code)]
mod prog_run {
    use std::os::fd::{AsRawFd, BorrowedFd};

    /// `sizeof(struct __sk_buff)` and the offset of its `ifindex` (`linux/bpf.h`, stable
    /// UAPI); libbpf-sys has no binding for the struct.
    const SK_BUFF_SIZE: usize = 192;
    const SK_BUFF_IFINDEX: usize = 40;

    /// The program's return value.
    pub fn run(prog: BorrowedFd<'_>, ifindex: u32, frame: &[u8]) -> std::io::Result<u32> {
        let mut ctx = [0u8; SK_BUFF_SIZE];
        ctx[SK_BUFF_IFINDEX..SK_BUFF_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
        let mut opts = libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
            data_in: frame.as_ptr().cast(),
            data_size_in: frame.len() as u32,
            ctx_in: ctx.as_ptr().cast(),
            ctx_size_in: ctx.len() as u32,
            ..Default::default()
        };
        // SAFETY: `opts` is a valid, fully initialised bpf_test_run_opts whose input pointers
        // point at `frame` and `ctx` with their lengths, both alive for the call; no output
        // buffers are given, so the kernel writes only into `opts`.
        let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(-rc));
        }
        Ok(opts.retval)
    }
}

/// A frame of `protocol` from `src` to `dst` (a TCP SYN, a UDP or SCTP packet, an ICMP or
/// ICMPv6 echo request, or four bytes of another protocol), to destination port `dport`.
fn frame(src: IpAddr, dst: IpAddr, protocol: Protocol, dport: u16) -> Vec<u8> {
    let sport: u16 = 40000;
    let l4: Vec<u8> = match protocol {
        Protocol::Tcp => {
            let mut h = vec![0u8; 20];
            h[0..2].copy_from_slice(&sport.to_be_bytes());
            h[2..4].copy_from_slice(&dport.to_be_bytes());
            h[12] = 5 << 4;
            h[13] = 0x02; // SYN
            h[14..16].copy_from_slice(&64240u16.to_be_bytes());
            h
        }
        Protocol::Udp => {
            let mut h = vec![0u8; 12];
            h[0..2].copy_from_slice(&sport.to_be_bytes());
            h[2..4].copy_from_slice(&dport.to_be_bytes());
            h[4..6].copy_from_slice(&12u16.to_be_bytes());
            h
        }
        Protocol::Sctp => {
            let mut h = vec![0u8; 12];
            h[0..2].copy_from_slice(&sport.to_be_bytes());
            h[2..4].copy_from_slice(&dport.to_be_bytes());
            h
        }
        Protocol::Icmp | ICMPV6 => {
            let echo = if protocol == ICMPV6 { 128 } else { 8 };
            let mut h = vec![echo, 0, 0, 0, 0, 0, 0, 1];
            h[4..6].copy_from_slice(&sport.to_be_bytes());
            h
        }
        Protocol::Other(_) => vec![0u8; 4],
    };
    let mut out = vec![0x02, 0xce, 0, 0, 1, 0x01, 0x02, 0xce, 0, 0, 1, 0x02];
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let total = 20 + l4.len();
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            ip[8] = 64;
            ip[9] = protocol.number();
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let checksum = cellium_integration::frame::internet_checksum(&ip);
            ip[10..12].copy_from_slice(&checksum.to_be_bytes());
            out.extend([0x08, 0x00]);
            out.extend(ip);
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            out.extend([0x86, 0xdd, 0x60, 0, 0, 0]);
            out.extend((l4.len() as u16).to_be_bytes());
            out.extend([protocol.number(), 64]);
            out.extend(src.octets());
            out.extend(dst.octets());
        }
        _ => panic!("{src} and {dst} are of two families"),
    }
    out.extend(l4);
    out
}

/// A small deterministic generator (xorshift), so a failure is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// A port range near one of a few places where ranges meet and blocks split.
fn range(rng: &mut Rng) -> RangeInclusive<u16> {
    let anchor = rng.pick(&[0u16, 80, 1000, 8080, 32768, 65500]);
    let start = anchor.saturating_add(rng.below(40) as u16);
    let len = rng.pick(&[0u16, 1, 3, 10, 100, 2000]);
    start..=start.saturating_add(len)
}

/// Hand-written rules with the overlaps that matter, and random ones on top.
fn rules(rng: &mut Rng) -> Vec<PolicyRule> {
    let r =
        |identity, direction, protocol, ports: Option<RangeInclusive<u16>>, verdict| PolicyRule {
            identity,
            direction,
            protocol,
            ports,
            verdict,
        };
    let mut out = Vec::new();
    for d in Direction::ALL {
        out.extend([
            r(300, d, Some(Protocol::Tcp), Some(80..=90), Verdict::Allow),
            r(300, d, Some(Protocol::Tcp), Some(85..=85), Verdict::Deny),
            r(301, d, None, None, Verdict::Allow),
            r(301, d, Some(Protocol::Udp), Some(53..=53), Verdict::Deny),
            r(302, d, None, None, Verdict::Deny),
            r(302, d, Some(Protocol::Tcp), Some(1..=2), Verdict::Allow),
            r(0, d, Some(Protocol::Tcp), Some(8080..=8080), Verdict::Allow),
            r(
                303,
                d,
                Some(Protocol::Tcp),
                Some(8000..=8100),
                Verdict::Deny,
            ),
            r(1, d, Some(Protocol::Icmp), None, Verdict::Allow),
            r(301, d, Some(ICMPV6), None, Verdict::Deny),
            r(
                300,
                d,
                Some(Protocol::Tcp),
                Some(86..=88),
                Verdict::AuditDeny,
            ),
            r(303, d, Some(Protocol::Tcp), None, Verdict::AuditDeny),
            r(303, d, Some(Protocol::Tcp), Some(443..=443), Verdict::Allow),
        ]);
    }
    let identities = [0, 1, 2, 300, 301, 302, 303, 16_777_216];
    for _ in 0..40 {
        let protocol = rng.pick(&[
            None,
            Some(Protocol::Tcp),
            Some(Protocol::Udp),
            Some(Protocol::Sctp),
            Some(Protocol::Icmp),
            Some(ICMPV6),
            Some(Protocol::Other(47)),
        ]);
        let ports = protocol
            .is_none_or(Protocol::has_ports)
            .then(|| (rng.below(4) != 0).then(|| range(rng)))
            .flatten();
        out.push(r(
            rng.pick(&identities),
            rng.pick(&Direction::ALL),
            protocol,
            ports,
            match rng.below(8) {
                0 | 1 => Verdict::Deny,
                2 => Verdict::AuditDeny,
                _ => Verdict::Allow,
            },
        ));
    }
    out
}

/// Every range edge of the rules, one past each, and a few more.
fn sample_ports(rules: &[PolicyRule], rng: &mut Rng) -> Vec<u16> {
    let mut ports = vec![0, 1, 53, 80, 443, 8080, 32767, 32768, 65535];
    for r in rules.iter().filter_map(|r| r.ports.as_ref()) {
        let (a, b) = (*r.start(), *r.end());
        ports.extend([a.saturating_sub(1), a, b, b.saturating_add(1)]);
    }
    ports.extend((0..16).map(|_| rng.below(65536) as u16));
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The place the probes run: a pod's endpoint on a loaded datapath.
struct Bench {
    // Field order is drop order: the namespaces first, then the pins.
    topo: Topology,
    dp: Arc<Datapath>,
    _bpf: BpffsMount,
    from_container: OwnedFd,
    to_container: OwnedFd,
    /// Probes so far: each gets a peer address of its own.
    probes: u32,
}

impl Bench {
    fn new() -> Bench {
        let topo = Topology::new(1).expect("topology");
        let bpf = BpffsMount::new().expect("bpffs");
        let dp = Arc::new(
            Datapath::open(DatapathOptions {
                bpf_root: bpf.path().to_owned(),
                ..Default::default()
            })
            .expect("open datapath"),
        );
        for (identity, net) in PEERS {
            if let Some(b) = net {
                for prefix in [format!("10.{b}.0.0/16"), format!("fd00:{b:x}::/32")] {
                    let prefix: IpNet = prefix.parse().expect("prefix");
                    dp.ipcache().put(prefix, identity).expect("ipcache");
                }
            }
        }
        let (from, to) = dp.program_ids().expect("program ids");
        let fd = |id| libbpf_rs::Program::fd_from_id(id).expect("program fd");
        Bench {
            from_container: fd(from),
            to_container: fd(to),
            topo,
            dp,
            _bpf: bpf,
            probes: 0,
        }
    }

    fn set_endpoint(&self, flags: EndpointFlags) {
        let pod = self.topo.pod(1);
        let info = pod.endpoint(ENDPOINT, POD_IDENTITY, flags);
        for ip in [IpAddr::from(pod.ip), POD_V6.into()] {
            self.dp.endpoints().put(ip, &info).expect("endpoint");
        }
    }

    /// A fresh address of the peer's /16 or /32 (10.99.0.0/16 and fd00:63::/32 for the
    /// world).
    fn peer_address(&mut self, net: Option<u8>, v6: bool) -> IpAddr {
        self.probes += 1;
        let [_, _, hi, lo] = self.probes.to_be_bytes();
        let b = net.unwrap_or(99);
        if v6 {
            Ipv6Addr::new(
                0xfd00,
                u16::from(b),
                0,
                0,
                0,
                0,
                u16::from(hi),
                u16::from(lo),
            )
            .into()
        } else {
            Ipv4Addr::new(10, b, hi, lo.max(1)).into()
        }
    }

    /// What the programs do with each new connection of `direction` (peer network,
    /// protocol, port): the reason counted for it, checked against the TC verdict.
    fn probe(
        &mut self,
        direction: Direction,
        v6: bool,
        probes: &[(Option<u8>, Protocol, u16)],
    ) -> Vec<String> {
        let pod = self.topo.pod(1);
        let pod_ip: IpAddr = if v6 { POD_V6.into() } else { pod.ip.into() };
        let ifindex = pod.host_ifindex;
        let frames: Vec<Vec<u8>> = probes
            .iter()
            .map(|&(net, protocol, port)| {
                let peer = self.peer_address(net, v6);
                match direction {
                    Direction::Egress => frame(pod_ip, peer, protocol, port),
                    Direction::Ingress => frame(peer, pod_ip, protocol, port),
                }
            })
            .collect();
        let prog = match direction {
            Direction::Egress => &self.from_container,
            Direction::Ingress => &self.to_container,
        };
        let prog = prog.as_fd().try_clone_to_owned().expect("program fd");
        let dp = self.dp.clone();
        // In the node's namespace: the run's ifindex must name the pod's host veth there.
        self.topo
            .node
            .run(move || {
                frames
                    .iter()
                    .map(|f| observe(&dp, &prog, ifindex, direction, f))
                    .collect()
            })
            .expect("node namespace")
    }
}

/// Runs the program on one frame: the reason it counted, if the TC verdict agrees with it.
fn observe(
    dp: &Datapath,
    prog: &OwnedFd,
    ifindex: u32,
    direction: Direction,
    frame: &[u8],
) -> String {
    let reasons = [
        Reason::Forwarded,
        Reason::PolicyDeny,
        Reason::PolicyDefaultDeny,
    ];
    let counts = || -> Vec<u64> {
        reasons
            .iter()
            .map(|r| dp.metrics().get(direction, *r).expect("metrics").packets)
            .collect()
    };
    let before = counts();
    let ret = prog_run::run(prog.as_fd(), ifindex, frame).expect("BPF_PROG_TEST_RUN");
    let after = counts();
    let moved: Vec<Reason> = reasons
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| a > b)
        .map(|(r, _)| *r)
        .collect();
    match moved.as_slice() {
        [Reason::Forwarded] if ret == TC_ACT_OK => Reason::Forwarded.to_string(),
        [r] if *r != Reason::Forwarded && ret == TC_ACT_SHOT => r.to_string(),
        _ => format!("return value {ret} with counters {moved:?}"),
    }
}

/// What the model says the programs count for a new connection (`audited`: the direction's
/// default deny is only audited).
fn expected(entries_decision: Decision, enforced: bool, audited: bool) -> String {
    let reason = match (enforced, entries_decision) {
        // An audited deny passes (reported as an audit verdict, counted as forwarded).
        (false, _) | (true, Decision::Allowed | Decision::Audited) => Reason::Forwarded,
        (true, Decision::Denied) => Reason::PolicyDeny,
        (true, Decision::NoMatch) if audited => Reason::Forwarded,
        (true, Decision::NoMatch) => Reason::PolicyDefaultDeny,
    };
    reason.to_string()
}

#[test]
fn the_programs_decide_as_the_policy_model_over_the_real_map() {
    let mut bench = Bench::new();
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    let rounds = [
        EndpointFlags::ENFORCE_INGRESS | EndpointFlags::ENFORCE_EGRESS,
        EndpointFlags::ENFORCE_INGRESS | EndpointFlags::ENFORCE_EGRESS,
        // Egress not enforced: nothing is looked up, whatever the entries say.
        EndpointFlags::ENFORCE_INGRESS,
        // Ingress's default deny only audited: what no entry matches passes.
        EndpointFlags::ENFORCE_INGRESS
            | EndpointFlags::ENFORCE_EGRESS
            | EndpointFlags::AUDIT_INGRESS,
    ];
    let (mut checked, mut failures) = (0usize, Vec::new());
    let mut answers: std::collections::BTreeMap<String, usize> = Default::default();
    for (round, flags) in rounds.into_iter().enumerate() {
        let rules = rules(&mut rng);
        let entries = cellium_policy::compile(ENDPOINT, &rules).expect("compile");
        // Written through the map wrapper, as the endpoint manager writes them (each round
        // replaces the previous round's entries).
        bench
            .dp
            .policy()
            .sync_endpoint(ENDPOINT, &entries)
            .expect("sync policy");
        let mut in_map = bench
            .dp
            .policy()
            .endpoint_entries(ENDPOINT)
            .expect("read policy");
        in_map.sort_unstable();
        assert_eq!(in_map, entries, "round {round}: the map holds the entries");
        bench.set_endpoint(flags);
        let ports = sample_ports(&rules, &mut rng);
        for (direction, v6) in Direction::ALL
            .into_iter()
            .flat_map(|d| [(d, false), (d, true)])
        {
            let enforced = flags.contains(EndpointFlags::enforce(direction));
            let audited =
                direction == Direction::Ingress && flags.contains(EndpointFlags::AUDIT_INGRESS);
            let mut probes = Vec::new();
            for (identity, net) in PEERS {
                for protocol in protocols(v6) {
                    let sample: &[u16] = if protocol.has_ports() { &ports } else { &[0] };
                    probes.extend(sample.iter().map(|&port| (identity, net, protocol, port)));
                }
            }
            let runs: Vec<_> = probes.iter().map(|&(_, n, p, port)| (n, p, port)).collect();
            let observed = bench.probe(direction, v6, &runs);
            let family = if v6 { "IPv6" } else { "IPv4" };
            for (&(identity, _, protocol, port), got) in probes.iter().zip(observed) {
                let want = expected(
                    decide(&entries, direction, identity, protocol, port),
                    enforced,
                    audited,
                );
                checked += 1;
                *answers.entry(format!("{family} {want}")).or_default() += 1;
                if got != want {
                    failures.push(format!(
                        "round {round} {family} {direction} identity {identity} {protocol}/{port}: model {want}, datapath {got}"
                    ));
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {checked} connections decided otherwise than the model:\n{}\nrules: {rules:#?}",
            failures.len(),
            failures
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // Every kind of answer was exercised in each family, each many times.
    assert!(
        answers.len() == 6 && answers.values().all(|n| *n > 500),
        "{checked} connections checked: {answers:?}"
    );
    eprintln!("{checked} connections decided as the model: {answers:?}");
}

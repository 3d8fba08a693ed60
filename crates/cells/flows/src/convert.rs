//! Flows as Hubble's messages, and the numbers both sides share.

use std::time::SystemTime;

use cellium_api::v1;
use cellium_datapath_bpf::{Direction, EventKind, Protocol, Reason};

use crate::flow::{Flow, FlowVerdict, Peer};

/// Cilium's monitor message types, as `event_type.type`.
pub mod event_type {
    /// A drop.
    pub const DROP: i32 = 1;
    /// A trace (a new connection forwarded).
    pub const TRACE: i32 = 4;
    /// A policy verdict.
    pub const POLICY_VERDICT: i32 = 5;
}

/// Hubble's drop reason for ours.
pub fn drop_reason(reason: Reason) -> v1::DropReason {
    use v1::DropReason as D;
    match reason {
        Reason::InvalidSource => D::InvalidSourceIp,
        Reason::PolicyDeny => D::PolicyDeny,
        Reason::PolicyDefaultDeny | Reason::NoPolicyMap => D::PolicyDenied,
        Reason::NoServiceBackend => D::ServiceBackendNotFound,
        Reason::Malformed => D::InvalidPacketDropped,
        Reason::CtFull => D::CtMapInsertionFailed,
        Reason::NatFailed => D::ErrorWritingToPacket,
        Reason::FragmentNotFound => D::FirstLogicalDatagramFragmentNotFound,
        Reason::FragmentTableFull => D::IpFragmentationNotSupported,
        Reason::ExtensionHeader => D::InvalidIpv6ExtensionHeader,
        Reason::EncapFailed => D::ErrorRetrievingTunnelKey,
        Reason::UnknownSender => D::UnknownSender,
        Reason::InvalidIdentity => D::InvalidIdentity,
        Reason::NotInSrcRange => D::DeniedByLbSrcRangeCheck,
        Reason::Forwarded | Reason::Unknown(_) => D::Unknown,
    }
}

/// The flow's verdict as Hubble's enum.
pub fn verdict(flow: &Flow) -> v1::Verdict {
    match flow.verdict() {
        FlowVerdict::Forwarded => v1::Verdict::Forwarded,
        FlowVerdict::Dropped => v1::Verdict::Dropped,
        FlowVerdict::Audit => v1::Verdict::Audit,
    }
}

/// Cilium's monitor type of the flow's event.
pub fn type_of(flow: &Flow) -> i32 {
    match flow.event.kind {
        EventKind::Drop => event_type::DROP,
        EventKind::Trace => event_type::TRACE,
        EventKind::PolicyVerdict => event_type::POLICY_VERDICT,
        EventKind::Unknown(_) => 0,
    }
}

/// The event's sub-type: the drop reason's number, or the trace observation point in
/// Cilium's monitor numbering (0 to an endpoint, 5 from one).
pub fn sub_type_of(flow: &Flow) -> i32 {
    match flow.event.kind {
        EventKind::Drop => drop_reason(flow.event.reason) as i32,
        EventKind::Trace => match flow.event.direction {
            Direction::Egress => 5,
            Direction::Ingress => 0,
        },
        _ => 0,
    }
}

/// The observation point of a trace.
pub fn observation_point(flow: &Flow) -> v1::TraceObservationPoint {
    match (flow.event.kind, flow.event.direction) {
        (EventKind::Trace, Direction::Egress) => v1::TraceObservationPoint::FromEndpoint,
        (EventKind::Trace, Direction::Ingress) => v1::TraceObservationPoint::ToEndpoint,
        _ => v1::TraceObservationPoint::UnknownPoint,
    }
}

/// Hubble's direction of the flow (relative to the endpoint that decided).
pub fn direction(flow: &Flow) -> v1::TrafficDirection {
    match flow.event.direction {
        Direction::Ingress => v1::TrafficDirection::Ingress,
        Direction::Egress => v1::TrafficDirection::Egress,
    }
}

/// The protocol's name as filters and the CLI write it.
pub fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Icmp => "icmp",
        Protocol::Sctp => "sctp",
        Protocol::Other(58) => "icmpv6",
        Protocol::Other(_) => "other",
    }
}

/// The TCP flags as Hubble's message.
pub fn tcp_flags(bits: u8) -> v1::TcpFlags {
    v1::TcpFlags {
        fin: bits & 0x01 != 0,
        syn: bits & 0x02 != 0,
        rst: bits & 0x04 != 0,
        psh: bits & 0x08 != 0,
        ack: bits & 0x10 != 0,
        urg: bits & 0x20 != 0,
        ece: bits & 0x40 != 0,
        cwr: bits & 0x80 != 0,
        ns: false,
    }
}

/// The flags of Hubble's message as bits.
pub fn tcp_flag_bits(f: &v1::TcpFlags) -> u8 {
    [f.fin, f.syn, f.rst, f.psh, f.ack, f.urg, f.ece, f.cwr]
        .iter()
        .enumerate()
        .fold(0, |bits, (i, on)| if *on { bits | (1 << i) } else { bits })
}

/// A time as the wire's Timestamp.
pub fn timestamp(t: SystemTime) -> v1::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    v1::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// The wire's Timestamp as a time (negative: the epoch).
pub fn system_time(t: &v1::Timestamp) -> SystemTime {
    let secs = u64::try_from(t.seconds).unwrap_or(0);
    let nanos = u32::try_from(t.nanos).unwrap_or(0);
    SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos)
}

fn endpoint(peer: &Peer) -> v1::FlowEndpoint {
    let (id, namespace, pod_name) = match &peer.endpoint {
        Some(e) => (u32::from(e.id), e.namespace.clone(), e.pod_name.clone()),
        None => (0, String::new(), String::new()),
    };
    v1::FlowEndpoint {
        id,
        identity: peer.identity,
        namespace,
        labels: peer.labels.to_strings(),
        pod_name,
    }
}

/// The flow as Hubble's message, seen on `node`.
pub fn to_proto(flow: &Flow, node: &str) -> v1::Flow {
    let e = &flow.event;
    let ports = (u32::from(e.sport), u32::from(e.dport));
    let l4 = match e.protocol {
        Protocol::Tcp => Some(v1::layer4::Protocol::Tcp(v1::Tcp {
            source_port: ports.0,
            destination_port: ports.1,
            flags: Some(tcp_flags(e.tcp_flags)),
        })),
        Protocol::Udp => Some(v1::layer4::Protocol::Udp(v1::Udp {
            source_port: ports.0,
            destination_port: ports.1,
        })),
        Protocol::Sctp => Some(v1::layer4::Protocol::Sctp(v1::Sctp {
            source_port: ports.0,
            destination_port: ports.1,
        })),
        Protocol::Icmp => Some(v1::layer4::Protocol::IcmPv4(v1::IcmPv4 {
            r#type: e.icmp.0.into(),
            code: e.icmp.1.into(),
        })),
        Protocol::Other(58) => Some(v1::layer4::Protocol::IcmPv6(v1::IcmPv6 {
            r#type: e.icmp.0.into(),
            code: e.icmp.1.into(),
        })),
        Protocol::Other(_) => None,
    };
    let dropped = flow.verdict() == FlowVerdict::Dropped;
    let reason = if dropped {
        drop_reason(e.reason)
    } else {
        v1::DropReason::Unknown
    };
    let service = flow.service.as_ref().map(|s| v1::FlowService {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
    });
    let (policy_match, ingress_match) = match e.kind {
        EventKind::Trace | EventKind::PolicyVerdict => {
            (e.egress_match as u32, e.ingress_match as u32)
        }
        _ => (0, 0),
    };
    v1::Flow {
        time: Some(timestamp(flow.time)),
        verdict: verdict(flow) as i32,
        drop_reason: reason as u32,
        ip: Some(v1::Ip {
            source: e.saddr.to_string(),
            destination: e.daddr.to_string(),
            ip_version: if e.saddr.is_ipv4() {
                v1::IpVersion::IPv4
            } else {
                v1::IpVersion::IPv6
            } as i32,
        }),
        l4: Some(v1::Layer4 { protocol: l4 }),
        source: Some(endpoint(&flow.source)),
        destination: Some(endpoint(&flow.destination)),
        r#type: v1::FlowType::L3L4 as i32,
        node_name: node.to_string(),
        event_type: Some(v1::CiliumEventType {
            r#type: type_of(flow),
            sub_type: sub_type_of(flow),
        }),
        source_service: None,
        destination_service: service,
        traffic_direction: direction(flow) as i32,
        policy_match_type: policy_match,
        trace_observation_point: observation_point(flow) as i32,
        drop_reason_desc: reason as i32,
        is_reply: flow.is_reply().map(|value| v1::BoolValue { value }),
        interface: Some(v1::NetworkInterface {
            index: e.ifindex,
            name: String::new(),
        }),
        // An audit says which drop it let through.
        drop_reason_text: if dropped || flow.verdict() == FlowVerdict::Audit {
            e.reason.to_string()
        } else {
            String::new()
        },
        endpoint_id: u32::from(e.endpoint_id),
        ingress_policy_match_type: ingress_match,
        egress_allowed_by: policies(flow, Direction::Egress, false),
        ingress_allowed_by: policies(flow, Direction::Ingress, false),
        egress_denied_by: policies(flow, Direction::Egress, true),
        ingress_denied_by: policies(flow, Direction::Ingress, true),
        policy_log: policy_log(flow),
    }
}

/// The flow's deciding policies, in the field of `direction` and allowed or denied (an audit
/// names what would have denied).
fn policies(flow: &Flow, direction: Direction, denied: bool) -> Vec<v1::FlowPolicy> {
    let here =
        flow.event.direction == direction && (flow.verdict() != FlowVerdict::Forwarded) == denied;
    if !here {
        return Vec::new();
    }
    // An object is named once, though several of its specs (each with its log) decided.
    let mut out: Vec<v1::FlowPolicy> = Vec::new();
    for p in flow.policies.iter() {
        let same = |q: &v1::FlowPolicy| {
            (&q.kind, &q.namespace, &q.name) == (&p.kind, &p.namespace, &p.name)
        };
        if !out.iter().any(same) {
            out.push(v1::FlowPolicy {
                name: p.name.clone(),
                namespace: p.namespace.clone(),
                kind: p.kind.clone(),
                ..v1::FlowPolicy::default()
            });
        }
    }
    out
}

/// The `log` values of the rules that decided, each once.
fn policy_log(flow: &Flow) -> Vec<String> {
    let mut logs: Vec<String> = Vec::new();
    for log in flow.policies.iter().filter_map(|p| p.log.as_ref()) {
        if !logs.contains(log) {
            logs.push(log.clone());
        }
    }
    logs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::Enricher;
    use crate::enrich::tests::{FakeSources, event};
    use std::sync::Arc;

    #[test]
    fn a_policy_drop_reads_as_hubble_s() {
        let s = Arc::new(FakeSources::default());
        s.pod(1, "10.0.0.1", "shop", "client", 300, &["k8s:app=client"]);
        s.pod(2, "10.0.0.2", "shop", "web", 301, &["k8s:app=web"]);
        let mut e = Enricher::new(s);
        let f = to_proto(&e.flow(event("10.0.0.1", "10.0.0.2")), "node-1");
        assert_eq!(f.verdict(), v1::Verdict::Dropped);
        assert_eq!(f.drop_reason_desc(), v1::DropReason::PolicyDeny);
        assert_eq!(f.drop_reason, 181);
        assert_eq!(f.drop_reason_text, "policy denied");
        assert_eq!(f.traffic_direction(), v1::TrafficDirection::Ingress);
        let src = f.source.unwrap();
        assert_eq!(
            (src.namespace.as_str(), src.pod_name.as_str()),
            ("shop", "client")
        );
        assert_eq!((src.id, src.identity), (1, 300));
        let Some(v1::layer4::Protocol::Tcp(tcp)) = f.l4.unwrap().protocol else {
            panic!("not TCP")
        };
        assert_eq!(tcp.destination_port, 80);
        assert!(tcp.flags.unwrap().syn);
        assert_eq!(f.event_type.unwrap().r#type, event_type::DROP);
        assert!(f.is_reply.is_none());
        assert_eq!(f.node_name, "node-1");
    }

    #[test]
    fn the_deciding_policies_go_in_the_field_of_their_direction_and_verdict() {
        let mut e = Enricher::new(Arc::new(FakeSources::default()));
        let f = to_proto(&e.flow(event("10.0.0.1", "10.0.0.2")), "n");
        assert_eq!(f.ingress_denied_by[0].name, "denied");
        assert_eq!(f.ingress_denied_by[0].kind, "CiliumNetworkPolicy");
        assert!(f.ingress_allowed_by.is_empty() && f.egress_denied_by.is_empty());
        assert_eq!(f.policy_log, ["seen"]);
    }

    #[test]
    fn tcp_flags_round_trip() {
        for bits in [0u8, 0x02, 0x12, 0x11, 0xff] {
            assert_eq!(tcp_flag_bits(&tcp_flags(bits)), bits);
        }
    }
}

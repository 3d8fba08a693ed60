//! How `cellium observe` prints a flow: `compact` (one line, Hubble's), `dict`, `table`,
//! `json` (one object per line, Hubble's field names).

use std::time::{Duration, UNIX_EPOCH};

use cellium_api::v1::{self, Flow, FlowEndpoint};
use serde_json::{Value, json};

/// The `-o` flag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per flow: who -> whom, what, verdict, why.
    #[default]
    Compact,
    /// One JSON object per line, with Hubble's field names.
    Json,
    /// Aligned columns (printed once every flow is in; not with --follow).
    Table,
    /// One block of `KEY: value` lines per flow.
    Dict,
}

/// `Nov 24 05:16:05.123` (UTC), as Hubble's compact output writes times.
pub fn time(t: Option<&v1::Timestamp>) -> String {
    let Some(t) = t else {
        return "N/A".into();
    };
    let secs = t.seconds.max(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {:>2} {:02}:{:02}:{:02}.{:03}",
        MONTHS[(month - 1) as usize],
        day,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        t.nanos.max(0) / 1_000_000
    )
}

fn ports(f: &Flow) -> (Option<u32>, Option<u32>) {
    match f.l4.as_ref().and_then(|l| l.protocol.as_ref()) {
        Some(v1::layer4::Protocol::Tcp(t)) => (Some(t.source_port), Some(t.destination_port)),
        Some(v1::layer4::Protocol::Udp(u)) => (Some(u.source_port), Some(u.destination_port)),
        Some(v1::layer4::Protocol::Sctp(s)) => (Some(s.source_port), Some(s.destination_port)),
        _ => (None, None),
    }
}

/// A reserved identity's name, from its `reserved:` label.
fn reserved(ep: &FlowEndpoint) -> Option<&str> {
    ep.labels.iter().find_map(|l| l.strip_prefix("reserved:"))
}

/// `shop/web-1:80 (ID:301)`, `8.8.8.8:53 (world)`.
fn side(ep: Option<&FlowEndpoint>, ip: &str, port: Option<u32>) -> String {
    let who = match ep {
        Some(e) if !e.pod_name.is_empty() => format!("{}/{}", e.namespace, e.pod_name),
        _ if ip.contains(':') && port.is_some() => format!("[{ip}]"),
        _ => ip.to_string(),
    };
    let port = port.map(|p| format!(":{p}")).unwrap_or_default();
    let id = match ep {
        Some(e) => match reserved(e) {
            Some(name) => format!(" ({name})"),
            None if e.identity != 0 => format!(" (ID:{})", e.identity),
            None => String::new(),
        },
        None => String::new(),
    };
    format!("{who}{port}{id}")
}

fn match_name(m: u32) -> &'static str {
    match m {
        1 => "L3-Only",
        2 => "L3-L4",
        3 => "L4-Only",
        4 => "all",
        _ => "none",
    }
}

/// `policy-verdict:L3-L4 EGRESS ALLOWED`, `policy-verdict:none INGRESS AUDIT (policy
/// denied)`, `to-endpoint FORWARDED`, `Policy denied DROPPED`.
fn what(f: &Flow) -> String {
    let et = f.event_type.as_ref().map(|e| e.r#type).unwrap_or(0);
    let direction = match f.traffic_direction() {
        v1::TrafficDirection::Ingress => "INGRESS",
        v1::TrafficDirection::Egress => "EGRESS",
        v1::TrafficDirection::Unknown => "",
    };
    match et {
        1 => format!("{} DROPPED", capitalised(&f.drop_reason_text)),
        5 => format!(
            "policy-verdict:{} {direction} {}",
            match_name(f.policy_match_type),
            match f.verdict() {
                v1::Verdict::Dropped => "DENIED".to_string(),
                // What the audit let through.
                v1::Verdict::Audit => format!("AUDIT ({})", f.drop_reason_text),
                _ => "ALLOWED".to_string(),
            }
        ),
        4 => {
            let point = match f.trace_observation_point() {
                v1::TraceObservationPoint::ToEndpoint => "to-endpoint",
                v1::TraceObservationPoint::FromEndpoint => "from-endpoint",
                _ => "trace",
            };
            let mut s = format!("{point} FORWARDED");
            let (e, i) = (f.policy_match_type, f.ingress_policy_match_type);
            let mut matches = Vec::new();
            if e != 0 {
                matches.push(format!("egress {}", match_name(e)));
            }
            if i != 0 {
                matches.push(format!("ingress {}", match_name(i)));
            }
            if !matches.is_empty() {
                s.push_str(&format!(" [match {}]", matches.join(", ")));
            }
            s
        }
        _ => format!("{:?}", f.verdict()).to_uppercase(),
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => "Dropped".into(),
    }
}

fn flags(f: &v1::TcpFlags) -> String {
    let names = [
        (f.syn, "SYN"),
        (f.ack, "ACK"),
        (f.fin, "FIN"),
        (f.rst, "RST"),
        (f.psh, "PSH"),
        (f.urg, "URG"),
        (f.ece, "ECE"),
        (f.cwr, "CWR"),
    ];
    names
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `TCP Flags: SYN`, `UDP`, `ICMPv4 EchoRequest`, as Hubble prints them.
fn summary(f: &Flow) -> String {
    match f.l4.as_ref().and_then(|l| l.protocol.as_ref()) {
        Some(v1::layer4::Protocol::Tcp(t)) => {
            format!(
                "TCP Flags: {}",
                t.flags.as_ref().map(flags).unwrap_or_default()
            )
        }
        Some(v1::layer4::Protocol::Udp(_)) => "UDP".into(),
        Some(v1::layer4::Protocol::Sctp(_)) => "SCTP".into(),
        Some(v1::layer4::Protocol::IcmPv4(i)) => format!("ICMPv4 {}", icmpv4_name(i.r#type)),
        Some(v1::layer4::Protocol::IcmPv6(i)) => format!("ICMPv6 {}", icmpv6_name(i.r#type)),
        None => String::new(),
    }
}

/// Hubble's names of the ICMPv4 types it names, else the number.
fn icmpv4_name(t: u32) -> String {
    match t {
        0 => "EchoReply".into(),
        3 => "DestinationUnreachable".into(),
        5 => "Redirect".into(),
        8 => "EchoRequest".into(),
        11 => "TimeExceeded".into(),
        12 => "ParameterProblem".into(),
        n => format!("type {n}"),
    }
}

/// Hubble's names of the ICMPv6 types it names, else the number.
fn icmpv6_name(t: u32) -> String {
    match t {
        1 => "DestinationUnreachable".into(),
        2 => "PacketTooBig".into(),
        3 => "TimeExceeded".into(),
        4 => "ParameterProblem".into(),
        128 => "EchoRequest".into(),
        129 => "EchoReply".into(),
        133 => "RouterSolicitation".into(),
        134 => "RouterAdvertisement".into(),
        135 => "NeighborSolicitation".into(),
        136 => "NeighborAdvertisement".into(),
        n => format!("type {n}"),
    }
}

fn service(f: &Flow) -> Option<String> {
    f.destination_service
        .as_ref()
        .map(|s| format!("{}/{}", s.namespace, s.name))
}

fn sides(f: &Flow) -> (String, String) {
    let (sport, dport) = ports(f);
    let ip = f.ip.clone().unwrap_or_default();
    (
        side(f.source.as_ref(), &ip.source, sport),
        side(f.destination.as_ref(), &ip.destination, dport),
    )
}

/// The policy objects that decided (`CiliumNetworkPolicy shop/db, NetworkPolicy shop/web`):
/// whichever of Hubble's four fields the flow fills.
fn deciders(f: &Flow) -> Option<String> {
    let all: Vec<String> = [
        &f.egress_allowed_by,
        &f.ingress_allowed_by,
        &f.egress_denied_by,
        &f.ingress_denied_by,
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        if p.namespace.is_empty() {
            format!("{} {}", p.kind, p.name)
        } else {
            format!("{} {}/{}", p.kind, p.namespace, p.name)
        }
    })
    .collect();
    (!all.is_empty()).then(|| all.join(", "))
}

/// One line: `Nov 24 05:16:05.123: shop/client:40000 (ID:300) -> shop/web-1:80 (ID:301)
/// [svc shop/web] Policy denied DROPPED by CiliumNetworkPolicy shop/db (TCP Flags: SYN)`.
pub fn compact(f: &Flow) -> String {
    let (src, dst) = sides(f);
    let arrow = if f.is_reply.as_ref().is_some_and(|r| r.value) {
        "<-"
    } else {
        "->"
    };
    let svc = service(f)
        .map(|s| format!(" [svc {s}]"))
        .unwrap_or_default();
    let summary = summary(f);
    let summary = if summary.is_empty() {
        String::new()
    } else {
        format!(" ({summary})")
    };
    let by = deciders(f).map(|d| format!(" by {d}")).unwrap_or_default();
    format!(
        "{}: {src} {arrow} {dst}{svc} {}{by}{summary}",
        time(f.time.as_ref()),
        what(f)
    )
}

/// The table's header and a row.
pub const TABLE_HEADER: [&str; 6] = [
    "TIMESTAMP",
    "SOURCE",
    "DESTINATION",
    "TYPE",
    "VERDICT",
    "SUMMARY",
];

/// A row of the table.
pub fn row(f: &Flow) -> Vec<String> {
    let (src, dst) = sides(f);
    let dst = match service(f) {
        Some(s) => format!("{dst} [svc {s}]"),
        None => dst,
    };
    let w = what(f);
    let (kind, verdict) = match w.rsplit_once(' ') {
        Some((k, v)) if !w.contains('[') => (k.to_string(), v.to_string()),
        _ => (w.clone(), format!("{:?}", f.verdict()).to_uppercase()),
    };
    vec![time(f.time.as_ref()), src, dst, kind, verdict, summary(f)]
}

/// `KEY: value` lines.
pub fn dict(f: &Flow) -> String {
    let (src, dst) = sides(f);
    let mut lines = vec![
        format!("  TIMESTAMP: {}", time(f.time.as_ref())),
        format!("     SOURCE: {src}"),
        format!("DESTINATION: {dst}"),
        format!("       TYPE: {}", what(f)),
        format!("    SUMMARY: {}", summary(f)),
        format!("       NODE: {}", f.node_name),
    ];
    if let Some(s) = service(f) {
        lines.push(format!("    SERVICE: {s}"));
    }
    if let Some(d) = deciders(f) {
        lines.push(format!("   POLICIES: {d}"));
    }
    if !f.policy_log.is_empty() {
        lines.push(format!("        LOG: {}", f.policy_log.join(", ")));
    }
    lines.join("\n")
}

fn endpoint_json(e: &FlowEndpoint) -> Value {
    json!({
        "ID": e.id,
        "identity": e.identity,
        "namespace": e.namespace,
        "labels": e.labels,
        "pod_name": e.pod_name,
    })
}

fn rfc3339(t: Option<&v1::Timestamp>) -> Value {
    t.map(|t| {
        let at = UNIX_EPOCH
            + Duration::new(u64::try_from(t.seconds).unwrap_or(0), t.nanos.max(0) as u32);
        Value::String(humantime::format_rfc3339_nanos(at).to_string())
    })
    .unwrap_or(Value::Null)
}

/// Hubble's JSON of a `GetFlowsResponse` holding `f` (proto field names, enums by name).
pub fn json(f: &Flow) -> Value {
    let l4 = match f.l4.as_ref().and_then(|l| l.protocol.as_ref()) {
        Some(v1::layer4::Protocol::Tcp(t)) => {
            let fl = t.flags.unwrap_or_default();
            let mut flags = serde_json::Map::new();
            for (on, name) in [
                (fl.fin, "FIN"),
                (fl.syn, "SYN"),
                (fl.rst, "RST"),
                (fl.psh, "PSH"),
                (fl.ack, "ACK"),
                (fl.urg, "URG"),
                (fl.ece, "ECE"),
                (fl.cwr, "CWR"),
            ] {
                if on {
                    flags.insert(name.into(), Value::Bool(true));
                }
            }
            json!({"TCP": {"source_port": t.source_port, "destination_port": t.destination_port, "flags": flags}})
        }
        Some(v1::layer4::Protocol::Udp(u)) => {
            json!({"UDP": {"source_port": u.source_port, "destination_port": u.destination_port}})
        }
        Some(v1::layer4::Protocol::Sctp(s)) => {
            json!({"SCTP": {"source_port": s.source_port, "destination_port": s.destination_port}})
        }
        Some(v1::layer4::Protocol::IcmPv4(i)) => {
            json!({"ICMPv4": {"type": i.r#type, "code": i.code}})
        }
        Some(v1::layer4::Protocol::IcmPv6(i)) => {
            json!({"ICMPv6": {"type": i.r#type, "code": i.code}})
        }
        None => json!({}),
    };
    let ip = f.ip.clone().unwrap_or_default();
    let mut flow = json!({
        "time": rfc3339(f.time.as_ref()),
        "verdict": f.verdict().as_str_name().trim_start_matches("VERDICT_"),
        "IP": {"source": ip.source, "destination": ip.destination, "ipVersion": ip.ip_version().as_str_name()},
        "l4": l4,
        "source": f.source.as_ref().map(endpoint_json),
        "destination": f.destination.as_ref().map(endpoint_json),
        "Type": f.r#type().as_str_name(),
        "node_name": f.node_name,
        "event_type": f.event_type.as_ref().map(|e| json!({"type": e.r#type, "sub_type": e.sub_type})),
        "traffic_direction": f.traffic_direction().as_str_name(),
        "Summary": summary(f),
    });
    let obj = flow.as_object_mut().expect("an object");
    if f.verdict() == v1::Verdict::Dropped {
        obj.insert("drop_reason".into(), json!(f.drop_reason));
        obj.insert(
            "drop_reason_desc".into(),
            json!(f.drop_reason_desc().as_str_name()),
        );
    }
    if let Some(r) = &f.is_reply {
        obj.insert("is_reply".into(), json!(r.value));
    }
    if f.policy_match_type != 0 {
        obj.insert("policy_match_type".into(), json!(f.policy_match_type));
    }
    if f.trace_observation_point != 0 {
        obj.insert(
            "trace_observation_point".into(),
            json!(f.trace_observation_point().as_str_name()),
        );
    }
    if let Some(s) = &f.destination_service {
        obj.insert(
            "destination_service".into(),
            json!({"name": s.name, "namespace": s.namespace}),
        );
    }
    for (field, policies) in [
        ("egress_allowed_by", &f.egress_allowed_by),
        ("ingress_allowed_by", &f.ingress_allowed_by),
        ("egress_denied_by", &f.egress_denied_by),
        ("ingress_denied_by", &f.ingress_denied_by),
    ] {
        if !policies.is_empty() {
            let list: Vec<Value> = policies
                .iter()
                .map(|p| json!({"name": p.name, "namespace": p.namespace, "kind": p.kind}))
                .collect();
            obj.insert(field.into(), Value::Array(list));
        }
    }
    if !f.policy_log.is_empty() {
        obj.insert("policy_log".into(), json!(f.policy_log));
    }
    json!({"flow": flow, "node_name": f.node_name, "time": rfc3339(f.time.as_ref())})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        Flow {
            time: Some(v1::Timestamp {
                seconds: 1_795_496_165,
                nanos: 123_000_000,
            }),
            verdict: v1::Verdict::Dropped as i32,
            drop_reason: 133,
            drop_reason_desc: v1::DropReason::PolicyDenied as i32,
            drop_reason_text: "policy default deny".into(),
            ip: Some(v1::Ip {
                source: "10.0.0.1".into(),
                destination: "10.0.0.2".into(),
                ip_version: v1::IpVersion::IPv4 as i32,
            }),
            l4: Some(v1::Layer4 {
                protocol: Some(v1::layer4::Protocol::Tcp(v1::Tcp {
                    source_port: 40000,
                    destination_port: 80,
                    flags: Some(v1::TcpFlags {
                        syn: true,
                        ..Default::default()
                    }),
                })),
            }),
            source: Some(FlowEndpoint {
                id: 1,
                identity: 300,
                namespace: "shop".into(),
                labels: vec!["k8s:app=client".into()],
                pod_name: "client".into(),
            }),
            destination: Some(FlowEndpoint {
                id: 2,
                identity: 301,
                namespace: "shop".into(),
                labels: vec![],
                pod_name: "web".into(),
            }),
            event_type: Some(v1::CiliumEventType {
                r#type: 1,
                sub_type: 133,
            }),
            traffic_direction: v1::TrafficDirection::Ingress as i32,
            ..Default::default()
        }
    }

    #[test]
    fn compact_reads_who_whom_what_and_why() {
        assert_eq!(
            compact(&flow()),
            "Nov 24 04:56:05.123: shop/client:40000 (ID:300) -> shop/web:80 (ID:301) Policy default deny DROPPED (TCP Flags: SYN)"
        );
        let mut world = flow();
        world.destination = Some(FlowEndpoint {
            identity: 2,
            labels: vec!["reserved:world".into()],
            ..Default::default()
        });
        world.ip.as_mut().unwrap().destination = "8.8.8.8".into();
        assert!(
            compact(&world).contains("-> 8.8.8.8:80 (world)"),
            "{}",
            compact(&world)
        );
    }

    #[test]
    fn json_uses_hubble_s_names() {
        let j = json(&flow());
        assert_eq!(j["flow"]["verdict"], "DROPPED");
        assert_eq!(j["flow"]["drop_reason_desc"], "POLICY_DENIED");
        assert_eq!(j["flow"]["l4"]["TCP"]["flags"]["SYN"], true);
        assert_eq!(j["flow"]["source"]["pod_name"], "client");
        assert_eq!(j["flow"]["IP"]["ipVersion"], "IPv4");
        assert_eq!(j["flow"]["traffic_direction"], "INGRESS");
        assert!(j["flow"].get("ingress_denied_by").is_none());
    }

    #[test]
    fn the_deciding_policies_are_named() {
        let mut f = flow();
        f.ingress_denied_by = vec![
            v1::FlowPolicy {
                name: "db".into(),
                namespace: "shop".into(),
                kind: "CiliumNetworkPolicy".into(),
                ..Default::default()
            },
            v1::FlowPolicy {
                name: "no-telnet".into(),
                kind: "CiliumClusterwideNetworkPolicy".into(),
                ..Default::default()
            },
        ];
        assert!(
            compact(&f).ends_with(
                "DROPPED by CiliumNetworkPolicy shop/db, CiliumClusterwideNetworkPolicy no-telnet (TCP Flags: SYN)"
            ),
            "{}",
            compact(&f)
        );
        assert!(dict(&f).contains("   POLICIES: CiliumNetworkPolicy shop/db, "));
        f.policy_log = vec!["db guard".into()];
        assert!(dict(&f).contains("        LOG: db guard"));
        assert_eq!(json(&f)["flow"]["policy_log"][0], "db guard");
        let j = json(&f);
        assert_eq!(j["flow"]["ingress_denied_by"][0]["name"], "db");
        assert_eq!(
            j["flow"]["ingress_denied_by"][1]["kind"],
            "CiliumClusterwideNetworkPolicy"
        );
    }
}

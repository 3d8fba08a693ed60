//! Hubble's flow filters: every field set must match, a list when any of its values does;
//! a request's flows match any whitelist filter (or there is none) and no blacklist filter.

use std::net::IpAddr;

use cellium_api::v1;
use cellium_labels::Selector;
use ipnet::IpNet;

use crate::convert;
use crate::flow::{Flow, Peer};

/// A filter that cannot be read, with the field and the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter field {field}: {text:?}: {reason}")]
pub struct FilterError {
    /// The field (`source_ip`, `destination_port`, ...).
    pub field: &'static str,
    /// What it held.
    pub text: String,
    /// Why it cannot be read.
    pub reason: String,
}

/// `namespace/name-prefix`, `name-prefix` or `namespace/`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NameFilter {
    namespace: Option<String>,
    prefix: String,
}

impl NameFilter {
    fn parse(text: &str) -> NameFilter {
        match text.split_once('/') {
            Some((ns, name)) => NameFilter {
                namespace: Some(ns.to_string()),
                prefix: name.to_string(),
            },
            None => NameFilter {
                namespace: None,
                prefix: text.to_string(),
            },
        }
    }

    fn matches(&self, namespace: &str, name: &str) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == namespace) && name.starts_with(&self.prefix)
    }
}

/// One side's conditions.
#[derive(Debug, Default)]
struct Side {
    ips: Vec<IpNet>,
    pods: Vec<NameFilter>,
    labels: Vec<Selector>,
    ports: Vec<u16>,
    services: Vec<NameFilter>,
    identities: Vec<u32>,
}

impl Side {
    fn matches(&self, flow: &Flow, peer: &Peer, ip: IpAddr, port: u16, service: bool) -> bool {
        (self.ips.is_empty() || self.ips.iter().any(|n| n.contains(&ip)))
            && (self.pods.is_empty()
                || peer
                    .pod()
                    .is_some_and(|(ns, name)| self.pods.iter().any(|p| p.matches(ns, name))))
            && (self.labels.is_empty() || self.labels.iter().any(|s| s.matches(&peer.labels)))
            && (self.ports.is_empty() || self.ports.contains(&port))
            && (self.services.is_empty()
                || (service
                    && flow.service.as_ref().is_some_and(|s| {
                        self.services
                            .iter()
                            .any(|f| f.matches(&s.namespace, &s.name))
                    })))
            && (self.identities.is_empty() || self.identities.contains(&peer.identity))
    }
}

/// A compiled `FlowFilter`.
#[derive(Debug, Default)]
pub struct Filter {
    source: Side,
    destination: Side,
    verdicts: Vec<i32>,
    event_types: Vec<(i32, Option<i32>)>,
    protocols: Vec<String>,
    reply: Vec<bool>,
    tcp_flags: Vec<u8>,
    ip_versions: Vec<i32>,
    directions: Vec<i32>,
    drop_reasons: Vec<i32>,
}

fn bad(field: &'static str, text: &str, reason: impl ToString) -> FilterError {
    FilterError {
        field,
        text: text.to_string(),
        reason: reason.to_string(),
    }
}

fn ips(field: &'static str, texts: &[String]) -> Result<Vec<IpNet>, FilterError> {
    texts
        .iter()
        .map(|t| {
            let t = t.trim();
            t.parse::<IpNet>()
                .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| bad(field, t, "not an address or CIDR"))
        })
        .collect()
}

fn ports(field: &'static str, texts: &[String]) -> Result<Vec<u16>, FilterError> {
    texts
        .iter()
        .map(|t| {
            t.trim()
                .parse::<u16>()
                .map_err(|_| bad(field, t, "not a port (0-65535)"))
        })
        .collect()
}

fn selectors(field: &'static str, texts: &[String]) -> Result<Vec<Selector>, FilterError> {
    texts
        .iter()
        .map(|t| t.parse::<Selector>().map_err(|e| bad(field, t, e)))
        .collect()
}

/// A drop reason by Hubble's name (`POLICY_DENIED`) or number.
fn drop_reason(text: &str) -> Option<i32> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        return Some(n);
    }
    v1::DropReason::from_str_name(&t.to_ascii_uppercase()).map(|r| r as i32)
}

impl Filter {
    /// Compiles `f`, refusing what cannot be read.
    pub fn new(f: &v1::FlowFilter) -> Result<Filter, FilterError> {
        Ok(Filter {
            source: Side {
                ips: ips("source_ip", &f.source_ip)?,
                pods: f.source_pod.iter().map(|t| NameFilter::parse(t)).collect(),
                labels: selectors("source_label", &f.source_label)?,
                ports: ports("source_port", &f.source_port)?,
                services: f
                    .source_service
                    .iter()
                    .map(|t| NameFilter::parse(t))
                    .collect(),
                identities: f.source_identity.clone(),
            },
            destination: Side {
                ips: ips("destination_ip", &f.destination_ip)?,
                pods: f
                    .destination_pod
                    .iter()
                    .map(|t| NameFilter::parse(t))
                    .collect(),
                labels: selectors("destination_label", &f.destination_label)?,
                ports: ports("destination_port", &f.destination_port)?,
                services: f
                    .destination_service
                    .iter()
                    .map(|t| NameFilter::parse(t))
                    .collect(),
                identities: f.destination_identity.clone(),
            },
            verdicts: f.verdict.clone(),
            event_types: f
                .event_type
                .iter()
                .map(|t| (t.r#type, t.match_sub_type.then_some(t.sub_type)))
                .collect(),
            protocols: f
                .protocol
                .iter()
                .map(|p| p.trim().to_ascii_lowercase())
                .collect(),
            reply: f.reply.clone(),
            tcp_flags: f.tcp_flags.iter().map(convert::tcp_flag_bits).collect(),
            ip_versions: f.ip_version.clone(),
            directions: f.traffic_direction.clone(),
            drop_reasons: f
                .drop_reason_desc
                .iter()
                .map(|t| {
                    drop_reason(t).ok_or_else(|| bad("drop_reason_desc", t, "not a drop reason"))
                })
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `flow` matches every condition set.
    pub fn matches(&self, flow: &Flow) -> bool {
        let e = &flow.event;
        self.source
            .matches(flow, &flow.source, e.saddr, e.sport, false)
            && self
                .destination
                .matches(flow, &flow.destination, e.daddr, e.dport, true)
            && (self.verdicts.is_empty()
                || self.verdicts.contains(&(convert::verdict(flow) as i32)))
            && (self.event_types.is_empty()
                || self.event_types.iter().any(|(t, sub)| {
                    *t == convert::type_of(flow)
                        && sub.is_none_or(|s| s == convert::sub_type_of(flow))
                }))
            && (self.protocols.is_empty()
                || self
                    .protocols
                    .iter()
                    .any(|p| p == convert::protocol_name(e.protocol)))
            && (self.reply.is_empty() || flow.is_reply().is_some_and(|r| self.reply.contains(&r)))
            && (self.tcp_flags.is_empty()
                || (e.protocol == cellium_datapath_bpf::Protocol::Tcp
                    && self.tcp_flags.iter().any(|m| e.tcp_flags & m == *m)))
            && (self.ip_versions.is_empty()
                || self.ip_versions.contains(
                    &(if e.saddr.is_ipv4() {
                        v1::IpVersion::IPv4
                    } else {
                        v1::IpVersion::IPv6
                    } as i32),
                ))
            && (self.directions.is_empty()
                || self.directions.contains(&(convert::direction(flow) as i32)))
            && (self.drop_reasons.is_empty()
                || (flow.verdict() == crate::flow::FlowVerdict::Dropped
                    && self
                        .drop_reasons
                        .contains(&(convert::drop_reason(e.reason) as i32))))
    }
}

/// A request's filters: any whitelist filter (or none given), and no blacklist filter.
#[derive(Debug, Default)]
pub struct Filters {
    whitelist: Vec<Filter>,
    blacklist: Vec<Filter>,
}

impl Filters {
    /// Compiles both lists.
    pub fn new(
        whitelist: &[v1::FlowFilter],
        blacklist: &[v1::FlowFilter],
    ) -> Result<Filters, FilterError> {
        Ok(Filters {
            whitelist: whitelist
                .iter()
                .map(Filter::new)
                .collect::<Result<_, _>>()?,
            blacklist: blacklist
                .iter()
                .map(Filter::new)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `flow` passes.
    pub fn matches(&self, flow: &Flow) -> bool {
        (self.whitelist.is_empty() || self.whitelist.iter().any(|f| f.matches(flow)))
            && !self.blacklist.iter().any(|f| f.matches(flow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::Enricher;
    use crate::enrich::tests::{FakeSources, event};
    use cellium_datapath_bpf::{EventKind, Protocol, Reason};
    use std::sync::Arc;

    fn flows() -> Vec<Flow> {
        let s = Arc::new(FakeSources::default());
        s.pod(1, "10.0.0.1", "shop", "client-7f", 300, &["k8s:app=client"]);
        s.pod(
            2,
            "10.0.0.2",
            "shop",
            "web-1",
            301,
            &["k8s:app=web", "k8s:tier=front"],
        );
        s.pod(3, "10.0.0.3", "ops", "probe", 302, &["k8s:app=probe"]);
        s.services.lock().unwrap().push((
            9,
            crate::flow::ServiceRef {
                namespace: "shop".into(),
                name: "web".into(),
            },
        ));
        let mut e = Enricher::new(s);
        // 0: client -> web dropped by policy (TCP 80)
        let drop = e.flow(event("10.0.0.1", "10.0.0.2"));
        // 1: probe -> web forwarded through the service (UDP 53)
        let mut t = event("10.0.0.3", "10.0.0.2");
        t.kind = EventKind::Trace;
        t.reason = Reason::Forwarded;
        t.allowed = true;
        t.protocol = Protocol::Udp;
        t.dport = 53;
        t.rev_nat_id = 9;
        t.direction = cellium_datapath_bpf::Direction::Egress;
        let trace = e.flow(t);
        // 2: client -> world, default deny
        let mut w = event("10.0.0.1", "1.1.1.1");
        w.reason = Reason::PolicyDefaultDeny;
        w.direction = cellium_datapath_bpf::Direction::Egress;
        let world = e.flow(w);
        vec![drop, trace, world]
    }

    fn select(whitelist: Vec<v1::FlowFilter>, blacklist: Vec<v1::FlowFilter>) -> Vec<usize> {
        let f = Filters::new(&whitelist, &blacklist).unwrap();
        flows()
            .iter()
            .enumerate()
            .filter(|(_, fl)| f.matches(fl))
            .map(|(i, _)| i)
            .collect()
    }

    fn ff() -> v1::FlowFilter {
        v1::FlowFilter::default()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn each_filter_and_its_negation() {
        let cases: Vec<(v1::FlowFilter, Vec<usize>)> = vec![
            (ff(), vec![0, 1, 2]),
            (
                v1::FlowFilter {
                    verdict: vec![v1::Verdict::Dropped as i32],
                    ..ff()
                },
                vec![0, 2],
            ),
            (
                v1::FlowFilter {
                    drop_reason_desc: s(&["POLICY_DENIED"]),
                    ..ff()
                },
                vec![2],
            ),
            (
                v1::FlowFilter {
                    drop_reason_desc: s(&["181"]),
                    ..ff()
                },
                vec![0],
            ),
            (
                v1::FlowFilter {
                    event_type: vec![v1::EventTypeFilter {
                        r#type: 4,
                        ..Default::default()
                    }],
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    source_pod: s(&["shop/client"]),
                    ..ff()
                },
                vec![0, 2],
            ),
            (
                v1::FlowFilter {
                    source_pod: s(&["ops/"]),
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    destination_pod: s(&["web"]),
                    ..ff()
                },
                vec![0, 1],
            ),
            (
                v1::FlowFilter {
                    destination_label: s(&["app=web,tier in (front)"]),
                    ..ff()
                },
                vec![0, 1],
            ),
            (
                v1::FlowFilter {
                    source_label: s(&["k8s:app=probe"]),
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    destination_ip: s(&["1.1.1.0/24"]),
                    ..ff()
                },
                vec![2],
            ),
            (
                v1::FlowFilter {
                    source_ip: s(&["10.0.0.3"]),
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    destination_port: s(&["53"]),
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    protocol: s(&["TCP"]),
                    ..ff()
                },
                vec![0, 2],
            ),
            (
                v1::FlowFilter {
                    destination_identity: vec![2],
                    ..ff()
                },
                vec![2],
            ),
            (
                v1::FlowFilter {
                    source_identity: vec![302],
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    traffic_direction: vec![v1::TrafficDirection::Egress as i32],
                    ..ff()
                },
                vec![1, 2],
            ),
            (
                v1::FlowFilter {
                    destination_service: s(&["shop/web"]),
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    reply: vec![false],
                    ..ff()
                },
                vec![1],
            ),
            (
                v1::FlowFilter {
                    tcp_flags: vec![v1::TcpFlags {
                        syn: true,
                        ..Default::default()
                    }],
                    ..ff()
                },
                vec![0, 2],
            ),
        ];
        for (filter, expected) in cases {
            assert_eq!(select(vec![filter.clone()], vec![]), expected, "{filter:?}");
            let negated: Vec<usize> = (0..3).filter(|i| !expected.contains(i)).collect();
            assert_eq!(
                select(vec![], vec![filter.clone()]),
                negated,
                "not {filter:?}"
            );
        }
    }

    #[test]
    fn fields_combine_and_filters_alternate() {
        // Both conditions in one filter: and.
        let both = v1::FlowFilter {
            source_pod: s(&["shop/"]),
            destination_ip: s(&["1.1.1.1"]),
            ..ff()
        };
        assert_eq!(select(vec![both], vec![]), [2]);
        // Two filters: or; the blacklist takes away.
        let a = v1::FlowFilter {
            destination_port: s(&["53"]),
            ..ff()
        };
        let b = v1::FlowFilter {
            verdict: vec![v1::Verdict::Dropped as i32],
            ..ff()
        };
        let not_world = v1::FlowFilter {
            destination_identity: vec![2],
            ..ff()
        };
        assert_eq!(select(vec![a, b], vec![not_world]), [0, 1]);
    }

    #[test]
    fn unreadable_filters_name_the_field() {
        let err = Filters::new(
            &[v1::FlowFilter {
                source_ip: s(&["10.0.0/8"]),
                ..ff()
            }],
            &[],
        )
        .unwrap_err();
        assert_eq!(err.field, "source_ip");
        let err = Filters::new(
            &[],
            &[v1::FlowFilter {
                destination_port: s(&["http"]),
                ..ff()
            }],
        )
        .unwrap_err();
        assert_eq!(err.field, "destination_port");
        let err = Filters::new(
            &[v1::FlowFilter {
                source_label: s(&["a in ("]),
                ..ff()
            }],
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("source_label"), "{err}");
    }
}

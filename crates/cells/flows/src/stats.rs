//! Counters of what the flows said, exported as Prometheus metrics at each scrape.
//!
//! Updated for every flow by the reader, so they are plain numbers behind one uncontended
//! lock, never a label set built per event; labels are made only when scraped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_datapath_bpf::{EventKind, PolicyMatch};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use crate::convert;
use crate::flow::{Flow, FlowVerdict};
use crate::ring::Ring;

/// The counters.
#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    // (type, verdict) -> flows
    flows: HashMap<(&'static str, &'static str), u64>,
    // (direction, match, action) -> policy verdicts
    verdicts: HashMap<(&'static str, &'static str, &'static str), u64>,
    // endpoint id -> reason -> drops
    drops: HashMap<u16, BTreeMap<String, u64>>,
    // (kind, namespace, name, direction) -> policy drops that object decided
    policy_drops: HashMap<(String, String, String, &'static str), u64>,
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Drop => "drop",
        EventKind::Trace => "trace",
        EventKind::PolicyVerdict => "policy-verdict",
        EventKind::Unknown(_) => "unknown",
    }
}

fn direction_name(d: cellium_datapath_bpf::Direction) -> &'static str {
    match d {
        cellium_datapath_bpf::Direction::Ingress => "ingress",
        cellium_datapath_bpf::Direction::Egress => "egress",
    }
}

fn verdict_name(v: FlowVerdict) -> &'static str {
    match v {
        FlowVerdict::Forwarded => "FORWARDED",
        FlowVerdict::Dropped => "DROPPED",
        FlowVerdict::Audit => "AUDIT",
    }
}

impl Stats {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `flow`.
    pub fn count(&self, flow: &Flow) {
        let e = &flow.event;
        let verdict = flow.verdict();
        let mut inner = self.lock();
        *inner
            .flows
            .entry((kind_name(e.kind), verdict_name(verdict)))
            .or_default() += 1;
        match e.kind {
            EventKind::PolicyVerdict => {
                let action = match (e.allowed, e.audited) {
                    (_, true) => "audit",
                    (true, false) => "allowed",
                    (false, false) => "denied",
                };
                *inner
                    .verdicts
                    .entry((direction_name(e.direction), e.egress_match.name(), action))
                    .or_default() += 1;
            }
            EventKind::Trace => {
                // A trace carries the decisions that let its connection through.
                for (direction, m) in [("egress", e.egress_match), ("ingress", e.ingress_match)] {
                    if m != PolicyMatch::None {
                        *inner
                            .verdicts
                            .entry((direction, m.name(), "allowed"))
                            .or_default() += 1;
                    }
                }
            }
            EventKind::Drop => {
                let reason = convert::drop_reason(e.reason).as_str_name();
                let by = inner.drops.entry(e.endpoint_id).or_default();
                match by.get_mut(reason) {
                    Some(n) => *n += 1,
                    None => {
                        by.insert(reason.to_string(), 1);
                    }
                }
                let direction = direction_name(e.direction);
                for p in flow.policies.iter() {
                    let key = (
                        p.kind.clone(),
                        p.namespace.clone(),
                        p.name.clone(),
                        direction,
                    );
                    *inner.policy_drops.entry(key).or_default() += 1;
                }
            }
            EventKind::Unknown(_) => {}
        }
    }

    /// Drops seen for endpoint `id`, by Hubble's reason name.
    pub fn drops_of(&self, id: u16) -> BTreeMap<String, u64> {
        self.lock().drops.get(&id).cloned().unwrap_or_default()
    }
}

/// The collector that turns [`Stats`] and the ring's counters into samples.
#[derive(Debug)]
pub(crate) struct StatsCollector {
    pub(crate) stats: Arc<Stats>,
    pub(crate) ring: Arc<Ring>,
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (flows, verdicts, drops, policy_drops) = {
            let inner = self.stats.lock();
            (
                inner.flows.clone(),
                inner.verdicts.clone(),
                inner.drops.clone(),
                inner.policy_drops.clone(),
            )
        };
        let mut family = encoder.encode_descriptor(
            "flows_processed",
            "Flows seen, by event type (drop, trace, policy-verdict) and verdict",
            None,
            MetricType::Counter,
        )?;
        for ((kind, verdict), n) in &flows {
            let labels = [("type", *kind), ("verdict", *verdict)];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "policy_verdicts",
            "Policy decisions on new connections, by direction, match type and action",
            None,
            MetricType::Counter,
        )?;
        for ((direction, m, action), n) in &verdicts {
            let labels = [
                ("direction", *direction),
                ("match", *m),
                ("action", *action),
            ];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "endpoint_drops",
            "Packets dropped, by endpoint id and reason, as the flows reported them",
            None,
            MetricType::Counter,
        )?;
        for (id, by) in &drops {
            for (reason, n) in by {
                let labels = [("endpoint", id.to_string()), ("reason", reason.clone())];
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "policy_drops",
            "Packets dropped by policy, by the policy object that decided (its deny rule, or its default deny) and direction",
            None,
            MetricType::Counter,
        )?;
        for ((kind, namespace, name, direction), n) in &policy_drops {
            let labels = [
                ("kind", kind.as_str()),
                ("namespace", namespace.as_str()),
                ("name", name.as_str()),
                ("direction", direction),
            ];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "flows_lost_events",
            "Events lost: the datapath's ring buffer was full (datapath) or a follower lagged (follower)",
            None,
            MetricType::Counter,
        )?;
        for (source, n) in [
            ("datapath", self.ring.lost_datapath()),
            ("follower", self.ring.lost_followers()),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&[("source", source)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::Enricher;
    use crate::enrich::tests::{FakeSources, event};

    #[test]
    fn drops_are_counted_per_endpoint_and_traces_by_match() {
        let stats = Stats::default();
        let mut e = Enricher::new(Arc::new(FakeSources::default()));
        stats.count(&e.flow(event("10.0.0.1", "10.0.0.2")));
        stats.count(&e.flow(event("10.0.0.1", "10.0.0.2")));
        let mut t = event("10.0.0.1", "10.0.0.2");
        t.kind = EventKind::Trace;
        t.allowed = true;
        t.egress_match = PolicyMatch::L3L4;
        stats.count(&e.flow(t));
        assert_eq!(stats.drops_of(2).get("POLICY_DENY"), Some(&2));
        let inner = stats.lock();
        assert_eq!(inner.flows.get(&("drop", "DROPPED")), Some(&2));
        assert_eq!(
            inner.verdicts.get(&("egress", "L3-L4", "allowed")),
            Some(&1)
        );
        // The policy that decided each drop, as the sources named it.
        let ((_, _, name, direction), n) = inner.policy_drops.iter().next().unwrap();
        assert_eq!((name.as_str(), *direction, *n), ("denied", "ingress", 2));
        assert_eq!(inner.policy_drops.len(), 1);
    }
}

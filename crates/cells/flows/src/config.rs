//! The `flows` configuration section, with Cilium's key names.

use serde::{Deserialize, Serialize};

/// How many flows are kept and which events the datapath emits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FlowsConfig {
    /// Whether the observer runs at all (Cilium's `enable-hubble`). Off: no event is read,
    /// trace and verdict events are switched off, and `Observer.GetFlows` is UNAVAILABLE.
    pub enable_hubble: bool,
    /// How many flows the ring keeps (Cilium's `hubble-event-buffer-capacity`); the oldest
    /// is forgotten when a new one comes. At least 1.
    pub hubble_event_buffer_capacity: usize,
    /// Emit a trace event for each new connection forwarded, with its policy match and the
    /// service it went through (Cilium's `bpf-events-trace-enabled`). Checked by the datapath
    /// once per new connection: established traffic pays nothing either way.
    pub bpf_events_trace_enabled: bool,
    /// Emit a policy-verdict event for each new connection's every policy decision (Cilium's
    /// `bpf-events-policy-verdict-enabled`): an allowed local connection gives two (egress
    /// and ingress), on top of its trace.
    pub bpf_events_policy_verdict_enabled: bool,
    /// How many flows a following client may be behind before it skips some (counted as
    /// lost to it, `OBSERVER_EVENTS_QUEUE`).
    pub hubble_follow_queue_size: usize,
}

impl Default for FlowsConfig {
    fn default() -> Self {
        FlowsConfig {
            enable_hubble: true,
            hubble_event_buffer_capacity: 4095,
            bpf_events_trace_enabled: true,
            bpf_events_policy_verdict_enabled: false,
            hubble_follow_queue_size: 4096,
        }
    }
}

impl FlowsConfig {
    /// The capacity actually used: at least one flow.
    pub fn capacity(&self) -> usize {
        self.hubble_event_buffer_capacity.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_cilium_s_and_default_to_a_ring_of_4095() {
        let c: FlowsConfig = serde_json::from_str(
            r#"{"enable-hubble": true, "hubble-event-buffer-capacity": 0,
                "bpf-events-trace-enabled": false, "bpf-events-policy-verdict-enabled": true,
                "hubble-follow-queue-size": 8}"#,
        )
        .unwrap();
        assert_eq!(c.capacity(), 1);
        assert!(!c.bpf_events_trace_enabled && c.bpf_events_policy_verdict_enabled);
        assert_eq!(FlowsConfig::default().capacity(), 4095);
    }
}

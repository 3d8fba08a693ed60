//! A flow: one datapath event with who and what it was about.
//!
//! Flows are built once per event and shared (`Arc`) by the ring, every follower and every
//! filter; the endpoint and identity details they carry are shared too, so building one
//! allocates only the flow itself. The Hubble message is made only when a flow is served
//! ([`crate::convert`]).

use std::sync::Arc;
use std::time::SystemTime;

use cellium_datapath_bpf::{Event, EventKind};
use cellium_labels::Labels;

/// One side of a flow.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peer {
    /// Its security identity (0 when the datapath did not know it yet and nothing here does).
    pub identity: u32,
    /// The local pod, when the address is one of this node's endpoints.
    pub endpoint: Option<Arc<EndpointRef>>,
    /// The identity's labels (`k8s:app=web`, `reserved:world`, ...).
    pub labels: Arc<Labels>,
}

impl Peer {
    /// `namespace/pod`, when a pod.
    pub fn pod(&self) -> Option<(&str, &str)> {
        self.endpoint
            .as_ref()
            .filter(|e| !e.pod_name.is_empty())
            .map(|e| (e.namespace.as_str(), e.pod_name.as_str()))
    }
}

/// A local endpoint as flows name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointRef {
    /// The endpoint id.
    pub id: u16,
    /// The pod's namespace (empty when the runtime did not name the pod).
    pub namespace: String,
    /// The pod's name (empty when the runtime did not name it).
    pub pod_name: String,
}

/// A Kubernetes service, as the frontend a translated connection went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A policy object, as flows name the ones that decided a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyRef {
    /// `NetworkPolicy`, `CiliumNetworkPolicy` or `CiliumClusterwideNetworkPolicy`.
    pub kind: String,
    /// Its namespace (empty for the cluster-wide kind).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The `log` value of the rule of it that decided (Cilium 1.18's policy log field).
    pub log: Option<String>,
}

impl std::fmt::Display for PolicyRef {
    /// `CiliumNetworkPolicy shop/db`, `CiliumClusterwideNetworkPolicy no-telnet`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One flow.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// When the datapath saw it (wall clock).
    pub time: SystemTime,
    /// What the datapath reported.
    pub event: Event,
    /// The sender.
    pub source: Peer,
    /// The receiver (after service translation: the backend).
    pub destination: Peer,
    /// The service a translated connection went through.
    pub service: Option<Arc<ServiceRef>>,
    /// Policy verdicts and policy drops: the objects that decided (the allow rules that
    /// matched, the deny rules that matched, or those that put the direction into default
    /// deny), as they stand when the event is read.
    pub policies: Arc<[PolicyRef]>,
}

/// What a flow's verdict is, in Hubble's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowVerdict {
    /// Let through.
    Forwarded,
    /// Dropped.
    Dropped,
    /// A policy drop an audit let through.
    Audit,
}

impl Flow {
    /// Dropped (a drop, or a denying policy verdict), audited (a policy verdict an audit let
    /// through) or forwarded.
    pub fn verdict(&self) -> FlowVerdict {
        match self.event.kind {
            EventKind::Drop => FlowVerdict::Dropped,
            _ if self.event.audited => FlowVerdict::Audit,
            _ if !self.event.allowed => FlowVerdict::Dropped,
            _ => FlowVerdict::Forwarded,
        }
    }

    /// Whether the packet is a reply, when known: traces and policy verdicts are about the
    /// first packet of a connection, drops may come before conntrack knew.
    pub fn is_reply(&self) -> Option<bool> {
        match self.event.kind {
            EventKind::Trace | EventKind::PolicyVerdict => Some(false),
            _ => None,
        }
    }
}

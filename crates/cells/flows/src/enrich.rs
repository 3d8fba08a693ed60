//! Who a flow is about: endpoints, identities and services, looked up once and cached.
//!
//! The reader runs this for every event, so nothing here may cost a lock of another cell per
//! event: local endpoints are copied into a table by address when the endpoint manager says
//! they changed (an atomic read per event), identity labels are cached by number (a number
//! keeps its labels until it is released, and the cache is dropped whenever endpoints
//! change), and services by rev-NAT id are read again on a miss, at most once a second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cellium_datapath_bpf::{Direction, Event, EventKind, Protocol, Reason};
use cellium_labels::Labels;
use cellium_policy_repo::Outcome;

use crate::flow::{EndpointRef, Flow, Peer, PolicyRef, ServiceRef};

/// A local endpoint with what flows say of it.
#[derive(Debug, Clone)]
pub struct LocalEndpoint {
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// Its id and pod.
    pub endpoint: EndpointRef,
    /// Its identity.
    pub identity: u32,
    /// Its labels.
    pub labels: Labels,
}

/// What enrichment reads from the other cells; [`crate::CellSources`] is the agent's.
pub trait Sources: Send + Sync + 'static {
    /// A number that changes whenever endpoints come, go or change.
    fn endpoints_version(&self) -> u64;
    /// Every local endpoint.
    fn endpoints(&self) -> Vec<LocalEndpoint>;
    /// The labels of identity `id`, if it exists.
    fn identity_labels(&self, id: u32) -> Option<Labels>;
    /// The identity the ipcache gives `ip`, if any prefix holds it.
    fn ipcache_identity(&self, ip: IpAddr) -> Option<u32>;
    /// The identity the datapath gives an address no prefix holds (world, or world of its
    /// family).
    fn world_identity(&self, ip: IpAddr) -> u32;
    /// Every service frontend by rev-NAT id.
    fn services(&self) -> Vec<(u16, ServiceRef)>;
    /// The policy objects that decided `question`, as the endpoint's policy stands now;
    /// none where no policy is known.
    fn decided_by(&self, question: &PolicyQuestion) -> Vec<PolicyRef> {
        let _ = question;
        Vec::new()
    }
}

/// What a policy verdict or a policy drop asks of the endpoint's policy: which objects
/// decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyQuestion {
    /// The endpoint whose policy decided.
    pub endpoint_id: u16,
    /// What it decided.
    pub outcome: Outcome,
    /// The direction, relative to the endpoint.
    pub direction: Direction,
    /// The other side's identity.
    pub peer_identity: u32,
    /// The protocol.
    pub protocol: Protocol,
    /// The destination port (0 for protocols without ports).
    pub port: u16,
}

impl PolicyQuestion {
    /// The question an event asks, if it is a policy verdict or a policy drop.
    pub fn of(event: &Event) -> Option<PolicyQuestion> {
        // An audited verdict carries the drop it let through as its reason.
        let outcome = match (event.kind, event.reason) {
            (EventKind::PolicyVerdict | EventKind::Drop, Reason::PolicyDeny) => Outcome::Denied,
            (EventKind::PolicyVerdict | EventKind::Drop, Reason::PolicyDefaultDeny) => {
                Outcome::DefaultDenied
            }
            (EventKind::PolicyVerdict, _) if event.allowed => Outcome::Allowed,
            _ => return None,
        };
        let peer_identity = match event.direction {
            Direction::Ingress => event.src_identity,
            Direction::Egress => event.dst_identity,
        };
        Some(PolicyQuestion {
            endpoint_id: event.endpoint_id,
            outcome,
            direction: event.direction,
            peer_identity,
            protocol: event.protocol,
            port: event.protocol.policy_port(event.dport, event.icmp.0),
        })
    }
}

/// How often a rev-NAT id that names no known service may trigger a new read.
const SERVICE_REFRESH: Duration = Duration::from_secs(1);

/// Turns events into flows.
pub struct Enricher {
    sources: Arc<dyn Sources>,
    version: Option<u64>,
    by_ip: HashMap<IpAddr, (Arc<EndpointRef>, u32, Arc<Labels>)>,
    identities: HashMap<u32, Arc<Labels>>,
    services: HashMap<u16, Arc<ServiceRef>>,
    services_read: Option<Instant>,
    empty: Arc<Labels>,
    no_policies: Arc<[PolicyRef]>,
    // ktime -> wall clock: the offset measured at construction (both clocks tick alike
    // while the node runs; a wall clock step shows up only after a restart).
    boot_offset: Duration,
}

impl std::fmt::Debug for Enricher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enricher")
            .field("endpoints", &self.by_ip.len())
            .field("identities", &self.identities.len())
            .field("services", &self.services.len())
            .finish_non_exhaustive()
    }
}

/// Cached identities beyond which the cache starts afresh.
const MAX_IDENTITIES: usize = 65_536;

impl Enricher {
    /// An enricher reading `sources`, converting times with the current clocks.
    pub fn new(sources: Arc<dyn Sources>) -> Enricher {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let kt = Duration::from_nanos(cellium_datapath_bpf::ktime_now_ns().unwrap_or(0));
        Enricher {
            sources,
            version: None,
            by_ip: HashMap::new(),
            identities: HashMap::new(),
            services: HashMap::new(),
            services_read: None,
            empty: Arc::new(Labels::new()),
            no_policies: Arc::new([]),
            boot_offset: wall.saturating_sub(kt),
        }
    }

    /// The flow of `event`.
    pub fn flow(&mut self, event: Event) -> Flow {
        self.refresh_endpoints();
        let source = self.peer(event.saddr, event.src_identity);
        let destination = self.peer(event.daddr, event.dst_identity);
        let service = match event.rev_nat_id {
            0 => None,
            id => self.service(id),
        };
        Flow {
            time: SystemTime::UNIX_EPOCH + self.boot_offset + Duration::from_nanos(event.ktime_ns),
            source,
            destination,
            service,
            policies: self.policies(&event),
            event,
        }
    }

    fn policies(&self, event: &Event) -> Arc<[PolicyRef]> {
        match PolicyQuestion::of(event) {
            Some(q) => self.sources.decided_by(&q).into(),
            None => self.no_policies.clone(),
        }
    }

    fn refresh_endpoints(&mut self) {
        let version = self.sources.endpoints_version();
        if self.version == Some(version) {
            return;
        }
        self.version = Some(version);
        self.by_ip.clear();
        self.identities.clear();
        for ep in self.sources.endpoints() {
            let (r, labels) = (Arc::new(ep.endpoint), Arc::new(ep.labels));
            for ip in ep.addresses {
                self.by_ip
                    .insert(ip, (r.clone(), ep.identity, labels.clone()));
            }
        }
    }

    fn peer(&mut self, ip: IpAddr, identity: u32) -> Peer {
        if let Some((ep, id, labels)) = self.by_ip.get(&ip) {
            return Peer {
                // The event's identity is what the datapath enforced; the record's is the
                // fallback when the event did not know it yet.
                identity: if identity != 0 { identity } else { *id },
                endpoint: Some(ep.clone()),
                labels: labels.clone(),
            };
        }
        let identity = match identity {
            0 => self
                .sources
                .ipcache_identity(ip)
                .unwrap_or_else(|| self.sources.world_identity(ip)),
            id => id,
        };
        Peer {
            identity,
            endpoint: None,
            labels: self.labels(identity),
        }
    }

    fn labels(&mut self, identity: u32) -> Arc<Labels> {
        if let Some(l) = self.identities.get(&identity) {
            return l.clone();
        }
        let labels = match self.sources.identity_labels(identity) {
            Some(l) => Arc::new(l),
            None => self.empty.clone(),
        };
        if self.identities.len() >= MAX_IDENTITIES {
            self.identities.clear();
        }
        self.identities.insert(identity, labels.clone());
        labels
    }

    fn service(&mut self, id: u16) -> Option<Arc<ServiceRef>> {
        if let Some(s) = self.services.get(&id) {
            return Some(s.clone());
        }
        if self
            .services_read
            .is_some_and(|at| at.elapsed() < SERVICE_REFRESH)
        {
            return None;
        }
        self.services_read = Some(Instant::now());
        self.services = self
            .sources
            .services()
            .into_iter()
            .map(|(id, s)| (id, Arc::new(s)))
            .collect();
        self.services.get(&id).cloned()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Sources held in memory, for tests.
    #[derive(Default)]
    pub(crate) struct FakeSources {
        pub version: AtomicU64,
        pub endpoints: Mutex<Vec<LocalEndpoint>>,
        pub identities: Mutex<HashMap<u32, Labels>>,
        pub services: Mutex<Vec<(u16, ServiceRef)>>,
        pub service_reads: AtomicU64,
        pub questions: Mutex<Vec<PolicyQuestion>>,
    }

    impl FakeSources {
        pub fn pod(&self, id: u16, ip: &str, ns: &str, name: &str, identity: u32, labels: &[&str]) {
            let labels: Labels = labels.iter().map(|l| l.parse().unwrap()).collect();
            self.identities
                .lock()
                .unwrap()
                .insert(identity, labels.clone());
            self.endpoints.lock().unwrap().push(LocalEndpoint {
                addresses: vec![ip.parse().unwrap()],
                endpoint: EndpointRef {
                    id,
                    namespace: ns.into(),
                    pod_name: name.into(),
                },
                identity,
                labels,
            });
            self.version.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Sources for FakeSources {
        fn endpoints_version(&self) -> u64 {
            self.version.load(Ordering::SeqCst)
        }
        fn endpoints(&self) -> Vec<LocalEndpoint> {
            self.endpoints.lock().unwrap().clone()
        }
        fn identity_labels(&self, id: u32) -> Option<Labels> {
            if id == 2 {
                return Some(["reserved:world".parse().unwrap()].into_iter().collect());
            }
            self.identities.lock().unwrap().get(&id).cloned()
        }
        fn ipcache_identity(&self, _: IpAddr) -> Option<u32> {
            None
        }
        fn world_identity(&self, _: IpAddr) -> u32 {
            2
        }
        fn services(&self) -> Vec<(u16, ServiceRef)> {
            self.service_reads.fetch_add(1, Ordering::SeqCst);
            self.services.lock().unwrap().clone()
        }
        fn decided_by(&self, q: &PolicyQuestion) -> Vec<PolicyRef> {
            self.questions.lock().unwrap().push(*q);
            vec![PolicyRef {
                kind: "CiliumNetworkPolicy".into(),
                namespace: "shop".into(),
                name: format!("{:?}", q.outcome).to_lowercase(),
                log: Some("seen".into()),
            }]
        }
    }

    pub(crate) fn event(src: &str, dst: &str) -> Event {
        Event {
            ktime_ns: 1_000,
            kind: cellium_datapath_bpf::EventKind::Drop,
            reason: cellium_datapath_bpf::Reason::PolicyDeny,
            direction: cellium_datapath_bpf::Direction::Ingress,
            protocol: cellium_datapath_bpf::Protocol::Tcp,
            endpoint_id: 2,
            src_identity: 0,
            dst_identity: 0,
            saddr: src.parse().unwrap(),
            daddr: dst.parse().unwrap(),
            sport: 40000,
            dport: 80,
            ifindex: 7,
            len: 60,
            allowed: false,
            audited: false,
            tcp_flags: 0x02,
            egress_match: cellium_datapath_bpf::PolicyMatch::None,
            ingress_match: cellium_datapath_bpf::PolicyMatch::None,
            rev_nat_id: 0,
            icmp: (0, 0),
        }
    }

    #[test]
    fn both_sides_are_named_and_the_world_by_its_identity() {
        let s = Arc::new(FakeSources::default());
        s.pod(1, "10.0.0.1", "shop", "client", 300, &["k8s:app=client"]);
        s.pod(2, "10.0.0.2", "shop", "web", 301, &["k8s:app=web"]);
        let mut e = Enricher::new(s.clone());
        let f = e.flow(event("10.0.0.1", "10.0.0.2"));
        assert_eq!(f.source.pod(), Some(("shop", "client")));
        assert_eq!(f.destination.pod(), Some(("shop", "web")));
        assert_eq!((f.source.identity, f.destination.identity), (300, 301));
        assert_eq!(f.destination.labels.to_strings(), ["k8s:app=web"]);

        let f = e.flow(event("10.0.0.1", "8.8.8.8"));
        assert_eq!(f.destination.identity, 2);
        assert_eq!(f.destination.labels.to_strings(), ["reserved:world"]);
        assert!(f.destination.endpoint.is_none());

        // A pod created later is known from the next event on.
        s.pod(3, "10.0.0.3", "shop", "db", 302, &["k8s:app=db"]);
        let f = e.flow(event("10.0.0.3", "10.0.0.2"));
        assert_eq!(f.source.pod(), Some(("shop", "db")));
    }

    #[test]
    fn services_are_read_again_on_a_miss_at_most_once_a_second() {
        let s = Arc::new(FakeSources::default());
        let mut e = Enricher::new(s.clone());
        let mut ev = event("10.0.0.1", "10.0.0.2");
        ev.rev_nat_id = 4;
        assert!(e.flow(ev.clone()).service.is_none());
        s.services.lock().unwrap().push((
            4,
            ServiceRef {
                namespace: "shop".into(),
                name: "web".into(),
            },
        ));
        // Within the second: not read again.
        assert!(e.flow(ev.clone()).service.is_none());
        assert_eq!(s.service_reads.load(Ordering::SeqCst), 1);
        e.services_read = None;
        let f = e.flow(ev.clone());
        assert_eq!(f.service.unwrap().name, "web");
        // Known: no read at all.
        e.flow(ev);
        assert_eq!(s.service_reads.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn policy_verdicts_and_policy_drops_ask_which_policies_decided() {
        use cellium_datapath_bpf::{Direction, EventKind, Protocol, Reason};
        let s = Arc::new(FakeSources::default());
        let mut e = Enricher::new(s.clone());
        let mut ev = event("10.0.0.1", "10.0.0.2");
        ev.src_identity = 300;
        ev.dst_identity = 301;
        let f = e.flow(ev.clone());
        assert_eq!(f.policies[0].name, "denied");
        assert_eq!(
            s.questions.lock().unwrap()[0],
            PolicyQuestion {
                endpoint_id: 2,
                outcome: Outcome::Denied,
                direction: Direction::Ingress,
                peer_identity: 300,
                protocol: Protocol::Tcp,
                port: 80,
            }
        );
        // An allowed egress verdict asks about the destination; ICMP has no port.
        let mut allowed = ev.clone();
        (allowed.kind, allowed.reason, allowed.allowed) =
            (EventKind::PolicyVerdict, Reason::Forwarded, true);
        (allowed.direction, allowed.protocol, allowed.dport) =
            (Direction::Egress, Protocol::Icmp, 9);
        assert_eq!(e.flow(allowed).policies[0].name, "allowed");
        let q = *s.questions.lock().unwrap().last().unwrap();
        assert_eq!((q.peer_identity, q.port), (301, 0));
        let mut default = ev.clone();
        default.reason = Reason::PolicyDefaultDeny;
        assert_eq!(e.flow(default).policies[0].name, "defaultdenied");
        // Other drops and traces ask nothing.
        let mut other = ev;
        other.reason = Reason::NoPolicyMap;
        assert!(e.flow(other).policies.is_empty());
        assert_eq!(s.questions.lock().unwrap().len(), 3);
    }
}

//! Recording backends that fail on demand, and a manager built on them with the real
//! in-memory IPAM, identities, ipcache, policy repository and resources and a real state
//! directory: for unit tests of the order and the failure handling of every flow, without
//! root. What only the kernel can show is tested under `integration/`.

mod datapath;
mod harness;
mod interfaces;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use cellium_labels::Labels;

use crate::endpoint::{Address, Endpoint, State};

pub(crate) use datapath::FakeDatapath;
pub(crate) use harness::Harness;
pub(crate) use interfaces::FakeInterfaces;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A ready endpoint `id` of container `container` at 10.244.0.`id`, host end `lxc<id>`.
pub(crate) fn endpoint(id: u16, container: &str) -> Endpoint {
    let ip: IpAddr = format!("10.244.0.{id}").parse().expect("a literal address");
    Endpoint {
        id,
        container_id: container.into(),
        ifname: "eth0".into(),
        netns: format!("/run/netns/{container}").into(),
        network: "cellium".into(),
        pod: None,
        addresses: vec![Address {
            ip,
            pool: "10.244.0.0/24".parse().expect("a literal CIDR"),
            gateway: "10.244.0.1".parse().expect("a literal address"),
        }],
        host_ifname: format!("lxc{id}"),
        host_ifindex: u32::from(id),
        host_mac: [2, 0, 0, 0, 0, 1],
        pod_mac: [2, 0, 0, 0, 0, 2],
        mtu: 1500,
        labels: Labels::new(),
        identity: 0,
        cluster_identity: 0,
        port_mappings: Vec::new(),
        state: State::Ready,
        created_unix_ms: 0,
    }
}

type Observer = Box<dyn Fn() -> String + Send>;

/// Every backend call, in order, from both fakes: `setup_pod lxc..`, `attach 3`, ... With an
/// observer, each call also notes what the observer sees at that moment (`[records: 1=ready]`).
#[derive(Clone, Default)]
pub(crate) struct Journal {
    calls: Arc<Mutex<Vec<String>>>,
    observer: Arc<Mutex<Option<Observer>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.calls()).finish()
    }
}

impl Journal {
    fn push(&self, mut call: String) {
        if let Some(observe) = lock(&self.observer).as_ref() {
            call = format!("{call} [{}]", observe());
        }
        lock(&self.calls).push(call);
    }

    /// Notes `observe()` with every call from now on.
    pub(crate) fn observe(&self, observe: impl Fn() -> String + Send + 'static) {
        *lock(&self.observer) = Some(Box::new(observe));
    }

    /// The calls so far.
    pub(crate) fn calls(&self) -> Vec<String> {
        lock(&self.calls).clone()
    }

    /// The calls so far whose text starts with one of `prefixes`.
    pub(crate) fn only(&self, prefixes: &[&str]) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| prefixes.iter().any(|p| c.starts_with(p)))
            .collect()
    }

    /// Forgets the calls so far.
    pub(crate) fn clear(&self) {
        lock(&self.calls).clear();
    }
}

/// Which calls fail: the name of a call (`teardown_pod`, `apply_policy`, ...) and how many
/// more times it fails.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults(Arc<Mutex<HashMap<&'static str, usize>>>);

impl Faults {
    /// Makes the next `times` calls of `call` fail.
    pub(crate) fn fail(&self, call: &'static str, times: usize) {
        lock(&self.0).insert(call, times);
    }

    fn strikes(&self, call: &'static str) -> bool {
        let mut faults = lock(&self.0);
        match faults.get_mut(call) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

//! The node's interfaces, in memory: a fake of [`Interfaces`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::{Faults, Journal, lock};
use crate::interfaces::Interfaces;
use crate::plumbing::{self, Link, PodInterface, PodNetns, PodNetwork};

/// The node's interfaces, in memory.
#[derive(Debug, Default)]
pub(crate) struct FakeInterfaces {
    journal: Journal,
    faults: Faults,
    state: Mutex<Node>,
}

#[derive(Debug, Default)]
struct Node {
    /// Host ends by name.
    links: BTreeMap<String, Link>,
    /// Pods' network namespaces, each with the host ends of the veth pairs into it.
    netns: BTreeMap<PathBuf, BTreeSet<String>>,
    /// Routes to pods: (address, host end's index).
    routes: Vec<(IpAddr, u32)>,
    next_index: u32,
}

impl FakeInterfaces {
    /// Empty, recording into `journal` and failing as `faults` say.
    pub(crate) fn new(journal: &Journal, faults: &Faults) -> FakeInterfaces {
        FakeInterfaces {
            journal: journal.clone(),
            faults: faults.clone(),
            state: Mutex::default(),
        }
    }

    /// Makes a pod network namespace exist.
    pub(crate) fn add_netns(&self, path: impl Into<PathBuf>) {
        lock(&self.state).netns.entry(path.into()).or_default();
    }

    /// Makes a pod network namespace disappear, and with it (as the kernel does) every veth
    /// pair into it.
    pub(crate) fn remove_netns(&self, path: &Path) {
        let mut node = lock(&self.state);
        for host in node.netns.remove(path).unwrap_or_default() {
            if let Some(gone) = node.links.remove(&host) {
                node.routes.retain(|(_, i)| *i != gone.index);
            }
        }
    }

    /// Records that host end `host` leads into `netns`, as a previous run would have left it.
    pub(crate) fn connect(&self, netns: &Path, host: &str) {
        lock(&self.state)
            .netns
            .entry(netns.to_path_buf())
            .or_default()
            .insert(host.to_string());
    }

    /// Adds a route to a pod through host end `index`, as a previous run would have left it.
    pub(crate) fn add_route(&self, ip: IpAddr, index: u32) {
        lock(&self.state).routes.push((ip, index));
    }

    /// Adds a host end, as a previous run would have left it.
    pub(crate) fn add_link(&self, name: &str, index: u32) {
        let mut node = lock(&self.state);
        node.links.insert(name.into(), link(index));
        node.next_index = node.next_index.max(index);
    }

    /// The host ends.
    pub(crate) fn links(&self) -> Vec<String> {
        lock(&self.state).links.keys().cloned().collect()
    }

    fn fault(&self, call: &'static str, what: &str) -> plumbing::Result<()> {
        self.journal.push(format!("{call} {what}"));
        if self.faults.strikes(call) {
            return Err(plumbing::Error::Drift(format!(
                "injected failure of {call}"
            )));
        }
        Ok(())
    }
}

fn link(index: u32) -> Link {
    Link {
        index,
        mac: [2, 0, 0, 0, 0, index as u8],
        mtu: 1500,
        up: true,
    }
}

impl Interfaces for FakeInterfaces {
    fn setup_pod<'a>(
        &'a self,
        netns: &'a PodNetns,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, plumbing::Result<PodInterface>> {
        Box::pin(async move {
            self.fault("setup_pod", &net.host_ifname)?;
            let mut node = lock(&self.state);
            let Some(pairs) = node.netns.get_mut(netns.path()) else {
                return Err(plumbing::Error::Netns {
                    path: netns.path().to_path_buf(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            };
            pairs.insert(net.host_ifname.clone());
            node.next_index += 1;
            let host = link(node.next_index);
            node.links.insert(net.host_ifname.clone(), host.clone());
            for (ip, _) in &net.addresses {
                node.routes.push((*ip, host.index));
            }
            Ok(PodInterface { host, pod: link(2) })
        })
    }

    fn teardown_pod<'a>(&'a self, host_ifname: &'a str) -> BoxFuture<'a, plumbing::Result<bool>> {
        Box::pin(async move {
            self.fault("teardown_pod", host_ifname)?;
            let mut node = lock(&self.state);
            let Some(gone) = node.links.remove(host_ifname) else {
                return Ok(false);
            };
            node.routes.retain(|(_, i)| *i != gone.index);
            Ok(true)
        })
    }

    fn check_pod<'a>(
        &'a self,
        netns: &'a PodNetns,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, plumbing::Result<()>> {
        Box::pin(async move {
            self.fault("check_pod", &net.host_ifname)?;
            let node = lock(&self.state);
            if !node.netns.contains_key(netns.path()) || !node.links.contains_key(&net.host_ifname)
            {
                return Err(plumbing::Error::LinkMissing {
                    ifname: net.ifname.clone(),
                    netns: netns.path().display().to_string(),
                });
            }
            Ok(())
        })
    }

    fn host_links(&self) -> BoxFuture<'_, plumbing::Result<Vec<(String, Link)>>> {
        Box::pin(async move {
            self.fault("host_links", "")?;
            Ok(lock(&self.state)
                .links
                .iter()
                .map(|(n, l)| (n.clone(), l.clone()))
                .collect())
        })
    }

    fn host_routes(&self) -> BoxFuture<'_, plumbing::Result<Vec<(IpAddr, u32)>>> {
        Box::pin(async move {
            self.fault("host_routes", "")?;
            Ok(lock(&self.state).routes.clone())
        })
    }
}

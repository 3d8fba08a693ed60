//! The netlink work an endpoint needs, as a trait.
//!
//! The real implementation is the node's [`Netlink`] connection with the functions of
//! [`plumbing`](crate::plumbing); the order and failure handling of create, delete, restore
//! and sweep are unit-tested against a recording one that fails on demand
//! (`crate::testing`), and end to end against the kernel under `integration/`.

use std::net::IpAddr;

use futures::future::BoxFuture;

use crate::plumbing::{self, Link, Netlink, PodInterface, PodNetns, PodNetwork, Result};

/// Pods' interfaces as the endpoint manager uses them.
pub(crate) trait Interfaces: Send + Sync {
    /// Creates the veth pair with its pod end in `netns`, addresses, routes and neighbour.
    /// On error some of it may exist; [`Interfaces::teardown_pod`] removes all of it.
    fn setup_pod<'a>(
        &'a self,
        netns: &'a PodNetns,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, Result<PodInterface>>;

    /// Removes the veth pair whose host end is `host_ifname` (the pod end and the node's route
    /// go with it); returns whether it existed.
    fn teardown_pod<'a>(&'a self, host_ifname: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// Checks the pod's interface, addresses and default route, then the host end.
    fn check_pod<'a>(
        &'a self,
        netns: &'a PodNetns,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, Result<()>>;

    /// Every link of the node named like a host end, with its name.
    fn host_links(&self) -> BoxFuture<'_, Result<Vec<(String, Link)>>>;

    /// Every route of the node to a single address through an interface, as (address,
    /// interface index).
    fn host_routes(&self) -> BoxFuture<'_, Result<Vec<(IpAddr, u32)>>>;
}

impl Interfaces for Netlink {
    fn setup_pod<'a>(
        &'a self,
        netns: &'a PodNetns,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, Result<PodInterface>> {
        Box::pin(plumbing::setup_pod(self, netns, net))
    }

    fn teardown_pod<'a>(&'a self, host_ifname: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(plumbing::teardown_pod(self, host_ifname))
    }

    fn check_pod<'a>(
        &'a self,
        netns: &'a PodNetns,
        net: &'a PodNetwork,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(plumbing::check_pod(self, netns, net))
    }

    fn host_links(&self) -> BoxFuture<'_, Result<Vec<(String, Link)>>> {
        Box::pin(plumbing::host_links(&self.handle))
    }

    fn host_routes(&self) -> BoxFuture<'_, Result<Vec<(IpAddr, u32)>>> {
        Box::pin(plumbing::host_routes(self))
    }
}

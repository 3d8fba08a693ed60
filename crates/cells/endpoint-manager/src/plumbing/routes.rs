//! Reading the node's routes to single addresses: how the agent finds pods' addresses when
//! it has no record of them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};

use crate::plumbing::error::{Result, netlink};
use crate::plumbing::netns::Netlink;

/// Every route of the node to a single address (`/32`, `/128`) through an interface, as (address, interface index): the routes the agent adds to its pods.
pub async fn host_routes(node: &Netlink) -> Result<Vec<(IpAddr, u32)>> {
    let mut found = Vec::new();
    for filter in [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ] {
        let mut routes = node.handle.route().get(filter).execute();
        while let Some(msg) = routes
            .try_next()
            .await
            .map_err(netlink(format!("list routes in {}", node.netns)))?
        {
            found.extend(host_route(&msg));
        }
    }
    Ok(found)
}

fn host_route(msg: &RouteMessage) -> Option<(IpAddr, u32)> {
    let mut dst = None;
    let mut oif = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let full = match dst? {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    (msg.header.destination_prefix_length == full).then_some((dst?, oif?))
}

//! The node's routes to other nodes' pod CIDRs, kept equal to the desired set.
//!
//! The routes are marked with a routing protocol number of their own ([`PROTOCOL`]), so the
//! agent tells its routes from everyone else's: it replaces and deletes only those, and a
//! restarted agent finds and adopts them (no moment without a route across a restart).

use std::collections::BTreeSet;
use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};

use crate::desired::{NextHop, NodeRoute};
use crate::error::{Error, Result};

/// The routing protocol number of the agent's routes (`ip route show proto 206`): outside the
/// numbers `/etc/iproute2/rt_protos` assigns.
pub const PROTOCOL: u8 = 206;

/// Makes the node's routes of [`PROTOCOL`] equal `desired`: adds or replaces what differs,
/// deletes the rest. Returns how many routes it changed.
pub async fn reconcile(handle: &Handle, desired: &BTreeSet<NodeRoute>) -> Result<usize> {
    let current = ours(handle).await?;
    let mut changed = 0;
    for route in desired.difference(&current) {
        handle
            .route()
            .add(message(route)?)
            .replace()
            .execute()
            .await
            .map_err(|source| Error::Netlink {
                what: format!("add route {route}"),
                source,
            })?;
        changed += 1;
    }
    for route in current.difference(desired) {
        // Replaced above when only its gateway changed: the old one is gone already.
        if desired.iter().any(|d| d.cidr == route.cidr) {
            continue;
        }
        match handle.route().del(message(route)?).execute().await {
            Ok(()) => changed += 1,
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc_esrch() => {}
            Err(source) => {
                return Err(Error::Netlink {
                    what: format!("delete route {route}"),
                    source,
                });
            }
        }
    }
    Ok(changed)
}

/// ESRCH: the route is gone already.
fn libc_esrch() -> i32 {
    3
}

/// The node's routes of [`PROTOCOL`].
async fn ours(handle: &Handle) -> Result<BTreeSet<NodeRoute>> {
    let mut found = BTreeSet::new();
    for filter in [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ] {
        let mut routes = handle.route().get(filter).execute();
        while let Some(msg) = routes.try_next().await.map_err(|source| Error::Netlink {
            what: "list routes".into(),
            source,
        })? {
            if msg.header.protocol == RouteProtocol::Other(PROTOCOL) {
                found.extend(node_route(&msg));
            }
        }
    }
    Ok(found)
}

fn node_route(msg: &RouteMessage) -> Option<NodeRoute> {
    let (mut dst, mut via, mut oif, mut src) = (None, None, None, None);
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = address(a),
            RouteAttribute::Gateway(a) => via = address(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::PrefSource(a) => src = address(a),
            _ => {}
        }
    }
    let cidr = ipnet::IpNet::new(dst?, msg.header.destination_prefix_length).ok()?;
    let next_hop = match (via, oif, src) {
        (Some(via), _, _) => NextHop::Via(via),
        (None, Some(ifindex), Some(src)) => NextHop::Tunnel { ifindex, src },
        _ => return None,
    };
    Some(NodeRoute { cidr, next_hop })
}

fn address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

fn message(route: &NodeRoute) -> Result<RouteMessage> {
    let bad = |reason: String| Error::Route {
        route: route.to_string(),
        reason,
    };
    let builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(route.cidr.addr(), route.cidr.prefix_len())
        .map_err(|e| bad(e.to_string()))?
        .protocol(RouteProtocol::Other(PROTOCOL));
    let builder = match route.next_hop {
        NextHop::Via(via) => builder.gateway(via).map_err(|e| bad(e.to_string()))?,
        NextHop::Tunnel { ifindex, src } => builder
            .output_interface(ifindex)
            .pref_source(src)
            .map_err(|e| bad(e.to_string()))?,
    };
    Ok(builder.build())
}

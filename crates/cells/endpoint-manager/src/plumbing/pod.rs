//! The pod's side: the veth pair, its addresses, routes and gateway neighbour.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::packet_route::neighbour::NeighbourState;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::plumbing::error::{Error, Result, errno, netlink};
use crate::plumbing::links::{Link, find_link};
use crate::plumbing::netns::{Netlink, PodNetns};
use crate::plumbing::sysctl;

const EEXIST: i32 = 17;

/// What a pod's interface should look like.
#[derive(Debug, Clone)]
pub struct PodNetwork {
    /// The host end's name (see [`host_ifname`](crate::plumbing::host_ifname)).
    pub host_ifname: String,
    /// The pod end's name (CNI_IFNAME).
    pub ifname: String,
    /// The MTU of both ends.
    pub mtu: u32,
    /// The pod's addresses, each with its gateway (the pool's router).
    pub addresses: Vec<(IpAddr, IpAddr)>,
}

/// What was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInterface {
    /// The host end.
    pub host: Link,
    /// The pod end.
    pub pod: Link,
}

/// Creates the veth pair with its pod end directly in `netns`, and sets addresses, routes and
/// the gateway's neighbour entry inside the pod and the route to the pod on the node. Every
/// step in the pod goes through the namespace's descriptor, never its path.
///
/// On error some of it may exist; [`teardown_pod`] removes all of it.
pub async fn setup_pod(node: &Netlink, netns: &PodNetns, net: &PodNetwork) -> Result<PodInterface> {
    let pod = Netlink::open(netns).await?;
    if find_link(&pod.handle, &net.ifname).await?.is_some() {
        return Err(Error::LinkExists {
            ifname: net.ifname.clone(),
            netns: pod.netns,
        });
    }
    // A pair left by an attempt that died half-way is in the way of this one.
    teardown_pod(node, &net.host_ifname).await?;
    create_pair(node, netns, net).await?;
    let host = expect_link(node, &net.host_ifname).await?;
    host_settings(&net.host_ifname)?;
    let pod_link = expect_link(&pod, &net.ifname).await?;
    configure_pod(&pod, &pod_link, &host, net).await?;
    for (ip, _) in &net.addresses {
        let route = host_route(*ip, host.index);
        node.handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(netlink(format!(
                "add route to {ip} via {}",
                net.host_ifname
            )))?;
    }
    Ok(PodInterface {
        host,
        pod: pod_link,
    })
}

/// Removes the veth pair (its pod end and the node's route to the pod go with it). Removing
/// what does not exist succeeds.
///
/// Returns once the kernel has announced the host end's removal (RTM_DELLINK), which it does
/// after taking both ends out of their namespaces, with their addresses and routes, and before
/// it waits for an RCU barrier to free them (about 15 ms). From the announcement on, nothing
/// can find or use the interfaces and their names are free: what DEL promises. The deletion
/// request itself completes on its own thread.
pub async fn teardown_pod(node: &Netlink, host_ifname: &str) -> Result<bool> {
    let Some(link) = find_link(&node.handle, host_ifname).await? else {
        return Ok(false);
    };
    let op = || format!("delete interface {host_ifname}");
    // Listening starts before the request is sent, so the announcement cannot be missed.
    let announced =
        Netlink::link_removed(link.index).map_err(|source| Error::Thread { op: op(), source })?;
    let deleted = Netlink::delete_link_alone(link.index);
    tokio::select! {
        () = announced => Ok(true),
        result = deleted => match result {
            Ok(Ok(())) => Ok(true),
            // Deleted meanwhile (the pod's namespace went away and took the pair with it).
            Ok(Err(e)) if errno(&e) == Some(19) => Ok(false),
            Ok(Err(e)) => Err(netlink(op())(e)),
            Err(source) => Err(Error::Thread { op: op(), source }),
        },
    }
}

/// Checks that the pod's interface, addresses and default route are as set up, then the host
/// end. The pod's side comes first: it is what the runtime asks about (`CNI_IFNAME` in
/// `CNI_NETNS`), and removing the pod's interface takes the host end with it, so the message
/// names what was removed rather than its consequence.
pub async fn check_pod(node: &Netlink, netns: &PodNetns, net: &PodNetwork) -> Result<()> {
    let pod = Netlink::open(netns).await?;
    let link = expect_link(&pod, &net.ifname).await?;
    if !link.up {
        return Err(Error::Drift(format!(
            "{} is down in {}",
            net.ifname, pod.netns
        )));
    }
    let mut present = Vec::new();
    let mut addrs = pod
        .handle
        .address()
        .get()
        .set_link_index_filter(link.index)
        .execute();
    while let Some(msg) = addrs
        .try_next()
        .await
        .map_err(netlink(format!("list addresses of {}", net.ifname)))?
    {
        for attr in msg.attributes {
            if let rtnetlink::packet_route::address::AddressAttribute::Address(ip) = attr {
                present.push(ip);
            }
        }
    }
    for (ip, _) in &net.addresses {
        if !present.contains(ip) {
            return Err(Error::Drift(format!(
                "address {ip} is missing from {} in {}",
                net.ifname, pod.netns
            )));
        }
    }
    for (_, gw) in &net.addresses {
        if !has_default_route(&pod, *gw, link.index).await? {
            return Err(Error::Drift(format!(
                "the default route via {gw} dev {} is missing in {}",
                net.ifname, pod.netns
            )));
        }
    }
    let host = expect_link(node, &net.host_ifname).await?;
    if !host.up {
        return Err(Error::Drift(format!("{} is down", net.host_ifname)));
    }
    Ok(())
}

/// Whether `default via <gw> dev <oif>` is in the namespace's main table.
async fn has_default_route(nl: &Netlink, gw: IpAddr, oif: u32) -> Result<bool> {
    let filter = match gw {
        IpAddr::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
        IpAddr::V6(_) => RouteMessageBuilder::<Ipv6Addr>::new().build(),
    };
    let mut routes = nl.handle.route().get(filter).execute();
    while let Some(msg) = routes
        .try_next()
        .await
        .map_err(netlink(format!("list routes in {}", nl.netns)))?
    {
        if msg.header.destination_prefix_length != 0 {
            continue;
        }
        let via = msg
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Gateway(addr) if *addr == RouteAddress::from(gw)));
        let dev = msg
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == oif));
        if via && dev {
            return Ok(true);
        }
    }
    Ok(false)
}

async fn create_pair(node: &Netlink, netns: &PodNetns, net: &PodNetwork) -> Result<()> {
    let ns = netns.as_fd();
    // The pod end is created inside the pod's namespace, under its final name: no temporary
    // name, and a clash with an existing interface there is reported as such.
    let peer = rtnetlink::LinkMessageBuilder::<LinkUnspec>::new()
        .name(net.ifname.clone())
        .mtu(net.mtu)
        .setns_by_fd(ns.as_raw_fd())
        .build();
    let msg = LinkVeth::new(&net.host_ifname, &net.ifname)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .mtu(net.mtu)
        .up()
        .build();
    node.handle
        .link()
        .add(msg)
        .execute()
        .await
        .map_err(|e| match errno(&e) {
            Some(EEXIST) => Error::LinkExists {
                ifname: format!("{} or {}", net.host_ifname, net.ifname),
                netns: format!("the node or {}", netns.path().display()),
            },
            _ => netlink(format!(
                "create veth pair {} / {} in {}",
                net.host_ifname,
                net.ifname,
                netns.path().display()
            ))(e),
        })
}

/// The node must route, not filter, what the pod sends: its source is only reachable through
/// this interface, and redirects would only confuse the pod.
///
/// The node resolves the pod's IPv6 addresses from its link-local address on this interface,
/// which comes up with the pod's end; under duplicate address detection it would stay
/// tentative, and the node unable to reach the pod over IPv6, for a second or two after ADD.
/// Nothing else is on this link to clash with it.
fn host_settings(host_ifname: &str) -> Result<()> {
    sysctl::set_if(host_ifname, "rp_filter", "0")?;
    sysctl::set_if(host_ifname, "forwarding", "1")?;
    sysctl::set_if(host_ifname, "send_redirects", "0")?;
    sysctl::set_if6(host_ifname, "accept_dad", "0")
}

async fn configure_pod(pod: &Netlink, link: &Link, host: &Link, net: &PodNetwork) -> Result<()> {
    let h = &pod.handle;
    let on = |what: &str| format!("{what} on {} in {}", net.ifname, pod.netns);
    h.link()
        .set(LinkUnspec::new_with_index(link.index).up().build())
        .execute()
        .await
        .map_err(netlink(on("set up")))?;
    for (ip, gw) in &net.addresses {
        ignore_exists(add_address(h, link.index, *ip).await)
            .map_err(netlink(on(&format!("add address {ip}"))))?;
        // The gateway is reached on the link itself; its MAC is the host end's, set statically
        // so the pod never has to resolve it (nothing on the node answers for the router
        // address on this link).
        h.neighbours()
            .add(link.index, *gw)
            .link_layer_address(&host.mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(netlink(on(&format!("add neighbour {gw}"))))?;
        for route in [link_route(*gw, link.index), default_route(*gw, link.index)] {
            h.route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(netlink(on(&format!("add route via {gw}"))))?;
        }
    }
    Ok(())
}

/// Adds `ip` as a host address (/32, /128) without duplicate address detection: the address
/// is the pod's alone (IPAM says so), and an IPv6 address under detection stays `tentative`
/// (unusable) for a second or more after ADD returns.
pub(crate) async fn add_address(
    h: &rtnetlink::Handle,
    index: u32,
    ip: IpAddr,
) -> Result<(), rtnetlink::Error> {
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let mut req = h.address().add(index, ip, full);
    let msg = req.message_mut();
    msg.header.flags = AddressHeaderFlags::Nodad;
    msg.attributes
        .push(AddressAttribute::Flags(AddressFlags::Nodad));
    req.execute().await
}

async fn expect_link(nl: &Netlink, name: &str) -> Result<Link> {
    find_link(&nl.handle, name)
        .await?
        .ok_or_else(|| Error::LinkMissing {
            ifname: name.to_string(),
            netns: nl.netns.clone(),
        })
}

fn ignore_exists(r: Result<(), rtnetlink::Error>) -> Result<(), rtnetlink::Error> {
    match r {
        Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
        other => other,
    }
}

/// `<ip>/32 dev <host end>`: the node reaches the pod over its veth.
fn host_route(ip: IpAddr, oif: u32) -> RouteMessage {
    scoped_link(route(ip, None), oif)
}

/// `<gw>/32 dev <ifname> scope link`.
fn link_route(gw: IpAddr, oif: u32) -> RouteMessage {
    scoped_link(route(gw, None), oif)
}

/// `default via <gw> dev <ifname>`.
fn default_route(gw: IpAddr, oif: u32) -> RouteMessage {
    let unspecified = match gw {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let mut msg = route(unspecified, Some(gw));
    msg.header.destination_prefix_length = 0;
    msg.attributes
        .retain(|a| !matches!(a, RouteAttribute::Destination(_)));
    msg.attributes.push(RouteAttribute::Oif(oif));
    msg
}

fn scoped_link(mut msg: RouteMessage, oif: u32) -> RouteMessage {
    msg.header.scope = RouteScope::Link;
    msg.attributes.push(RouteAttribute::Oif(oif));
    msg
}

fn route(dst: IpAddr, gw: Option<IpAddr>) -> RouteMessage {
    match (dst, gw) {
        (IpAddr::V4(d), gw) => {
            let b = RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(d, 32);
            match gw {
                Some(IpAddr::V4(g)) => b.gateway(g).build(),
                _ => b.build(),
            }
        }
        (IpAddr::V6(d), gw) => {
            let b = RouteMessageBuilder::<Ipv6Addr>::new().destination_prefix(d, 128);
            match gw {
                Some(IpAddr::V6(g)) => b.gateway(g).build(),
                _ => b.build(),
            }
        }
    }
}

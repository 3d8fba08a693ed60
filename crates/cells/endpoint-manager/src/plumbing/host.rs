//! The node's side: forwarding on, and a device holding the pools' router addresses.

use std::net::IpAddr;

use rtnetlink::{LinkUnspec, LinkVeth};

use crate::plumbing::error::{Result, errno, netlink};
use crate::plumbing::links::find_link;
use crate::plumbing::netns::Netlink;
use crate::plumbing::pod::add_address;
use crate::plumbing::sysctl;

/// The device that holds the router addresses, so that pods reach the node at their gateway.
pub const HOST_DEVICE: &str = "cellium_host";

/// `cellium_host`'s peer. The device is one end of a veth pair, as Cilium's `cilium_host` is:
/// a pair exists in every kernel with pods at all, where a dummy device needs CONFIG_DUMMY.
const HOST_PEER: &str = "cellium_net";

/// Turns forwarding on and puts every router address on [`HOST_DEVICE`] (created, with its
/// peer, if missing).
/// Idempotent: run at every start.
pub async fn setup_host(node: &Netlink, routers: &[IpAddr]) -> Result<()> {
    sysctl::set("net.ipv4.ip_forward", "1")?;
    if routers.iter().any(IpAddr::is_ipv6) {
        sysctl::set("net.ipv6.conf.all.forwarding", "1")?;
    }
    let link = match find_link(&node.handle, HOST_DEVICE).await? {
        Some(link) => link,
        None => {
            let msg = LinkVeth::new(HOST_DEVICE, HOST_PEER).up().build();
            node.handle
                .link()
                .add(msg)
                .execute()
                .await
                .map_err(netlink(format!("create {HOST_DEVICE}")))?;
            find_link(&node.handle, HOST_DEVICE).await?.ok_or_else(|| {
                crate::plumbing::Error::LinkMissing {
                    ifname: HOST_DEVICE.into(),
                    netns: node.netns.clone(),
                }
            })?
        }
    };
    for name in [HOST_DEVICE, HOST_PEER] {
        let Some(l) = find_link(&node.handle, name).await? else {
            continue;
        };
        node.handle
            .link()
            .set(LinkUnspec::new_with_index(l.index).up().build())
            .execute()
            .await
            .map_err(netlink(format!("set {name} up")))?;
    }
    for ip in routers {
        // Without detection: an IPv6 router address would otherwise stay tentative, and
        // unreachable for the pods, for a second or more after every start.
        match add_address(&node.handle, link.index, *ip).await {
            Err(e) if errno(&e) != Some(17) => {
                return Err(netlink(format!("add {ip} to {HOST_DEVICE}"))(e));
            }
            _ => {}
        }
    }
    Ok(())
}

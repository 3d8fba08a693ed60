//! The node's VXLAN device of tunnel mode (`routing-mode: tunnel`): one collect-metadata
//! device, as Cilium's `cilium_vxlan`, that the datapath redirects traffic for other nodes'
//! pods to with a tunnel key (the node, and the source's identity as the VNI), and whose ingress
//! program hands decapsulated traffic to local pods with the identity it carried.

use futures::TryStreamExt;
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo};
use rtnetlink::{Handle, LinkUnspec, LinkVxlan};

use crate::error::{Error, Result};

/// The device's name.
pub const DEVICE: &str = "cel_vxlan";

/// The device as found on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Found {
    index: u32,
    /// A collect-metadata VXLAN device on `port`.
    fits: bool,
}

/// Makes sure the device exists as tunnel mode needs it (collect metadata, UDP `port`, up) and
/// returns its ifindex. A device of that name that is something else (another port, not
/// VXLAN) is replaced; one that fits is kept, so that an agent restart does not interrupt
/// traffic between nodes.
pub async fn ensure(handle: &Handle, port: u16) -> Result<u32> {
    match find(handle, port).await? {
        Some(found) if found.fits => {
            set_up(handle, found.index).await?;
            return Ok(found.index);
        }
        Some(found) => {
            tracing::info!(
                device = DEVICE,
                "replacing a device that is not the tunnel's"
            );
            delete(handle, found.index).await?;
        }
        None => {}
    }
    let msg = LinkVxlan::new(DEVICE, 0)
        .collect_metadata(true)
        .port(port)
        .learning(false)
        .arp(false)
        .up()
        .build();
    handle
        .link()
        .add(msg)
        .execute()
        .await
        .map_err(|source| Error::Netlink {
            what: format!("create {DEVICE} (VXLAN, UDP port {port})"),
            source,
        })?;
    let found = find(handle, port).await?.ok_or_else(|| Error::Route {
        route: DEVICE.into(),
        reason: "created but not found".into(),
    })?;
    tracing::info!(
        device = DEVICE,
        port,
        ifindex = found.index,
        "tunnel device created"
    );
    Ok(found.index)
}

/// Removes the device if there is one (native routing after tunnel mode); returns the index it
/// had.
pub async fn remove(handle: &Handle) -> Result<Option<u32>> {
    match find(handle, 0).await? {
        Some(found) => {
            delete(handle, found.index).await?;
            tracing::info!(device = DEVICE, "tunnel device removed (native routing)");
            Ok(Some(found.index))
        }
        None => Ok(None),
    }
}

async fn find(handle: &Handle, port: u16) -> Result<Option<Found>> {
    let mut links = handle.link().get().match_name(DEVICE.to_string()).execute();
    let msg = match links.try_next().await {
        Ok(Some(msg)) => msg,
        Ok(None) => return Ok(None),
        // ENODEV: there is none.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => return Ok(None),
        Err(source) => {
            return Err(Error::Netlink {
                what: format!("look up {DEVICE}"),
                source,
            });
        }
    };
    let infos = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => Some(infos),
        _ => None,
    });
    let mut vxlan = false;
    let mut external = false;
    let mut on_port = false;
    for info in infos.into_iter().flatten() {
        match info {
            LinkInfo::Kind(InfoKind::Vxlan) => vxlan = true,
            LinkInfo::Data(InfoData::Vxlan(data)) => {
                for d in data {
                    match d {
                        InfoVxlan::CollectMetadata(on) => external = *on,
                        InfoVxlan::Port(p) => on_port = *p == port,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Some(Found {
        index: msg.header.index,
        fits: vxlan && external && on_port,
    }))
}

/// Up, and without ARP: the node's packets routed into the device need no neighbour (its
/// egress program gives them their tunnel key), so the kernel must not ask for one.
async fn set_up(handle: &Handle, index: u32) -> Result<()> {
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).arp(false).up().build())
        .execute()
        .await
        .map_err(|source| Error::Netlink {
            what: format!("set {DEVICE} up"),
            source,
        })
}

async fn delete(handle: &Handle, index: u32) -> Result<()> {
    handle
        .link()
        .del(index)
        .execute()
        .await
        .map_err(|source| Error::Netlink {
            what: format!("delete {DEVICE}"),
            source,
        })
}

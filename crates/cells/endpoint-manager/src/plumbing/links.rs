//! Finding links and naming the host ends of veth pairs.

use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};

use crate::plumbing::error::{Result, errno, netlink};

/// What the agent needs to know of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The interface index.
    pub index: u32,
    /// The MAC address.
    pub mac: [u8; 6],
    /// The MTU.
    pub mtu: u32,
    /// Whether it is administratively up.
    pub up: bool,
}

/// The link named `name`, or `None` if there is none.
pub async fn find_link(handle: &Handle, name: &str) -> Result<Option<Link>> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    let msg = match links.try_next().await {
        Ok(Some(msg)) => msg,
        Ok(None) => return Ok(None),
        Err(e) if errno(&e) == Some(libc_enodev()) => return Ok(None),
        Err(e) => return Err(netlink(format!("look up interface {name}"))(e)),
    };
    Ok(Some(link_of(msg)))
}

fn link_of(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        mac: [0; 6],
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up),
    };
    for attr in msg.attributes {
        match attr {
            LinkAttribute::Address(a) if a.len() == 6 => link.mac.copy_from_slice(&a),
            LinkAttribute::Mtu(m) => link.mtu = m,
            _ => {}
        }
    }
    link
}

/// Every link whose name looks like a host end made by [`host_ifname`], by name: one dump,
/// where looking each up by name would cost a request apiece.
pub async fn host_links(handle: &Handle) -> Result<Vec<(String, Link)>> {
    let mut links = handle.link().get().execute();
    let mut found = Vec::new();
    while let Some(msg) = links.try_next().await.map_err(netlink("list interfaces"))? {
        let name = msg.attributes.iter().find_map(|attr| match attr {
            LinkAttribute::IfName(name) if is_host_ifname(name) => Some(name.clone()),
            _ => None,
        });
        if let Some(name) = name {
            found.push((name, link_of(msg)));
        }
    }
    Ok(found)
}

fn is_host_ifname(name: &str) -> bool {
    name.len() == 14 && name.starts_with("lxc") && name[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// ENODEV: the kernel's answer to a lookup of a name that no link has.
const fn libc_enodev() -> i32 {
    19
}

/// The host-side name of the veth pair of (`container_id`, `ifname`): `lxc` and 11 hex digits
/// of a stable hash, so the name fits IFNAMSIZ and the agent can find the pair again from the
/// pod's identity alone (after a crash that lost the endpoint record, say).
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    // FNV-1a: stable across builds, unlike the standard library's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id.bytes().chain([0]).chain(ifname.bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("lxc{:011x}", hash & 0xfff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_stable_short_and_distinct() {
        let a = host_ifname("abc", "eth0");
        assert_eq!(a, host_ifname("abc", "eth0"));
        assert_eq!(a.len(), 14);
        assert!(a.starts_with("lxc"));
        assert_ne!(a, host_ifname("abc", "eth1"));
        assert_ne!(a, host_ifname("abd", "eth0"));
        assert!(is_host_ifname(&a));
        assert!(!is_host_ifname("lxc-not-ours"));
    }
}

//! The node's own addresses, read over rtnetlink from the agent's network namespace.

use std::collections::BTreeSet;
use std::net::IpAddr;

use futures::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;

use crate::error::{Error, Result};

/// Every address of every interface of the calling thread's network namespace, except
/// loopback and IPv6 link-local ones (no pod reaches the node through those, and every
/// namespace has them).
pub async fn node_addresses() -> Result<BTreeSet<IpAddr>> {
    // A new connection each time: the socket belongs to the namespace it is opened in, and
    // a refresh a minute is no reason to keep one open.
    let (connection, handle, _) = rtnetlink::new_connection().map_err(Error::HostAddresses)?;
    let task = tokio::spawn(connection);
    let result = async {
        let mut out = BTreeSet::new();
        let mut messages = handle.address().get().execute();
        while let Some(msg) = messages.try_next().await.map_err(Error::Netlink)? {
            // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's on
            // point-to-point links, and the only one IPv6 sends.
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = local.or(address).filter(|ip| relevant(*ip)) {
                out.insert(ip);
            }
        }
        Ok(out)
    }
    .await;
    task.abort();
    result
}

fn relevant(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_loopback(),
        IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_link_local_are_left_out() {
        for (ip, keep) in [
            ("127.0.0.1", false),
            ("::1", false),
            ("fe80::1", false),
            ("febf::1", false),
            ("10.0.0.1", true),
            ("fd00::1", true),
            ("fec0::1", true),
        ] {
            assert_eq!(relevant(ip.parse().unwrap()), keep, "{ip}");
        }
    }
}

//! The node's own devices, those holding its addresses: `cel_from_netdev` on their ingress hands
//! traffic for this node's pods straight to them (with the source's identity from the ipcache,
//! the pod's ingress policy and conntrack), past the node's routing, as Cilium's BPF host
//! routing does. What it does not take (not for a local pod, not addressed to this host) goes on
//! through the node's stack untouched.

use std::collections::BTreeSet;
use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::address::AddressAttribute;

use crate::error::{Error, Result};

/// The indexes of the devices holding one of `addresses`.
pub async fn holding(handle: &Handle, addresses: &[IpAddr]) -> Result<BTreeSet<u32>> {
    let mut found = BTreeSet::new();
    let mut dump = handle.address().get().execute();
    let failed = |source| Error::Netlink {
        what: "list the node's addresses".into(),
        source,
    };
    while let Some(msg) = dump.try_next().await.map_err(failed)? {
        let holds = msg.attributes.iter().any(|a| match a {
            AddressAttribute::Address(ip) | AddressAttribute::Local(ip) => addresses.contains(ip),
            _ => false,
        });
        if holds {
            found.insert(msg.header.index);
        }
    }
    Ok(found)
}

//! The layouts pinned maps had in earlier releases, and how their entries become this build's.
//!
//! Maps stay pinned across upgrades, so that pods keep their connections while the agent is
//! replaced. A map whose key or value grew since the release that pinned it would otherwise be
//! recreated empty at open, and the new programs would run on it before the agent wrote it
//! again: every pod's packets dropped meanwhile, conntrack lost with it. Instead, each such
//! change keeps the release's struct here, as it was, with a conversion that
//! [`crate::pinning`] applies while it copies the entries into the new map.
//!
//! Add a conversion whenever a map's key or value changes size; keep the old struct as it
//! was released (the tests compare its size with the release's). A change of meaning
//! without a change of size bumps [`super::LAYOUT_VERSION`] instead.

use std::mem::{offset_of, size_of};

use super::{EndpointInfo, EndpointKey, Field, Plain};
use crate::types::{EndpointFlags, MacAddr};

/// v0.1.0's layouts (the first release).
pub mod v0_1_0 {
    use super::*;

    /// `struct endpoint_info` of v0.1.0: without `cluster_identity`, which came with
    /// endpoints whose identity is node-local (a policy's ipBlock covers their address).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct EndpointInfo {
        /// Host-side veth ifindex (node netns).
        pub ifindex: u32,
        /// Endpoint id.
        pub id: u16,
        /// Which directions enforce policy.
        pub flags: EndpointFlags,
        /// Security identity of the pod.
        pub identity: u32,
        /// MAC of the host-side veth.
        pub host_mac: MacAddr,
        /// MAC of the pod's eth0.
        pub pod_mac: MacAddr,
    }
    plain!(EndpointInfo {
        ifindex,
        id,
        flags,
        identity,
        host_mac,
        pod_mac
    });
}

/// A map entry's key and value bytes.
pub(crate) type Entry = (Vec<u8>, Vec<u8>);

/// How a map's entries of an earlier release become this build's.
pub(crate) struct Conversion {
    /// The map.
    pub(crate) map: &'static str,
    /// The release whose layout this is.
    pub(crate) release: &'static str,
    /// Its key and value sizes then.
    pub(crate) key: u32,
    pub(crate) value: u32,
    /// One entry, converted; `None` drops it (it is counted as not copied).
    pub(crate) convert: fn(&[u8], &[u8]) -> Option<Entry>,
}

/// Every conversion this build knows.
const CONVERSIONS: &[Conversion] = &[Conversion {
    map: crate::maps::endpoints::NAME,
    release: "v0.1.0",
    key: EndpointKey::SIZE as u32,
    value: v0_1_0::EndpointInfo::SIZE as u32,
    convert: endpoint_info_of_v0_1_0,
}];

/// The conversion of `map`'s entries pinned with these key and value sizes, if it is an
/// earlier release's layout this build knows.
pub(crate) fn conversion(map: &str, key: u32, value: u32) -> Option<&'static Conversion> {
    CONVERSIONS
        .iter()
        .find(|c| c.map == map && c.key == key && c.value == value)
}

/// Every endpoint of v0.1.0 published the identity it enforced with: that is its cluster
/// identity.
fn endpoint_info_of_v0_1_0(key: &[u8], value: &[u8]) -> Option<Entry> {
    let old = v0_1_0::EndpointInfo::decode(value)?;
    let new = EndpointInfo {
        ifindex: old.ifindex,
        id: old.id,
        flags: old.flags,
        identity: old.identity,
        host_mac: old.host_mac,
        pod_mac: old.pod_mac,
        cluster_identity: old.identity,
    };
    Some((key.to_vec(), new.encode()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v0_1_0_endpoint_info_is_as_released() {
        // 4 + 2 + 2 + 4 + 6 + 6: the release's struct endpoint_info.
        assert_eq!(v0_1_0::EndpointInfo::SIZE, 24);
        assert_eq!(EndpointInfo::SIZE, 28);
        let c = conversion("cel_endpoints", 20, 24).expect("a conversion");
        assert_eq!(c.release, "v0.1.0");
        assert!(conversion("cel_endpoints", 20, 28).is_none());
        assert!(conversion("cel_ct4", 20, 24).is_none());
    }

    #[test]
    fn v0_1_0_endpoints_keep_everything_and_publish_their_identity() {
        let old = v0_1_0::EndpointInfo {
            ifindex: 7,
            id: 3,
            flags: EndpointFlags::ENFORCE_INGRESS,
            identity: 4242,
            host_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            pod_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        };
        let key = vec![10, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        let (k, v) = endpoint_info_of_v0_1_0(&key, &old.encode()).unwrap();
        assert_eq!(k, key);
        let new = EndpointInfo::decode(&v).unwrap();
        assert_eq!(
            (
                new.ifindex,
                new.id,
                new.flags,
                new.identity,
                new.host_mac,
                new.pod_mac
            ),
            (
                7,
                3,
                EndpointFlags::ENFORCE_INGRESS,
                4242,
                old.host_mac,
                old.pod_mac
            )
        );
        assert_eq!(new.cluster_identity, 4242);
        assert!(
            endpoint_info_of_v0_1_0(&key, &v).is_none(),
            "not the old size"
        );
    }
}

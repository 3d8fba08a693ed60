//! What `cellium status` tells the operator about endpoints besides their health.

use std::sync::Arc;

use cellium_api::StatusNote;
use cellium_ipam::Ipam;
use cellium_loader::{IPV6_NOT_ENFORCED, Loader};

/// "IPv6 is not enforced: ...", while the node has an IPv6 pod CIDR and the datapath does not
/// enforce IPv6: pods get IPv6 addresses whose traffic is dropped wherever their policy
/// restricts, which an operator must know before writing IPv6 policy.
pub fn ipv6(ipam: Arc<Ipam>) -> Arc<StatusNote> {
    Arc::new(StatusNote::new(move || {
        let ipv6_pods = ipam.families().contains(&6);
        (ipv6_pods && !Loader::ipv6_enforced()).then(|| IPV6_NOT_ENFORCED.to_string())
    }))
}

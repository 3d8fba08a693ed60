//! veth pairs between two namespaces, with fixed MACs.

use crate::error::Result;
use crate::netns::NetNs;
use cellium_datapath_bpf::MacAddr;

/// Creates a veth pair: `host_if` (MAC `host_mac`) in `host`, `peer_if`
/// (MAC `peer_mac`) in `peer`, both up. Removing either namespace removes
/// the pair.
pub fn create(
    host: &NetNs,
    host_if: &str,
    host_mac: MacAddr,
    peer: &NetNs,
    peer_if: &str,
    peer_mac: MacAddr,
) -> Result<()> {
    host.ip(&[
        "link",
        "add",
        host_if,
        "address",
        &host_mac.to_string(),
        "type",
        "veth",
        "peer",
        "name",
        peer_if,
        "address",
        &peer_mac.to_string(),
        "netns",
        peer.name(),
    ])?;
    host.ip(&["link", "set", host_if, "up"])?;
    peer.ip(&["link", "set", peer_if, "up"])?;
    Ok(())
}

/// Creates a veth pair, `host_if` in `host` and `peer_if` in `peer`, with the kernel's MACs and
/// both ends down: the caller addresses them, puts them on a bridge and brings them up.
/// Removing either namespace removes the pair.
pub fn pair(host: &NetNs, host_if: &str, peer: &NetNs, peer_if: &str) -> Result<()> {
    host.ip(&[
        "link",
        "add",
        host_if,
        "type",
        "veth",
        "peer",
        "name",
        peer_if,
        "netns",
        peer.name(),
    ])?;
    Ok(())
}

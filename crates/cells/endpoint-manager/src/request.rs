//! What the runtime asks for, checked before anything is touched.

use std::net::IpAddr;

use cellium_resources::HostPort;

use crate::endpoint::PodRef;
use crate::error::{Error, Result};
use crate::plumbing::PodNetns;

/// A request to create an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// The runtime's container id.
    pub container_id: String,
    /// The pod's network namespace: the namespace the caller passed, checked to be neither the
    /// agent's nor the node's, and the path the runtime named it by.
    pub netns: PodNetns,
    /// The interface name inside the pod.
    pub ifname: String,
    /// The pod, if the runtime named it.
    pub pod: Option<PodRef>,
    /// Addresses asked for; empty = allocate one per configured family.
    pub requested_ips: Vec<IpAddr>,
    /// The CNI network name.
    pub network: String,
    /// The MTU; `None` = the configured default.
    pub mtu: Option<u32>,
    /// Ports to publish on the node (the CNI `portMappings` capability), checked by whoever
    /// built the request (ports 1-65535, `hostIP` an address).
    pub port_mappings: Vec<HostPort>,
}

impl CreateRequest {
    /// Checks every field as the CNI specification constrains it.
    pub fn validate(&self) -> Result<()> {
        container_id(&self.container_id)?;
        ifname(&self.ifname)?;
        if !self.netns.path().is_absolute() {
            return Err(invalid(
                "netns",
                format!(
                    "{:?} is not an absolute path to a network namespace",
                    self.netns.path()
                ),
            ));
        }
        if let Some(mtu) = self.mtu.filter(|m| !(68..=65535).contains(m)) {
            return Err(invalid("mtu", format!("{mtu} is outside 68-65535")));
        }
        Ok(())
    }
}

/// A container id: alphanumerics first, then alphanumerics, '_', '.' and '-' (the CNI
/// specification's rule).
pub fn container_id(id: &str) -> Result<()> {
    let ok = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    ok.then_some(()).ok_or_else(|| {
        invalid(
            "container_id",
            format!("{id:?} must start with a letter or digit and hold only letters, digits, '_', '.' and '-'"),
        )
    })
}

/// An interface name the kernel accepts: 1-15 bytes, not `.` or `..`, no '/', ':' or spaces.
pub fn ifname(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    ok.then_some(()).ok_or_else(|| {
        invalid(
            "ifname",
            format!(
                "{name:?} is not a valid interface name (1-15 characters, no '/', ':' or spaces)"
            ),
        )
    })
}

fn invalid(field: &'static str, reason: String) -> Error {
    Error::Invalid { field, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> CreateRequest {
        CreateRequest {
            container_id: "abc123".into(),
            netns: PodNetns::unchecked("/run/netns/x"),
            ifname: "eth0".into(),
            pod: None,
            requested_ips: vec![],
            network: "cellium".into(),
            mtu: None,
            port_mappings: vec![],
        }
    }

    #[test]
    fn bad_fields_are_named() {
        assert!(req().validate().is_ok());
        type Breakage = fn(&mut CreateRequest);
        let cases: [(Breakage, &str); 5] = [
            (|r| r.container_id = "-x".into(), "container_id"),
            (|r| r.ifname = "a-very-long-interface".into(), "ifname"),
            (|r| r.ifname = "eth/0".into(), "ifname"),
            (|r| r.netns = PodNetns::unchecked("netns"), "netns"),
            (|r| r.mtu = Some(20), "mtu"),
        ];
        for (break_it, field) in cases {
            let mut r = req();
            break_it(&mut r);
            let err = r.validate().unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("invalid {field}")),
                "{err}"
            );
        }
    }
}

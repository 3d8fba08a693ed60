//! This plugin's part of the ADD result, built from the endpoint the agent created.
//!
//! Interfaces are listed host side first, as the reference `ptp` plugin does: the host end of
//! the veth pair (no `sandbox`), then the pod end (`sandbox` = `CNI_NETNS`); the endpoint's
//! addresses are on the pod end.

use cellium_api::v1::Endpoint;

use super::{CniResult, Dns, Interface, IpConfig, Route};
use crate::addr::{Cidr, parse_ip};
use crate::env::Attachment;
use crate::error::{Error, Result};

const CALL: &str = "Endpoints.Create";

/// Builds the result of an ADD from the agent's endpoint; `dns` is the configuration's.
pub fn from_endpoint(ep: &Endpoint, attachment: &Attachment, dns: &Dns) -> Result<CniResult> {
    let bad = |reason: String| Error::AgentReply { call: CALL, reason };
    let mtu = (ep.mtu != 0).then_some(ep.mtu);
    let mac = |m: &str| (!m.is_empty()).then(|| m.to_string());
    let mut interfaces = Vec::with_capacity(2);
    if !ep.host_ifname.is_empty() {
        interfaces.push(Interface {
            name: ep.host_ifname.clone(),
            mac: mac(&ep.host_mac),
            mtu,
            ..Interface::default()
        });
    }
    let pod = interfaces.len();
    interfaces.push(Interface {
        // The agent names the interface as asked; CNI_IFNAME is the authority if it says none.
        name: if ep.ifname.is_empty() {
            attachment.ifname.clone()
        } else {
            ep.ifname.clone()
        },
        mac: mac(&ep.pod_mac),
        mtu,
        sandbox: Some(attachment.netns.clone()),
        ..Interface::default()
    });
    if ep.addresses.is_empty() {
        return Err(bad(format!("endpoint {} has no address", ep.id)));
    }
    let ips = ep
        .addresses
        .iter()
        .map(|a| {
            Ok(IpConfig {
                address: Cidr::parse(&a.address).map_err(|e| bad(format!("address: {e}")))?,
                gateway: optional_ip(&a.gateway).map_err(|e| bad(format!("gateway: {e}")))?,
                interface: Some(pod),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let routes = ep
        .routes
        .iter()
        .map(|r| {
            Ok(Route {
                dst: Cidr::parse(&r.dst).map_err(|e| bad(format!("route: {e}")))?,
                gw: optional_ip(&r.gateway).map_err(|e| bad(format!("route gateway: {e}")))?,
                mtu: None,
                advmss: None,
                priority: None,
                table: None,
                scope: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(CniResult {
        interfaces,
        ips,
        routes,
        dns: dns.clone(),
    })
}

fn optional_ip(s: &str) -> Result<Option<std::net::IpAddr>, String> {
    if s.is_empty() {
        Ok(None)
    } else {
        parse_ip(s).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::CniVersion;
    use cellium_api::v1::{IpConfig as PbIp, Route as PbRoute};
    use serde_json::json;

    fn endpoint() -> Endpoint {
        Endpoint {
            id: 7,
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/p1".into(),
            addresses: vec![PbIp {
                address: "10.0.0.5/32".into(),
                gateway: "10.0.0.1".into(),
            }],
            routes: vec![PbRoute {
                dst: "0.0.0.0/0".into(),
                gateway: "10.0.0.1".into(),
            }],
            host_ifname: "lxc0a000005".into(),
            host_mac: "02:00:00:00:00:01".into(),
            pod_mac: "02:00:00:00:00:02".into(),
            mtu: 1500,
            ..Endpoint::default()
        }
    }

    fn attachment() -> Attachment {
        Attachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/p1".into(),
        }
    }

    #[test]
    fn the_result_lists_host_then_pod_interface_with_the_pod_addresses() {
        let dns = Dns {
            nameservers: vec!["10.96.0.10".into()],
            ..Dns::default()
        };
        let r = from_endpoint(&endpoint(), &attachment(), &dns).unwrap();
        assert_eq!(
            r.render(CniVersion::V1_1_0),
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "lxc0a000005", "mac": "02:00:00:00:00:01", "mtu": 1500},
                    {"name": "eth0", "mac": "02:00:00:00:00:02", "mtu": 1500, "sandbox": "/run/netns/p1"}
                ],
                "ips": [{"interface": 1, "address": "10.0.0.5/32", "gateway": "10.0.0.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
                "dns": {"nameservers": ["10.96.0.10"]}
            })
        );
        assert_eq!(
            r.render(CniVersion::V0_3_1),
            json!({
                "cniVersion": "0.3.1",
                "interfaces": [
                    {"name": "lxc0a000005", "mac": "02:00:00:00:00:01"},
                    {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/run/netns/p1"}
                ],
                "ips": [{"version": "4", "interface": 1, "address": "10.0.0.5/32", "gateway": "10.0.0.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
                "dns": {"nameservers": ["10.96.0.10"]}
            })
        );
    }

    #[test]
    fn dual_stack_addresses_get_their_families() {
        let mut ep = endpoint();
        ep.addresses.push(PbIp {
            address: "fd00::5/128".into(),
            gateway: String::new(),
        });
        let r = from_endpoint(&ep, &attachment(), &Dns::default()).unwrap();
        let out = r.render(CniVersion::V0_4_0);
        assert_eq!(
            out["ips"][1],
            json!({"version": "6", "interface": 1, "address": "fd00::5/128"})
        );
    }

    #[test]
    fn an_unusable_answer_is_an_agent_error() {
        let mut ep = endpoint();
        ep.addresses[0].address = "10.0.0.5".into();
        let err = from_endpoint(&ep, &attachment(), &Dns::default()).unwrap_err();
        assert_eq!(err.code(), 100);
        assert!(err.to_string().contains("no /prefix"), "{err}");
        let mut ep = endpoint();
        ep.addresses.clear();
        let err = from_endpoint(&ep, &attachment(), &Dns::default()).unwrap_err();
        assert!(
            err.to_string().contains("endpoint 7 has no address"),
            "{err}"
        );
    }
}

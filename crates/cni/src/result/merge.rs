//! Appending this plugin's part of the result to a `prevResult`.
//!
//! The spec requires a plugin given a `prevResult` to output it "with any possible
//! modifications made by that plugin included". This plugin creates its own interfaces, so
//! its interfaces, IPs and routes are appended after the previous ones, with its IPs'
//! `interface` indices shifted past the previous interfaces. DNS settings are united: the
//! previous values first (an earlier plugin's choice wins on order and on `domain`), then this
//! plugin's values not already present.

use super::{CniResult, Dns};

/// Returns `prev` followed by `own`.
pub fn append(prev: CniResult, own: CniResult) -> CniResult {
    let offset = prev.interfaces.len();
    let mut out = prev;
    out.interfaces.extend(own.interfaces);
    out.ips.extend(own.ips.into_iter().map(|mut ip| {
        ip.interface = ip.interface.map(|i| i + offset);
        ip
    }));
    out.routes.extend(own.routes);
    out.dns = unite(out.dns, own.dns);
    out
}

fn unite(prev: Dns, own: Dns) -> Dns {
    fn extend(into: &mut Vec<String>, from: Vec<String>) {
        for item in from {
            if !into.contains(&item) {
                into.push(item);
            }
        }
    }
    let mut out = prev;
    extend(&mut out.nameservers, own.nameservers);
    extend(&mut out.search, own.search);
    extend(&mut out.options, own.options);
    if out.domain.as_deref().is_none_or(str::is_empty) {
        out.domain = own.domain;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::CniResult;
    use crate::version::{CniVersion, SUPPORTED};
    use serde_json::json;

    fn own() -> CniResult {
        CniResult::parse(
            &json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "lxc1234", "mac": "aa:aa:aa:aa:aa:01"},
                    {"name": "eth1", "mac": "aa:aa:aa:aa:aa:02", "sandbox": "/run/netns/p"}
                ],
                "ips": [{"address": "10.0.0.5/32", "gateway": "10.0.0.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
                "dns": {"nameservers": ["10.96.0.10", "1.1.1.1"], "search": ["svc.local"], "domain": "own.local"}
            }),
            CniVersion::V1_1_0,
        )
        .unwrap()
    }

    /// A previous plugin's result in `version`'s shape: a bridge with a pod interface.
    fn prev(version: CniVersion) -> serde_json::Value {
        let mut ip = json!({"interface": 1, "address": "192.168.1.9/24", "gateway": "192.168.1.1"});
        if version.is_legacy_result() {
            ip["version"] = json!("4");
        }
        json!({
            "cniVersion": version.as_str(),
            "interfaces": [
                {"name": "br0", "mac": "bb:bb:bb:bb:bb:01"},
                {"name": "eth0", "mac": "bb:bb:bb:bb:bb:02", "sandbox": "/run/netns/p"}
            ],
            "ips": [ip],
            "routes": [{"dst": "192.168.0.0/16"}],
            "dns": {"nameservers": ["1.1.1.1"], "domain": "prev.local"}
        })
    }

    #[test]
    fn own_part_is_appended_with_indices_shifted_in_every_version() {
        for version in SUPPORTED {
            let prev = CniResult::parse(&prev(version), version).unwrap();
            let merged = append(prev, own()).render(version);
            assert_eq!(merged["cniVersion"], version.as_str());
            let names: Vec<&str> = merged["interfaces"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["br0", "eth0", "lxc1234", "eth1"], "{version}");
            let ips = merged["ips"].as_array().unwrap();
            assert_eq!(ips.len(), 2);
            assert_eq!(ips[0]["interface"], 1, "{version}");
            assert_eq!(ips[1]["interface"], 3, "{version}");
            assert_eq!(ips[1]["address"], "10.0.0.5/32");
            assert_eq!(ips[1].get("version").is_some(), version.is_legacy_result());
            assert_eq!(
                merged["routes"],
                json!([{"dst": "192.168.0.0/16"}, {"dst": "0.0.0.0/0", "gw": "10.0.0.1"}])
            );
            assert_eq!(
                merged["dns"],
                json!({"nameservers": ["1.1.1.1", "10.96.0.10"], "domain": "prev.local", "search": ["svc.local"]})
            );
        }
    }

    #[test]
    fn a_prev_result_of_another_version_is_converted() {
        // A 0.4.0 prevResult under a 1.1.0 configuration, and the other way round.
        let prev = CniResult::parse(&prev(CniVersion::V0_4_0), CniVersion::V1_1_0).unwrap();
        let merged = append(prev, own()).render(CniVersion::V1_1_0);
        assert!(merged["ips"][0].get("version").is_none());
        let prev = CniResult::parse(&prev_1x(), CniVersion::V0_3_1).unwrap();
        let merged = append(prev, own()).render(CniVersion::V0_3_1);
        assert_eq!(merged["ips"][0]["version"], "4");
        assert_eq!(merged["ips"][1]["version"], "4");
    }

    fn prev_1x() -> serde_json::Value {
        prev(CniVersion::V1_0_0)
    }

    #[test]
    fn an_empty_prev_result_leaves_own_part_unchanged() {
        let merged = append(CniResult::default(), own());
        assert_eq!(merged, own());
    }

    #[test]
    fn dns_takes_own_domain_when_prev_has_none() {
        let merged = append(CniResult::default(), own());
        assert_eq!(merged.dns.domain.as_deref(), Some("own.local"));
    }
}

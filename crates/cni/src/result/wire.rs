//! The JSON shapes of the result in each version, read leniently and written exactly.
//!
//! Reading accepts the union of the shapes (a `version` on IPs is read and ignored, since the
//! address says its family; 1.x interface fields are read whatever the version), as the
//! reference library's converters keep every field both shapes share. Writing follows the
//! reference library's output: 0.3.x/0.4.0 put `"version": "4"|"6"` on each IP, drop the
//! interface fields 1.0.0 added, and always write `dns`; 1.x write `dns` only when set.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CniResult, Dns, Interface, IpConfig, Route};
use crate::addr::{Cidr, parse_ip};
use crate::error::{Error, Result};
use crate::version::{CniVersion, supported_list};

#[derive(Deserialize)]
struct InResult {
    #[serde(default)]
    interfaces: Option<Vec<InInterface>>,
    #[serde(default)]
    ips: Option<Vec<InIp>>,
    #[serde(default)]
    routes: Option<Vec<InRoute>>,
    #[serde(default)]
    dns: Option<Dns>,
}

#[derive(Deserialize)]
struct InInterface {
    name: String,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    sandbox: Option<String>,
    #[serde(default, rename = "socketPath")]
    socket_path: Option<String>,
    #[serde(default, rename = "pciID")]
    pci_id: Option<String>,
}

#[derive(Deserialize)]
struct InIp {
    address: String,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct InRoute {
    dst: String,
    #[serde(default)]
    gw: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    advmss: Option<u32>,
    #[serde(default)]
    priority: Option<u32>,
    #[serde(default)]
    table: Option<u32>,
    #[serde(default)]
    scope: Option<u32>,
}

#[derive(Serialize)]
struct OutResult<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<OutInterface<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<OutIp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<OutRoute>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns: Option<&'a Dns>,
}

#[derive(Serialize)]
struct OutInterface<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mac: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<&'a str>,
    #[serde(rename = "socketPath", skip_serializing_if = "Option::is_none")]
    socket_path: Option<&'a str>,
    #[serde(rename = "pciID", skip_serializing_if = "Option::is_none")]
    pci_id: Option<&'a str>,
}

#[derive(Serialize)]
struct OutIp {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
    address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<String>,
}

#[derive(Serialize)]
struct OutRoute {
    dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gw: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    advmss: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<u32>,
}

/// Empty strings mean "unset" in the reference library's `omitempty` fields.
fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

fn optional_ip(what: String, s: Option<String>) -> Result<Option<std::net::IpAddr>, String> {
    non_empty(s)
        .map(|s| parse_ip(&s).map_err(|e| format!("{what}: {e}")))
        .transpose()
}

impl CniResult {
    /// Reads a result (a `prevResult`) written in its own `cniVersion`, or in `config_version`
    /// when it names none (results before 1.0.0 need not carry one).
    pub fn parse(value: &Value, config_version: CniVersion) -> Result<CniResult> {
        let invalid = |version: &str, reason: String| Error::InvalidPrevResult {
            version: version.to_string(),
            reason,
        };
        let Some(obj) = value.as_object() else {
            return Err(invalid(
                config_version.as_str(),
                "it is not a JSON object".into(),
            ));
        };
        let version = match obj.get("cniVersion") {
            None | Some(Value::Null) => config_version,
            Some(Value::String(s)) if s.is_empty() => config_version,
            Some(Value::String(s)) => CniVersion::parse(s).ok_or_else(|| {
                invalid(
                    s,
                    format!(
                        "cellium-cni converts results of versions {}",
                        supported_list()
                    ),
                )
            })?,
            Some(other) => {
                return Err(invalid(
                    config_version.as_str(),
                    format!("its cniVersion is {other}, not a string"),
                ));
            }
        };
        let wire: InResult = serde_json::from_value(value.clone())
            .map_err(|e| invalid(version.as_str(), e.to_string()))?;
        from_wire(wire).map_err(|reason| invalid(version.as_str(), reason))
    }

    /// Writes the result in `version`'s shape.
    pub fn render(&self, version: CniVersion) -> Value {
        let legacy = version.is_legacy_result();
        let out = OutResult {
            cni_version: version.as_str(),
            interfaces: self
                .interfaces
                .iter()
                .map(|i| OutInterface {
                    name: &i.name,
                    mac: i.mac.as_deref(),
                    mtu: i.mtu.filter(|_| !legacy),
                    sandbox: i.sandbox.as_deref(),
                    socket_path: i.socket_path.as_deref().filter(|_| !legacy),
                    pci_id: i.pci_id.as_deref().filter(|_| !legacy),
                })
                .collect(),
            ips: self
                .ips
                .iter()
                .map(|ip| OutIp {
                    version: legacy.then(|| ip.address.family()),
                    interface: ip.interface,
                    address: ip.address.to_string(),
                    gateway: ip.gateway.map(|g| g.to_string()),
                })
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|r| OutRoute {
                    dst: r.dst.to_string(),
                    gw: r.gw.map(|g| g.to_string()),
                    mtu: r.mtu,
                    advmss: r.advmss,
                    priority: r.priority,
                    table: r.table,
                    scope: r.scope,
                })
                .collect(),
            dns: (legacy || !self.dns.is_empty()).then_some(&self.dns),
        };
        // Serializing plain structs of strings and integers into a Value cannot fail.
        serde_json::to_value(out).unwrap_or(Value::Null)
    }
}

fn from_wire(wire: InResult) -> Result<CniResult, String> {
    let interfaces = wire
        .interfaces
        .unwrap_or_default()
        .into_iter()
        .map(|i| Interface {
            name: i.name,
            mac: non_empty(i.mac),
            mtu: i.mtu.filter(|m| *m != 0),
            sandbox: non_empty(i.sandbox),
            socket_path: non_empty(i.socket_path),
            pci_id: non_empty(i.pci_id),
        })
        .collect();
    let ips = wire
        .ips
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(n, ip)| {
            Ok(IpConfig {
                address: Cidr::parse(&ip.address).map_err(|e| format!("ips[{n}].address: {e}"))?,
                gateway: optional_ip(format!("ips[{n}].gateway"), ip.gateway)?,
                interface: ip.interface,
            })
        })
        .collect::<Result<_, String>>()?;
    let routes = wire
        .routes
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(n, r)| {
            Ok(Route {
                dst: Cidr::parse(&r.dst).map_err(|e| format!("routes[{n}].dst: {e}"))?,
                gw: optional_ip(format!("routes[{n}].gw"), r.gw)?,
                mtu: r.mtu,
                advmss: r.advmss,
                priority: r.priority,
                table: r.table,
                scope: r.scope,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(CniResult {
        interfaces,
        ips,
        routes,
        dns: wire.dns.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The spec's bridge example, in 1.x shape.
    fn bridge_1x() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "veth3243", "mac": "55:44:33:22:11:11", "mtu": 1450},
                {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue",
                 "socketPath": "/run/sock", "pciID": "0000:04:00.5"}
            ],
            "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {"nameservers": ["10.1.0.1"]}
        })
    }

    #[test]
    fn a_1x_result_reads_and_writes_back_identically() {
        let r = CniResult::parse(&bridge_1x(), CniVersion::V1_1_0).unwrap();
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.render(CniVersion::V1_0_0), bridge_1x());
    }

    #[test]
    fn writing_0_4_0_adds_ip_versions_drops_1x_fields_and_keeps_dns() {
        let r = CniResult::parse(&bridge_1x(), CniVersion::V1_1_0).unwrap();
        for v in [CniVersion::V0_3_0, CniVersion::V0_3_1, CniVersion::V0_4_0] {
            let out = r.render(v);
            assert_eq!(out["cniVersion"], v.as_str());
            assert_eq!(
                out["ips"],
                json!([{"version": "4", "interface": 2, "address": "10.1.0.5/16", "gateway": "10.1.0.1"}])
            );
            assert_eq!(
                out["interfaces"][1],
                json!({"name": "veth3243", "mac": "55:44:33:22:11:11"})
            );
            assert_eq!(
                out["interfaces"][2],
                json!({"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"})
            );
        }
        // The reference library writes an empty dns object in 0.x and none in 1.x.
        let bare = CniResult::default();
        assert_eq!(bare.render(CniVersion::V0_4_0)["dns"], json!({}));
        assert!(bare.render(CniVersion::V1_1_0).get("dns").is_none());
    }

    #[test]
    fn a_0_3_1_result_reads_into_1x_without_versions() {
        let old = json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/a"}],
            "ips": [
                {"version": "4", "interface": 0, "address": "10.0.0.2/24", "gateway": "10.0.0.1"},
                {"version": "6", "interface": 0, "address": "fd00::2/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
            "dns": {}
        });
        let r = CniResult::parse(&old, CniVersion::V1_1_0).unwrap();
        let out = r.render(CniVersion::V1_1_0);
        assert_eq!(
            out,
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "sandbox": "/run/netns/a"}],
                "ips": [
                    {"interface": 0, "address": "10.0.0.2/24", "gateway": "10.0.0.1"},
                    {"interface": 0, "address": "fd00::2/64"}
                ],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}]
            })
        );
        // Written back as 0.3.1, it is what came in.
        assert_eq!(r.render(CniVersion::V0_3_1), old);
    }

    #[test]
    fn a_result_without_cni_version_is_read_as_the_config_version() {
        let r = CniResult::parse(
            &json!({"ips": [{"version": "4", "address": "10.0.0.2/24"}]}),
            CniVersion::V0_4_0,
        )
        .unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
    }

    #[test]
    fn route_extras_of_1_1_survive() {
        let v = json!({"cniVersion": "1.1.0", "routes": [
            {"dst": "10.0.0.0/8", "gw": "10.0.0.1", "mtu": 1400, "advmss": 1360, "priority": 5, "table": 100, "scope": 0}
        ]});
        let r = CniResult::parse(&v, CniVersion::V1_1_0).unwrap();
        assert_eq!(r.render(CniVersion::V1_1_0), v);
    }

    #[test]
    fn null_lists_are_empty_lists() {
        let r = CniResult::parse(
            &json!({"cniVersion": "1.0.0", "interfaces": null, "ips": null, "routes": null, "dns": null}),
            CniVersion::V1_0_0,
        )
        .unwrap();
        assert_eq!(r, CniResult::default());
    }

    #[test]
    fn bad_prev_results_fail_with_code_6_and_say_where() {
        let cases = [
            (json!([1]), "not a JSON object"),
            (
                json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}}),
                "0.2.0",
            ),
            (json!({"cniVersion": 1}), "not a string"),
            (
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2"}]}),
                "ips[0].address",
            ),
            (
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24", "gateway": "x"}]}),
                "ips[0].gateway",
            ),
            (
                json!({"cniVersion": "1.0.0", "routes": [{"dst": "default"}]}),
                "routes[0].dst",
            ),
            (
                json!({"cniVersion": "1.0.0", "interfaces": [{"mac": "x"}]}),
                "name",
            ),
            (
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24", "interface": -1}]}),
                "invalid value",
            ),
        ];
        for (value, needle) in cases {
            let err = CniResult::parse(&value, CniVersion::V1_0_0).unwrap_err();
            assert_eq!(err.code(), 6, "{value}");
            let msg = err.to_string();
            assert!(msg.contains(needle), "{value}: {msg}");
            assert!(msg.starts_with("prevResult is not a valid CNI"), "{msg}");
        }
    }
}

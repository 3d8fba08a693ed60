//! `discovery.k8s.io/v1 EndpointSlice`: a service's endpoints, checked as the API server does.
//!
//! A slice belongs to the service of its namespace named by its `kubernetes.io/service-name`
//! label, and serves that service's frontends of its family (`addressType: IPv4` or `IPv6`,
//! as kube-proxy reads slices); FQDN slices are refused as not supported. Topology fields
//! (`nodeName`, `zone`, `hints`) and `targetRef` are checked and accepted: a service with
//! `internalTrafficPolicy: Local` takes only the endpoints of this node (`nodeName`), and
//! the zone hints (or, with `trafficDistribution: PreferClose`, the zones) make the
//! endpoints of the node's zone preferred.
//!
//! A slice also keeps the Services it names as owners (`metadata.ownerReferences` of kind
//! `Service`, apiVersion `v1`, with their uids): the endpointslice controller makes the
//! service its owner, and a slice whose owner is a Service of the same name but another uid
//! belongs to a deleted one (the garbage collector is about to delete it), so load balancing
//! leaves it out.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::discovery::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::key::{Object, ObjectKey};
use crate::policy_port::number;
use crate::validate::{self, FieldError};
use crate::{IpFamily, Protocol};

/// The label naming the service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The controller that writes slices for services with selectors (value of the label
/// `endpointslice.kubernetes.io/managed-by`); slices of any other manager, or none, are read
/// alike.
pub const CONTROLLER_MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// At most this many endpoints per slice, as the API server allows.
const MAX_ENDPOINTS: usize = 1000;
/// At most this many ports per slice.
const MAX_PORTS: usize = 100;
/// At most this many addresses per endpoint.
const MAX_ADDRESSES: usize = 100;

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SliceEndpoint {
    /// Its addresses (at least one, of the slice's family); consumers use the first, as
    /// kube-proxy does, since the API defines them as interchangeable.
    pub addresses: Vec<IpAddr>,
    /// `conditions.ready`; absent counts as ready, as the API asks consumers to read it.
    pub ready: bool,
    /// `conditions.serving`: it answers, even if terminating; absent is `ready`, as the API
    /// says.
    pub serving: bool,
    /// `conditions.terminating`; absent is false.
    pub terminating: bool,
    /// `nodeName`: the node it runs on, if the slice says (what `internalTrafficPolicy:
    /// Local` selects by).
    pub node_name: Option<String>,
    /// `zone`: the zone it runs in, if the slice says.
    pub zone: Option<String>,
    /// `hints.forZones[].name`: the zones whose nodes should send it traffic (set by the
    /// endpointslice controller for topology-aware routing); empty without hints.
    pub for_zones: Vec<String>,
}

impl SliceEndpoint {
    /// The address traffic goes to.
    pub fn address(&self) -> IpAddr {
        self.addresses
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

/// One port of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlicePort {
    /// The name of the service port it serves; empty for a service's single unnamed port.
    pub name: String,
    /// The endpoints' port; `None` (allowed by the API) serves no service port.
    pub port: Option<u16>,
    /// The protocol (defaulted to TCP).
    pub protocol: Protocol,
}

impl fmt::Display for SlicePort {
    /// `http 8080/TCP`, `8080/TCP`, or `http -/TCP` without a number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.name.is_empty() {
            write!(f, "{} ", self.name)?;
        }
        match self.port {
            Some(p) => write!(f, "{p}/{}", self.protocol),
            None => write!(f, "-/{}", self.protocol),
        }
    }
}

/// A Service named as a slice's owner (`metadata.ownerReferences`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceOwner {
    /// The service's name (in the slice's namespace).
    pub name: String,
    /// The uid of the service the slice was written for.
    pub uid: String,
}

/// An EndpointSlice with what load balancing reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    /// The namespace (defaulted to `default`).
    pub namespace: String,
    /// The name.
    pub name: String,
    /// The service it belongs to (its `kubernetes.io/service-name` label), in `namespace`.
    pub service: Option<String>,
    /// The Services among its owners (`metadata.ownerReferences` of kind `Service`,
    /// apiVersion `v1`).
    pub service_owners: Vec<ServiceOwner>,
    /// The family of its addresses (`addressType`).
    pub address_type: IpFamily,
    /// Its endpoints.
    pub endpoints: Vec<SliceEndpoint>,
    /// The ports every endpoint serves.
    pub ports: Vec<SlicePort>,
}

impl Object for EndpointSlice {
    const KIND: &'static str = "EndpointSlice";
    fn key(&self) -> ObjectKey {
        ObjectKey::namespaced(&self.namespace, &self.name)
    }
}

impl EndpointSlice {
    /// From the Kubernetes object, checked and defaulted as the API server would.
    pub fn from_k8s(slice: k8s::EndpointSlice) -> Result<EndpointSlice, FieldError> {
        let meta = slice.metadata;
        let name = meta.name.ok_or_else(|| {
            FieldError::new(
                "metadata.name",
                "a name is required (generateName is not supported)",
            )
        })?;
        validate::dns1123_subdomain("metadata.name", &name)?;
        let namespace = meta.namespace.unwrap_or_else(|| "default".to_string());
        validate::dns1123_label("metadata.namespace", &namespace)?;
        let labels = meta.labels.unwrap_or_default();
        validate::labels("metadata.labels", &labels)?;
        let service_owners = service_owners(meta.owner_references.unwrap_or_default())?;
        let address_type = match slice.address_type.as_str() {
            "IPv4" => IpFamily::Ipv4,
            "IPv6" => IpFamily::Ipv6,
            "FQDN" => {
                return Err(FieldError::new(
                    "addressType",
                    "not supported: FQDN endpoint slices (backends must be IP addresses)",
                ));
            }
            other => {
                return Err(FieldError::new(
                    "addressType",
                    format!("unsupported value {other:?} (expected IPv4, IPv6 or FQDN)"),
                ));
            }
        };
        if slice.endpoints.len() > MAX_ENDPOINTS {
            return Err(FieldError::new(
                "endpoints",
                format!("at most {MAX_ENDPOINTS} endpoints are allowed"),
            ));
        }
        let endpoints = slice
            .endpoints
            .into_iter()
            .enumerate()
            .map(|(i, e)| endpoint(&format!("endpoints[{i}]"), address_type, e))
            .collect::<Result<Vec<_>, _>>()?;
        let ports = ports(slice.ports.unwrap_or_default())?;
        Ok(EndpointSlice {
            namespace,
            name,
            service: labels.get(SERVICE_NAME_LABEL).cloned(),
            service_owners,
            address_type,
            endpoints,
            ports,
        })
    }

    /// Whether the slice was written for another Service of `service`'s name than this one:
    /// an owner reference to a Service of that name with another uid. A service whose uid is
    /// not known (applied without one) cannot tell, and keeps every slice.
    pub fn owned_by_another(&self, service: &str, uid: Option<&str>) -> bool {
        uid.is_some_and(|uid| {
            self.service_owners
                .iter()
                .any(|o| o.name == service && o.uid != uid)
        })
    }
}

/// The Services among the owners; every reference must name its owner fully, as the API
/// server requires.
fn service_owners(refs: Vec<OwnerReference>) -> Result<Vec<ServiceOwner>, FieldError> {
    let mut out = Vec::new();
    for (i, r) in refs.into_iter().enumerate() {
        let field = format!("metadata.ownerReferences[{i}]");
        for (name, value) in [
            ("apiVersion", &r.api_version),
            ("kind", &r.kind),
            ("name", &r.name),
            ("uid", &r.uid),
        ] {
            if value.is_empty() {
                return Err(FieldError::new(format!("{field}.{name}"), "required"));
            }
        }
        if r.kind == "Service" && r.api_version == "v1" {
            out.push(ServiceOwner {
                name: r.name,
                uid: r.uid,
            });
        }
    }
    Ok(out)
}

fn endpoint(field: &str, family: IpFamily, e: k8s::Endpoint) -> Result<SliceEndpoint, FieldError> {
    if e.addresses.is_empty() || e.addresses.len() > MAX_ADDRESSES {
        return Err(FieldError::new(
            format!("{field}.addresses"),
            format!("must hold between 1 and {MAX_ADDRESSES} addresses"),
        ));
    }
    let addresses = e
        .addresses
        .iter()
        .enumerate()
        .map(|(j, a)| address(&format!("{field}.addresses[{j}]"), family, a))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(hostname) = &e.hostname {
        validate::dns1123_label(&format!("{field}.hostname"), hostname)?;
    }
    if let Some(node) = &e.node_name {
        validate::dns1123_subdomain(&format!("{field}.nodeName"), node)?;
    }
    let conditions = e.conditions.unwrap_or_default();
    let ready = conditions.ready.unwrap_or(true);
    Ok(SliceEndpoint {
        addresses,
        ready,
        serving: conditions.serving.unwrap_or(ready),
        terminating: conditions.terminating.unwrap_or(false),
        node_name: e.node_name,
        zone: e.zone.filter(|z| !z.is_empty()),
        for_zones: e
            .hints
            .and_then(|h| h.for_zones)
            .unwrap_or_default()
            .into_iter()
            .map(|z| z.name)
            .collect(),
    })
}

/// An address of the slice's family that can be an endpoint: not unspecified, loopback,
/// link-local or link-local multicast, which the API server refuses (they would reach the
/// node itself or nothing).
fn address(field: &str, family: IpFamily, text: &str) -> Result<IpAddr, FieldError> {
    let ip: IpAddr = text
        .parse()
        .map_err(|_| FieldError::new(field, format!("{text:?} is not an {family} address")))?;
    if IpFamily::of(ip) != family {
        return Err(FieldError::new(
            field,
            format!("{text} is not an {family} address (addressType is {family})"),
        ));
    }
    let special = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("an unspecified address"),
        IpAddr::V4(v4) if v4.is_loopback() => Some("a loopback address"),
        IpAddr::V4(v4) if v4.is_link_local() || v4.octets()[..3] == [224, 0, 0] => {
            Some("a link-local address")
        }
        IpAddr::V6(v6) if v6.is_unspecified() => Some("an unspecified address"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("a loopback address"),
        IpAddr::V6(v6)
            if (v6.segments()[0] & 0xffc0) == 0xfe80 || (v6.segments()[0] & 0xff0f) == 0xff02 =>
        {
            Some("a link-local address")
        }
        _ => None,
    };
    match special {
        Some(kind) => Err(FieldError::new(
            field,
            format!("{ip} may not be an endpoint ({kind})"),
        )),
        None => Ok(ip),
    }
}

fn ports(list: Vec<k8s::EndpointPort>) -> Result<Vec<SlicePort>, FieldError> {
    if list.len() > MAX_PORTS {
        return Err(FieldError::new(
            "ports",
            format!("at most {MAX_PORTS} ports are allowed"),
        ));
    }
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, p) in list.into_iter().enumerate() {
        let field = format!("ports[{i}]");
        let name = p.name.unwrap_or_default();
        if !name.is_empty() {
            validate::dns1123_label(&format!("{field}.name"), &name)?;
        }
        if !names.insert(name.clone()) {
            return Err(FieldError::new(
                format!("{field}.name"),
                format!("duplicate port name {name:?}"),
            ));
        }
        let port = p
            .port
            .map(|n| number(&format!("{field}.port"), i64::from(n)))
            .transpose()?;
        let protocol = match p.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(text) => text
                .parse()
                .map_err(|e| FieldError::new(format!("{field}.protocol"), e))?,
        };
        out.push(SlicePort {
            name,
            port,
            protocol,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<EndpointSlice, FieldError> {
        let yaml = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, labels: {{kubernetes.io/service-name: web}}}}\n{body}"
        );
        EndpointSlice::from_k8s(serde_yaml::from_str(&yaml).unwrap())
    }

    #[test]
    fn endpoints_ports_and_readiness() {
        let s = parse(
            "addressType: IPv4\nendpoints:\n- addresses: [10.244.0.5]\n- addresses: [10.244.0.6]\n  conditions: {ready: false}\n- addresses: [10.244.0.7]\n  conditions: {ready: true, serving: true, terminating: false}\n  nodeName: node-1\n  zone: a\n  hints: {forZones: [{name: a}, {name: b}]}\nports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]\n",
        )
        .unwrap();
        assert_eq!(s.namespace, "default");
        assert_eq!(s.service.as_deref(), Some("web"));
        let ready: Vec<_> = s
            .endpoints
            .iter()
            .map(|e| (e.address().to_string(), e.ready))
            .collect();
        assert_eq!(
            ready,
            vec![
                ("10.244.0.5".into(), true),
                ("10.244.0.6".into(), false),
                ("10.244.0.7".into(), true)
            ]
        );
        let ports: Vec<String> = s.ports.iter().map(ToString::to_string).collect();
        assert_eq!(ports, vec!["http 8080/TCP", "dns 53/UDP"]);
        assert_eq!(s.endpoints[2].zone.as_deref(), Some("a"));
        assert_eq!(s.endpoints[2].for_zones, ["a", "b"]);
        assert!(s.endpoints[0].zone.is_none() && s.endpoints[0].for_zones.is_empty());
    }

    #[test]
    fn ip_slices_of_either_family_are_supported() {
        let s = parse("addressType: IPv6\nendpoints: [{addresses: ['fd00:10:244::5']}]\n").unwrap();
        assert_eq!(s.address_type, IpFamily::Ipv6);
        assert_eq!(
            s.endpoints[0].address(),
            "fd00:10:244::5".parse::<IpAddr>().unwrap()
        );
        for bad in ["10.0.0.1", "fe80::1", "ff02::1", "::1", "::"] {
            let e = parse(&format!(
                "addressType: IPv6\nendpoints: [{{addresses: ['{bad}']}}]\n"
            ))
            .unwrap_err();
            assert_eq!(e.field, "endpoints[0].addresses[0]", "{bad}: {e:?}");
        }
        let e = parse("addressType: FQDN\nendpoints: []\n").unwrap_err();
        assert!(e.reason.starts_with("not supported: FQDN"), "{}", e.reason);
        let e = parse("addressType: ipv4\nendpoints: []\n").unwrap_err();
        assert!(e.reason.starts_with("unsupported value"), "{}", e.reason);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            ("endpoints: [{addresses: []}]", "endpoints[0].addresses"),
            (
                "endpoints: [{addresses: ['fd00::1']}]",
                "endpoints[0].addresses[0]",
            ),
            (
                "endpoints: [{addresses: [127.0.0.1]}]",
                "endpoints[0].addresses[0]",
            ),
            (
                "endpoints: [{addresses: [169.254.1.1]}]",
                "endpoints[0].addresses[0]",
            ),
            (
                "endpoints: [{addresses: [10.0.0.1], hostname: A}]",
                "endpoints[0].hostname",
            ),
            (
                "endpoints: []\nports: [{name: a, port: 1}, {name: a, port: 2}]",
                "ports[1].name",
            ),
            ("endpoints: []\nports: [{port: 0}]", "ports[0].port"),
            (
                "endpoints: []\nports: [{name: Http, port: 80}]",
                "ports[0].name",
            ),
            (
                "endpoints: []\nports: [{port: 80, protocol: tcp}]",
                "ports[0].protocol",
            ),
        ];
        for (body, field) in cases {
            let e = parse(&format!("addressType: IPv4\n{body}\n")).unwrap_err();
            assert_eq!(e.field, field, "{body}: {e:?}");
        }
        let e = parse("addressType: IPv4\nendpoints: [{addresses: [0.0.0.0]}]\n").unwrap_err();
        assert_eq!(
            e.reason,
            "0.0.0.0 may not be an endpoint (an unspecified address)"
        );
    }

    #[test]
    fn a_slice_without_the_label_belongs_to_no_service() {
        let yaml = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, namespace: shop}\naddressType: IPv4\nendpoints: []\nports: [{port: 80}]\n";
        let s = EndpointSlice::from_k8s(serde_yaml::from_str(yaml).unwrap()).unwrap();
        assert_eq!((s.service, s.namespace.as_str()), (None, "shop"));
        assert_eq!(s.ports[0].name, "");
    }

    fn owned(owners: &str) -> Result<EndpointSlice, FieldError> {
        let yaml = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, labels: {{kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: {CONTROLLER_MANAGED_BY}}}, ownerReferences: [{owners}]}}\naddressType: IPv4\nendpoints: []\n"
        );
        EndpointSlice::from_k8s(serde_yaml::from_str(&yaml).unwrap())
    }

    #[test]
    fn service_owners_are_kept_and_tell_a_deleted_services_slice() {
        let s = owned(
            "{apiVersion: v1, kind: Service, name: web, uid: u-2, controller: true, blockOwnerDeletion: true}, {apiVersion: apps/v1, kind: Deployment, name: web, uid: d-1}, {apiVersion: v2, kind: Service, name: web, uid: u-9}",
        )
        .unwrap();
        assert_eq!(
            s.service_owners,
            [ServiceOwner {
                name: "web".into(),
                uid: "u-2".into()
            }]
        );
        assert!(!s.owned_by_another("web", Some("u-2")));
        assert!(s.owned_by_another("web", Some("u-1")));
        // A service whose uid is unknown cannot tell; a reference to another name says
        // nothing about this one.
        assert!(!s.owned_by_another("web", None));
        assert!(!s.owned_by_another("api", Some("u-1")));
        assert!(
            parse("addressType: IPv4\nendpoints: []\n")
                .unwrap()
                .service_owners
                .is_empty()
        );
    }

    #[test]
    fn an_owner_reference_must_name_its_owner_fully() {
        for (owners, field) in [
            (
                "{apiVersion: v1, kind: Service, name: web, uid: ''}",
                "metadata.ownerReferences[0].uid",
            ),
            (
                "{apiVersion: v1, kind: Service, name: web, uid: a}, {apiVersion: v1, kind: Service, name: '', uid: b}",
                "metadata.ownerReferences[1].name",
            ),
            (
                "{apiVersion: '', kind: Service, name: web, uid: a}",
                "metadata.ownerReferences[0].apiVersion",
            ),
            (
                "{apiVersion: v1, kind: '', name: web, uid: a}",
                "metadata.ownerReferences[0].kind",
            ),
        ] {
            let e = owned(owners).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.reason.as_str()),
                (field, "required"),
                "{owners}"
            );
        }
    }
}

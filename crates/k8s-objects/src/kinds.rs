//! The kinds `apply` accepts, and how each document becomes a typed object.

use crate::cilium_decode::CiliumPolicyDoc;
use crate::document::{Document, decode};
use crate::key::{Object, ObjectKey};
use crate::service::ServiceDraft;
use crate::validate::FieldError;
use crate::{
    CiliumCidrGroup, CiliumClusterwideNetworkPolicy, CiliumEndpoint, CiliumIdentity,
    CiliumNetworkPolicy, CiliumNode, EndpointSlice, Namespace, NetworkPolicy, Node, Pod, Service,
};

/// A decoded, checked object of a supported kind.
#[derive(Debug, Clone)]
pub enum Parsed {
    /// `v1/Namespace`.
    Namespace(Namespace),
    /// `v1/Pod`.
    Pod(Pod),
    /// `networking.k8s.io/v1/NetworkPolicy`.
    NetworkPolicy(NetworkPolicy),
    /// `cilium.io/v2/CiliumNetworkPolicy`.
    CiliumNetworkPolicy(CiliumNetworkPolicy),
    /// `cilium.io/v2/CiliumClusterwideNetworkPolicy`.
    CiliumClusterwideNetworkPolicy(CiliumClusterwideNetworkPolicy),
    /// `cilium.io/v2/CiliumCIDRGroup` (or `v2alpha1`).
    CiliumCidrGroup(CiliumCidrGroup),
    /// `v1/Service`, its cluster IP not decided yet.
    Service(Box<ServiceDraft>),
    /// `discovery.k8s.io/v1/EndpointSlice`.
    EndpointSlice(EndpointSlice),
    /// `v1/Node`: from the API server only, never applied.
    Node(Node),
    /// `cilium.io/v2/CiliumNode`: from the API server only.
    CiliumNode(CiliumNode),
    /// `cilium.io/v2/CiliumIdentity`: from the API server only.
    CiliumIdentity(CiliumIdentity),
    /// `cilium.io/v2/CiliumEndpoint`: from the API server only.
    CiliumEndpoint(CiliumEndpoint),
}

impl Parsed {
    /// The object's kind, e.g. `Pod`.
    pub fn kind(&self) -> &'static str {
        match self {
            Parsed::Namespace(_) => Namespace::KIND,
            Parsed::Pod(_) => Pod::KIND,
            Parsed::NetworkPolicy(_) => NetworkPolicy::KIND,
            Parsed::CiliumNetworkPolicy(_) => CiliumNetworkPolicy::KIND,
            Parsed::CiliumClusterwideNetworkPolicy(_) => CiliumClusterwideNetworkPolicy::KIND,
            Parsed::CiliumCidrGroup(_) => CiliumCidrGroup::KIND,
            Parsed::Service(_) => Service::KIND,
            Parsed::EndpointSlice(_) => EndpointSlice::KIND,
            Parsed::Node(_) => Node::KIND,
            Parsed::CiliumNode(_) => CiliumNode::KIND,
            Parsed::CiliumIdentity(_) => CiliumIdentity::KIND,
            Parsed::CiliumEndpoint(_) => CiliumEndpoint::KIND,
        }
    }

    /// The object's key.
    pub fn key(&self) -> ObjectKey {
        match self {
            Parsed::Namespace(o) => o.key(),
            Parsed::Pod(o) => o.key(),
            Parsed::NetworkPolicy(o) => o.key(),
            Parsed::CiliumNetworkPolicy(o) => o.key(),
            Parsed::CiliumClusterwideNetworkPolicy(o) => o.key(),
            Parsed::CiliumCidrGroup(o) => o.key(),
            Parsed::Service(d) => d.service.key(),
            Parsed::EndpointSlice(o) => o.key(),
            Parsed::Node(o) => o.key(),
            Parsed::CiliumNode(o) => o.key(),
            Parsed::CiliumIdentity(o) => o.key(),
            Parsed::CiliumEndpoint(o) => o.key(),
        }
    }

    /// The namespace the object lives in, for namespaced kinds.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Parsed::Namespace(_)
            | Parsed::CiliumClusterwideNetworkPolicy(_)
            | Parsed::CiliumCidrGroup(_)
            | Parsed::Node(_)
            | Parsed::CiliumNode(_)
            | Parsed::CiliumIdentity(_) => None,
            Parsed::CiliumEndpoint(e) => Some(&e.namespace),
            Parsed::Pod(p) => Some(&p.namespace),
            Parsed::NetworkPolicy(p) => Some(&p.namespace),
            Parsed::CiliumNetworkPolicy(p) => Some(&p.namespace),
            Parsed::Service(d) => Some(&d.service.namespace),
            Parsed::EndpointSlice(s) => Some(&s.namespace),
        }
    }
}

/// The kinds accepted, as `apiVersion/kind`.
pub const SUPPORTED: &[&str] = &[
    "v1/Namespace",
    "v1/Pod",
    "networking.k8s.io/v1/NetworkPolicy",
    "cilium.io/v2/CiliumNetworkPolicy",
    "cilium.io/v2/CiliumClusterwideNetworkPolicy",
    "cilium.io/v2/CiliumCIDRGroup",
    "cilium.io/v2alpha1/CiliumCIDRGroup",
    "v1/Service",
    "discovery.k8s.io/v1/EndpointSlice",
];

/// Decodes and checks one document.
pub fn parse(doc: &Document) -> Result<Parsed, FieldError> {
    match (doc.api_version.as_str(), doc.kind.as_str()) {
        ("v1", "Namespace") => {
            Namespace::from_k8s(decode(doc.value.clone())?).map(Parsed::Namespace)
        }
        ("v1", "Pod") => Pod::from_k8s(decode(doc.value.clone())?).map(Parsed::Pod),
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            NetworkPolicy::from_k8s(decode(doc.value.clone())?).map(Parsed::NetworkPolicy)
        }
        ("cilium.io/v2", "CiliumNetworkPolicy") => decode::<CiliumPolicyDoc>(doc.value.clone())?
            .into_policy(false)
            .map(|p| Parsed::CiliumNetworkPolicy(CiliumNetworkPolicy(p))),
        ("cilium.io/v2", "CiliumClusterwideNetworkPolicy") => {
            decode::<CiliumPolicyDoc>(doc.value.clone())?
                .into_policy(true)
                .map(|p| Parsed::CiliumClusterwideNetworkPolicy(CiliumClusterwideNetworkPolicy(p)))
        }
        (version, "CiliumCIDRGroup") if crate::CIDR_GROUP_VERSIONS.contains(&version) => {
            CiliumCidrGroup::from_doc(doc.value.clone()).map(Parsed::CiliumCidrGroup)
        }
        ("v1", "Service") => {
            Service::from_k8s(decode(doc.value.clone())?).map(|d| Parsed::Service(Box::new(d)))
        }
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            EndpointSlice::from_k8s(decode(doc.value.clone())?).map(Parsed::EndpointSlice)
        }
        _ => Err(unsupported(doc)),
    }
}

/// Checks that a document names an object of a supported kind (for delete, which needs
/// no more than the kind and the name); returns the kind.
pub fn check_kind(doc: &Document) -> Result<&'static str, FieldError> {
    let key = format!("{}/{}", doc.api_version, doc.kind);
    SUPPORTED
        .iter()
        .find(|s| **s == key)
        .and_then(|s| s.rsplit('/').next())
        .ok_or_else(|| unsupported(doc))
}

/// Whether objects of the document's kind live in a namespace.
pub fn namespaced(doc: &Document) -> bool {
    !matches!(
        doc.kind.as_str(),
        "Namespace" | "CiliumClusterwideNetworkPolicy" | "CiliumCIDRGroup"
    )
}

fn unsupported(doc: &Document) -> FieldError {
    FieldError::new(
        "kind",
        format!(
            "unsupported kind {}/{} (supported: {})",
            doc.api_version,
            doc.kind,
            SUPPORTED.join(", ")
        ),
    )
}

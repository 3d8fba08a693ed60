//! The kinds the server knows: one table row per kind.

/// One registered resource: everything routing, discovery and the store need about a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// API group, empty for core (`""`, `"cilium.io"`).
    pub group: &'static str,
    /// API version (`"v1"`, `"v2"`).
    pub version: &'static str,
    /// Plural resource name used in URLs (`"pods"`).
    pub resource: &'static str,
    /// Singular name for discovery (`"pod"`).
    pub singular: &'static str,
    /// The object's `kind` (`"Pod"`).
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether a `/status` subresource exists: then the main PUT keeps the stored status.
    pub status: bool,
    /// kubectl short names (`["po"]`).
    pub short_names: &'static [&'static str],
}

impl Kind {
    /// `apiVersion` as objects carry it: `v1` for core, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource name qualified by group, as `Status.details` and messages print it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

// A table row reads best as one positional line per kind.
#[allow(clippy::too_many_arguments)]
const fn row(
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    short_names: &'static [&'static str],
) -> Kind {
    Kind {
        group,
        version,
        resource,
        singular,
        kind,
        namespaced,
        status,
        short_names,
    }
}

/// Every kind the server serves. Registering a kind is adding a row here.
// CiliumEndpoint has no status subresource in Cilium: its `status` is written with the object.
pub const KINDS: &[Kind] = &[
    row(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        true,
        &["ns"],
    ),
    row("", "v1", "pods", "pod", "Pod", true, true, &["po"]),
    row(
        "",
        "v1",
        "services",
        "service",
        "Service",
        true,
        true,
        &["svc"],
    ),
    row("", "v1", "nodes", "node", "Node", false, true, &["no"]),
    row(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        false,
        &["sa"],
    ),
    row(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        false,
        &["cm"],
    ),
    row(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
        false,
        &[],
    ),
    row(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        true,
        false,
        &["netpol"],
    ),
    row(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        false,
        &[],
    ),
    // What a cluster admin applies to deploy a component: its workloads, its RBAC, its CRDs.
    // They are stored and served; no controller runs them (no pods come of a DaemonSet, a
    // CRD registers no kind: the Cilium kinds below are built in).
    row(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        true,
        &["ds"],
    ),
    row(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        true,
        &["deploy"],
    ),
    row(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        false,
        &[],
    ),
    row(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        false,
        &[],
    ),
    row(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
        false,
        &[],
    ),
    row(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        false,
        &[],
    ),
    row(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        true,
        &["crd", "crds"],
    ),
    row(
        "cilium.io",
        "v2",
        "ciliumnetworkpolicies",
        "ciliumnetworkpolicy",
        "CiliumNetworkPolicy",
        true,
        true,
        &["cnp", "ciliumnp"],
    ),
    row(
        "cilium.io",
        "v2",
        "ciliumclusterwidenetworkpolicies",
        "ciliumclusterwidenetworkpolicy",
        "CiliumClusterwideNetworkPolicy",
        false,
        true,
        &["ccnp"],
    ),
    row(
        "cilium.io",
        "v2alpha1",
        "ciliumcidrgroups",
        "ciliumcidrgroup",
        "CiliumCIDRGroup",
        false,
        true,
        &["ccg"],
    ),
    row(
        "cilium.io",
        "v2",
        "ciliumnodes",
        "ciliumnode",
        "CiliumNode",
        false,
        true,
        &["cn", "ciliumn"],
    ),
    row(
        "cilium.io",
        "v2",
        "ciliumidentities",
        "ciliumidentity",
        "CiliumIdentity",
        false,
        false,
        &["ciliumid"],
    ),
    row(
        "cilium.io",
        "v2",
        "ciliumendpoints",
        "ciliumendpoint",
        "CiliumEndpoint",
        true,
        false,
        &["cep", "ciliumep"],
    ),
];

/// The kind served at `group/version/resource`, if registered.
pub fn by_resource(group: &str, version: &str, resource: &str) -> Option<usize> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.resource == resource)
}

/// The kind of an object with this `apiVersion` and `kind`, if registered.
pub fn by_kind(api_version: &str, kind: &str) -> Option<usize> {
    let (group, version) = split_api_version(api_version);
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.kind == kind)
}

/// Splits `group/version` (or core `v1`) into group and version.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// The API groups served (core excluded), each with its versions, in table order.
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut groups: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for k in KINDS.iter().filter(|k| !k.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == k.group) {
            Some((_, versions)) if !versions.contains(&k.version) => versions.push(k.version),
            Some(_) => {}
            None => groups.push((k.group, vec![k.version])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        let pods = by_resource("", "v1", "pods").unwrap();
        assert_eq!(by_kind("v1", "Pod"), Some(pods));
        let cnp = by_kind("cilium.io/v2", "CiliumNetworkPolicy").unwrap();
        assert_eq!(KINDS[cnp].api_version(), "cilium.io/v2");
        assert_eq!(KINDS[cnp].qualified(), "ciliumnetworkpolicies.cilium.io");
        assert!(by_kind("v1", "Endpoints").is_none());
    }

    #[test]
    fn groups_are_listed_once() {
        let groups = groups();
        assert_eq!(groups.iter().filter(|(g, _)| *g == "cilium.io").count(), 1);
        assert!(
            groups
                .iter()
                .any(|(g, v)| *g == "coordination.k8s.io" && v == &["v1"])
        );
    }
}

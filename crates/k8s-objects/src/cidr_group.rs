//! `CiliumCIDRGroup`: a named, cluster-scoped list of external prefixes that Cilium policies
//! reference from `fromCIDRSet` / `toCIDRSet` (`cidrGroupRef`, `cidrGroupSelector`).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml::Value;

use crate::document::decode;
use crate::key::{Object, ObjectKey};
use crate::policy_port::parse_cidr;
use crate::validate::{self, FieldError};

/// The API versions the kind is served at: `v2alpha1` (Cilium up to 1.17) and `v2` (1.18).
pub const CIDR_GROUP_VERSIONS: [&str; 2] = ["cilium.io/v2alpha1", "cilium.io/v2"];

/// A CIDR group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumCidrGroup {
    /// The name (what `cidrGroupRef` names).
    pub name: String,
    /// Its labels (what `cidrGroupSelector` selects by).
    pub labels: BTreeMap<String, String>,
    /// `spec.externalCIDRs`, host bits cleared, in order, without duplicates.
    pub cidrs: Vec<IpNet>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    // `apiVersion` and `kind` were checked by the caller; declared so they are known fields.
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Spec>,
    #[serde(default, rename = "status")]
    _status: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Spec {
    #[serde(default, rename = "externalCIDRs")]
    external_cidrs: Option<Vec<String>>,
}

impl CiliumCidrGroup {
    /// Decodes and checks a document (`apiVersion` and `kind` included), strictly: a field
    /// this version does not know changes what policies allow, so it is an error.
    pub fn from_doc(value: Value) -> Result<CiliumCidrGroup, FieldError> {
        let doc: Doc = decode(value)?;
        let meta = doc.metadata;
        let name = meta
            .name
            .ok_or_else(|| FieldError::new("metadata.name", "a name is required"))?;
        validate::dns1123_subdomain("metadata.name", &name)?;
        if meta.namespace.is_some() {
            return Err(FieldError::new(
                "metadata.namespace",
                "a CiliumCIDRGroup is cluster-scoped and takes no namespace",
            ));
        }
        let labels = meta.labels.unwrap_or_default();
        validate::labels("metadata.labels", &labels)?;
        let spec = doc
            .spec
            .ok_or_else(|| FieldError::new("spec", "is required"))?;
        let texts = spec
            .external_cidrs
            .ok_or_else(|| FieldError::new("spec.externalCIDRs", "is required"))?;
        let mut cidrs = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let cidr = parse_cidr(&format!("spec.externalCIDRs[{i}]"), text, false)?;
            if !cidrs.contains(&cidr) {
                cidrs.push(cidr);
            }
        }
        Ok(CiliumCidrGroup {
            name,
            labels,
            cidrs,
        })
    }
}

impl Object for CiliumCidrGroup {
    const KIND: &'static str = "CiliumCIDRGroup";
    fn key(&self) -> ObjectKey {
        ObjectKey::cluster(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<CiliumCidrGroup, FieldError> {
        let yaml = format!("apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\n{body}");
        CiliumCidrGroup::from_doc(serde_yaml::from_str(&yaml).unwrap())
    }

    #[test]
    fn a_group_decodes_with_its_labels_and_prefixes() {
        let g = parse(
            "metadata: {name: vpn, labels: {role: vpn}}\nspec: {externalCIDRs: [10.48.0.0/24, 10.16.0.1/24, 10.48.0.0/24, '2001:db8::/64']}",
        )
        .unwrap();
        assert_eq!(g.key(), ObjectKey::cluster("vpn"));
        assert_eq!(g.labels["role"], "vpn");
        let cidrs: Vec<String> = g.cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.48.0.0/24", "10.16.0.0/24", "2001:db8::/64"]);
    }

    #[test]
    fn errors_name_their_field() {
        let cases = [
            (
                "metadata: {name: g}\nspec: {externalCIDRs: [10.0.0.0/33]}",
                "spec.externalCIDRs[0]",
            ),
            (
                "metadata: {name: g}\nspec: {externalCIDRs: [10.0.0.1]}",
                "spec.externalCIDRs[0]",
            ),
            ("metadata: {name: g}\nspec: {}", "spec.externalCIDRs"),
            ("metadata: {name: g}", "spec"),
            (
                "metadata: {name: g, namespace: x}\nspec: {externalCIDRs: []}",
                "metadata.namespace",
            ),
            (
                "metadata: {name: g}\nspec: {externalCidrs: []}",
                "spec.externalCidrs",
            ),
            (
                "metadata: {name: G}\nspec: {externalCIDRs: []}",
                "metadata.name",
            ),
        ];
        for (body, field) in cases {
            let err = parse(body).unwrap_err();
            assert_eq!(err.field, field, "{body}: {}", err.reason);
        }
    }
}

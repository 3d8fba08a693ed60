//! A service's families and cluster IPs, decided as the API server decides them.
//!
//! The families (`ipFamilies`, `ipFamilyPolicy`) are defaulted from what the document gives and
//! what the cluster has (the `service-cidr` ranges: one or one per family, the first being the
//! default family), as the API server's `initIPFamilyFields` does:
//!
//! - two families or two cluster IPs without a policy make `RequireDualStack`; the family of
//!   every given address is added (and must match `ipFamilies` where it is given);
//! - a headless service without a selector (its endpoints may be of any family) defaults to
//!   `RequireDualStack` and gets the other family with a dual-stack policy, whatever the
//!   cluster has;
//! - otherwise the policy defaults to `SingleStack` (which two families contradict); no family
//!   means the default one; `RequireDualStack`, or `PreferDualStack` on a dual-stack cluster,
//!   adds the other family; `RequireDualStack` on a single-stack cluster is refused, and so is a
//!   family the cluster has no range of.
//!
//! Then one address per family: the one the document gives (inside that family's range, held
//! by no other service), or the one the service already has, or one allocated. On an update
//! what the document leaves out is kept; the first family and its address are immutable, a
//! second family may be added (with `PreferDualStack` or `RequireDualStack`) or removed (with
//! `SingleStack`, `ipFamilies` and `clusterIPs` trimmed to the first), as the API server
//! allows.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_yaml::Value;

use crate::resources::Resources;
use crate::service_ip::ServiceRanges;
use cellium_k8s_objects::service::{RequestedIp, ServiceDraft};
use cellium_k8s_objects::validate::FieldError;
use cellium_k8s_objects::{ClusterIp, IpFamily, IpFamilyPolicy};
use cellium_k8s_objects::{Object, ObjectKey};

/// What is decided for a service: what the table, or an earlier document of the same text,
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) cluster_ip: ClusterIp,
    pub(crate) cluster_ips: Vec<IpAddr>,
    pub(crate) families: Vec<IpFamily>,
    pub(crate) policy: IpFamilyPolicy,
}

impl Resources {
    /// Decides a service's families and cluster IPs (see the module docs) and writes them into
    /// the document, so that the recorded object brings the same ones back after a restart.
    /// `claims` holds the decisions for the text's earlier documents, `used` every address
    /// held (by the table's services and those claims); `restoring` accepts a recorded address
    /// outside a range that has changed since, with a warning, rather than losing the service.
    pub(crate) fn settle_cluster_ips(
        &self,
        draft: &mut ServiceDraft,
        value: &mut Value,
        claims: &mut BTreeMap<ObjectKey, Settled>,
        used: &mut BTreeMap<IpAddr, ObjectKey>,
        restoring: bool,
    ) -> Result<(), FieldError> {
        let key = draft.service.key();
        let current = claims.get(&key).cloned().or_else(|| {
            self.services.get(&key).map(|s| Settled {
                cluster_ip: s.cluster_ip,
                cluster_ips: s.cluster_ips.clone(),
                families: s.ip_families.clone(),
                policy: s.ip_family_policy,
            })
        });
        let (families, policy) =
            default_families(draft, current.as_ref(), &self.service_ranges, restoring)?;
        // Headless as asked, or as it is when the document leaves the address out.
        let headless = match (&draft.requested, &current) {
            (RequestedIp::Headless, _) => true,
            (RequestedIp::Unset, Some(c)) => c.cluster_ip == ClusterIp::Headless,
            _ => false,
        };
        let settled = if headless {
            if let Some(c) = &current
                && c.cluster_ip != ClusterIp::Headless
            {
                return Err(immutable("spec.clusterIP", c.cluster_ip));
            }
            Settled {
                cluster_ip: ClusterIp::Headless,
                cluster_ips: Vec::new(),
                families,
                policy,
            }
        } else {
            let ips = self.addresses(&key, draft, current.as_ref(), &families, used, restoring)?;
            Settled {
                cluster_ip: ClusterIp::Address(ips[0]),
                cluster_ips: ips,
                families,
                policy,
            }
        };
        for ip in &settled.cluster_ips {
            used.insert(*ip, key.clone());
        }
        let service = &mut draft.service;
        service.cluster_ip = settled.cluster_ip;
        service.cluster_ips = settled.cluster_ips.clone();
        service.ip_families = settled.families.clone();
        service.ip_family_policy = settled.policy;
        record(value, &settled);
        claims.insert(key, settled);
        Ok(())
    }

    /// One address per family: given, kept or allocated.
    fn addresses(
        &self,
        key: &ObjectKey,
        draft: &ServiceDraft,
        current: Option<&Settled>,
        families: &[IpFamily],
        used: &BTreeMap<IpAddr, ObjectKey>,
        restoring: bool,
    ) -> Result<Vec<IpAddr>, FieldError> {
        let given: &[IpAddr] = match &draft.requested {
            RequestedIp::Addresses(list) => list,
            _ => &[],
        };
        if let Some(c) = current
            && c.cluster_ip == ClusterIp::Headless
        {
            return Err(immutable("spec.clusterIP", c.cluster_ip));
        }
        let mut out = Vec::with_capacity(families.len());
        for (i, family) in families.iter().enumerate() {
            let field = if i == 0 {
                "spec.clusterIP".to_string()
            } else {
                format!("spec.clusterIPs[{i}]")
            };
            let have = current.and_then(|c| {
                c.cluster_ips
                    .iter()
                    .copied()
                    .find(|ip| IpFamily::of(*ip) == *family)
            });
            let ip = match (given.get(i).copied(), have) {
                (Some(want), Some(have)) if want != have => {
                    return Err(immutable(&field, ClusterIp::Address(have)));
                }
                (_, Some(have)) => have,
                (Some(want), None) => self.check_given(&field, key, want, used, restoring)?,
                (None, None) => self.allocate(&field, *family, used)?,
            };
            out.push(ip);
        }
        // The first family's address never changes.
        if let Some(first) = current.and_then(|c| c.cluster_ips.first())
            && out.first() != Some(first)
        {
            return Err(immutable("spec.clusterIP", ClusterIp::Address(*first)));
        }
        Ok(out)
    }

    fn check_given(
        &self,
        field: &str,
        key: &ObjectKey,
        ip: IpAddr,
        used: &BTreeMap<IpAddr, ObjectKey>,
        restoring: bool,
    ) -> Result<IpAddr, FieldError> {
        let range = self.service_ranges.get(IpFamily::of(ip));
        if !range.is_some_and(|r| r.contains(ip)) {
            let cidrs = self.service_ranges.cidrs();
            if !restoring {
                return Err(FieldError::new(
                    field,
                    format!(
                        "{ip} is not in the service range of its family ({}; service-cidr, without the addresses that are never handed out)",
                        list(&cidrs)
                    ),
                ));
            }
            tracing::warn!(service = %key, %ip, ranges = %list(&cidrs), "a recorded cluster IP is outside the service ranges; kept, as the API server keeps it");
        }
        if let Some(holder) = used.get(&ip)
            && holder != key
        {
            return Err(FieldError::new(
                field,
                format!("{ip} is already allocated to service {holder}"),
            ));
        }
        Ok(ip)
    }

    fn allocate(
        &self,
        field: &str,
        family: IpFamily,
        used: &BTreeMap<IpAddr, ObjectKey>,
    ) -> Result<IpAddr, FieldError> {
        let range = self.service_ranges.get(family).ok_or_else(|| {
            FieldError::new(field, format!("the cluster has no {family} service range"))
        })?;
        range.allocate(|ip| used.contains_key(&ip)).ok_or_else(|| {
            FieldError::new(
                field,
                format!(
                    "no address left to allocate in the service range {}",
                    range.cidr()
                ),
            )
        })
    }

    /// The cluster IPs the table's services hold, with their holders.
    pub(crate) fn cluster_ips_in_use(&self) -> BTreeMap<IpAddr, ObjectKey> {
        self.services
            .list()
            .iter()
            .flat_map(|svc| svc.cluster_ips.iter().map(move |ip| (*ip, svc.key())))
            .collect()
    }
}

fn list(cidrs: &[ipnet::IpNet]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn immutable(field: &str, current: ClusterIp) -> FieldError {
    FieldError::new(
        field,
        format!(
            "field is immutable: the service has {current} (delete the service and create it again to change it)"
        ),
    )
}

/// The service's families and policy, defaulted as the API server does (see the module
/// docs); on an update what the document leaves out is the current service's. `restoring`
/// keeps a recorded family the ranges no longer have (`service-cidr` changed since), with a
/// warning, as the API server keeps stored services, rather than losing the service.
pub(crate) fn default_families(
    draft: &ServiceDraft,
    current: Option<&Settled>,
    ranges: &ServiceRanges,
    restoring: bool,
) -> Result<(Vec<IpFamily>, IpFamilyPolicy), FieldError> {
    let given: &[IpAddr] = match &draft.requested {
        RequestedIp::Addresses(list) => list,
        _ => &[],
    };
    let mut families = draft.families.clone();
    let mut policy = draft.policy;
    if let Some(c) = current {
        if families.is_empty() && given.len() <= c.families.len() {
            families.clone_from(&c.families);
        }
        policy = policy.or(Some(c.policy));
        if families
            .first()
            .is_some_and(|f| c.families.first() != Some(f))
        {
            return Err(FieldError::new(
                "spec.ipFamilies[0]",
                format!(
                    "the first family is immutable: the service has {}",
                    c.families
                        .first()
                        .map_or("none".into(), ToString::to_string)
                ),
            ));
        }
    }
    if policy.is_none() && (families.len() == 2 || given.len() == 2) {
        policy = Some(IpFamilyPolicy::RequireDualStack);
    }
    for (i, ip) in given.iter().enumerate() {
        let family = IpFamily::of(*ip);
        match families.get(i) {
            Some(f) if *f != family => {
                return Err(FieldError::new(
                    format!("spec.ipFamilies[{i}]"),
                    format!("{f} does not match spec.clusterIPs[{i}] ({ip})"),
                ));
            }
            Some(_) => {}
            None => families.push(family),
        }
    }
    let dual = |p: Option<IpFamilyPolicy>| {
        matches!(
            p,
            Some(IpFamilyPolicy::PreferDualStack | IpFamilyPolicy::RequireDualStack)
        )
    };
    if draft.requested == RequestedIp::Headless && draft.service.selector.is_empty() {
        // Its endpoint slices may be of any family, whatever the cluster's ranges.
        if families.is_empty() {
            families.push(ranges.primary());
        }
        let policy = policy.unwrap_or(IpFamilyPolicy::RequireDualStack);
        if dual(Some(policy)) && families.len() == 1 {
            families.push(families[0].other());
        }
        return Ok((families, policy));
    }
    let policy = policy.unwrap_or(IpFamilyPolicy::SingleStack);
    if policy == IpFamilyPolicy::SingleStack && families.len() == 2 {
        return Err(FieldError::new(
            "spec.ipFamilyPolicy",
            "must be PreferDualStack or RequireDualStack when two families or addresses are given",
        ));
    }
    let key = draft.service.key();
    if policy == IpFamilyPolicy::RequireDualStack && !ranges.dual_stack() && restoring {
        tracing::warn!(service = %key, "a recorded dual-stack service on a cluster with one service range; kept");
    } else if policy == IpFamilyPolicy::RequireDualStack && !ranges.dual_stack() {
        return Err(FieldError::new(
            "spec.ipFamilyPolicy",
            format!(
                "RequireDualStack: the cluster is not configured for dual-stack services (service-cidr has a range of {} only)",
                ranges.primary()
            ),
        ));
    }
    if families.is_empty() {
        families.push(ranges.primary());
    }
    let wants_both = policy == IpFamilyPolicy::RequireDualStack
        || (policy == IpFamilyPolicy::PreferDualStack && ranges.dual_stack());
    if wants_both && families.len() == 1 {
        families.push(families[0].other());
    }
    for (i, family) in families.iter().enumerate() {
        if ranges.get(*family).is_none() && restoring {
            tracing::warn!(service = %key, %family, "a recorded service of a family service-cidr no longer has; kept");
        } else if ranges.get(*family).is_none() {
            return Err(FieldError::new(
                format!("spec.ipFamilies[{i}]"),
                format!(
                    "{family} is not configured on this cluster (service-cidr has no {family} range)"
                ),
            ));
        }
    }
    Ok((families, policy))
}

/// Writes the decision into the document: `clusterIP`, `clusterIPs`, `ipFamilies` and
/// `ipFamilyPolicy`, as the API server returns them.
fn record(value: &mut Value, settled: &Settled) {
    let Some(root) = value.as_mapping_mut() else {
        return;
    };
    let spec = root
        .entry("spec".into())
        .or_insert_with(|| Value::Mapping(Default::default()));
    let Some(spec) = spec.as_mapping_mut() else {
        return;
    };
    let text = |s: String| Value::String(s);
    spec.insert("clusterIP".into(), text(settled.cluster_ip.to_string()));
    let ips: Vec<Value> = match settled.cluster_ip {
        ClusterIp::Headless => vec![text("None".into())],
        ClusterIp::Address(_) => settled
            .cluster_ips
            .iter()
            .map(|ip| text(ip.to_string()))
            .collect(),
    };
    spec.insert("clusterIPs".into(), Value::Sequence(ips));
    spec.insert(
        "ipFamilies".into(),
        Value::Sequence(
            settled
                .families
                .iter()
                .map(|f| text(f.to_string()))
                .collect(),
        ),
    );
    spec.insert("ipFamilyPolicy".into(), text(settled.policy.to_string()));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Service;

    fn resources(cidrs: &[&str]) -> Arc<Resources> {
        let cidrs: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        Resources::with_service_cidr(&cidrs).unwrap()
    }

    fn apply(r: &Resources, spec: &str) -> Result<Arc<Service>, String> {
        let yaml =
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {spec}\n");
        r.apply("svc.yaml", &yaml).map_err(|e| e.to_string())?;
        Ok(r.services
            .get(&ObjectKey::namespaced("default", "web"))
            .expect("stored"))
    }

    /// `families policy ips`, as the API server would return them.
    fn shape(s: &Service) -> String {
        let families: Vec<String> = s.ip_families.iter().map(ToString::to_string).collect();
        let ips: Vec<String> = s.cluster_ips.iter().map(ToString::to_string).collect();
        format!(
            "{} {} {}",
            families.join(","),
            s.ip_family_policy,
            if ips.is_empty() {
                "-".into()
            } else {
                ips.join(",")
            }
        )
    }

    const DUAL: [&str; 2] = ["10.96.0.0/24", "fd00:96::/120"];
    const PORTS: &str = "ports: [{port: 80}]";

    #[test]
    fn families_default_as_the_api_server_on_a_dual_stack_cluster() {
        let cases = [
            ("{selector: {a: b}, PORTS}", "IPv4 SingleStack 10.96.0.17"),
            (
                "{ipFamilyPolicy: PreferDualStack, PORTS}",
                "IPv4,IPv6 PreferDualStack 10.96.0.17,fd00:96::11",
            ),
            (
                "{ipFamilyPolicy: RequireDualStack, PORTS}",
                "IPv4,IPv6 RequireDualStack 10.96.0.17,fd00:96::11",
            ),
            (
                "{ipFamilies: [IPv6], PORTS}",
                "IPv6 SingleStack fd00:96::11",
            ),
            (
                "{ipFamilies: [IPv6, IPv4], PORTS}",
                "IPv6,IPv4 RequireDualStack fd00:96::11,10.96.0.17",
            ),
            (
                "{clusterIPs: [10.96.0.5, 'fd00:96::5'], PORTS}",
                "IPv4,IPv6 RequireDualStack 10.96.0.5,fd00:96::5",
            ),
            (
                "{clusterIP: 'fd00:96::5', ipFamilyPolicy: PreferDualStack, PORTS}",
                "IPv6,IPv4 PreferDualStack fd00:96::5,10.96.0.17",
            ),
            ("{clusterIP: None}", "IPv4,IPv6 RequireDualStack -"),
            ("{clusterIP: None, selector: {a: b}}", "IPv4 SingleStack -"),
        ];
        for (spec, want) in cases {
            let r = resources(&DUAL);
            let svc =
                apply(&r, &spec.replace("PORTS", PORTS)).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(shape(&svc), want, "{spec}");
            assert_eq!(svc.vips(), svc.cluster_ips.as_slice());
        }
    }

    #[test]
    fn what_the_cluster_cannot_give_is_refused_naming_the_field() {
        let single = ["10.96.0.0/24"];
        let cases: [(&[&str], &str, &str); 6] = [
            (
                &single,
                "{ipFamilyPolicy: RequireDualStack, PORTS}",
                "spec.ipFamilyPolicy: RequireDualStack: the cluster is not configured for dual-stack services",
            ),
            (
                &single,
                "{ipFamilies: [IPv6], PORTS}",
                "spec.ipFamilies[0]: IPv6 is not configured on this cluster",
            ),
            (
                &single,
                "{clusterIP: 'fd00:96::5', PORTS}",
                "spec.ipFamilies[0]: IPv6 is not configured",
            ),
            (
                &DUAL,
                "{ipFamilies: [IPv4, IPv6], ipFamilyPolicy: SingleStack, PORTS}",
                "spec.ipFamilyPolicy: must be PreferDualStack or RequireDualStack",
            ),
            (
                &DUAL,
                "{ipFamilies: [IPv6], clusterIP: 10.96.0.5, PORTS}",
                "spec.ipFamilies[0]: IPv6 does not match spec.clusterIPs[0] (10.96.0.5)",
            ),
            (
                &DUAL,
                "{clusterIPs: [10.96.0.5, 'fd00:97::5'], PORTS}",
                "spec.clusterIPs[1]: fd00:97::5 is not in the service range of its family",
            ),
        ];
        for (cidrs, spec, want) in cases {
            let r = resources(cidrs);
            let err = apply(&r, &spec.replace("PORTS", PORTS)).unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
            assert!(r.services.list().is_empty(), "{spec}: nothing changes");
        }
        // PreferDualStack on a single-stack cluster is one family, as asked.
        let r = resources(&single);
        let svc = apply(&r, "{ipFamilyPolicy: PreferDualStack, ports: [{port: 80}]}").unwrap();
        assert_eq!(shape(&svc), "IPv4 PreferDualStack 10.96.0.17");
    }

    #[test]
    fn a_second_family_comes_and_goes_and_the_first_stays() {
        let r = resources(&DUAL);
        let svc = apply(&r, "{ports: [{port: 80}]}").unwrap();
        assert_eq!(shape(&svc), "IPv4 SingleStack 10.96.0.17");
        // The same document again keeps everything.
        let svc = apply(&r, "{ports: [{port: 80}]}").unwrap();
        assert_eq!(shape(&svc), "IPv4 SingleStack 10.96.0.17");
        let svc = apply(&r, "{ipFamilyPolicy: PreferDualStack, ports: [{port: 80}]}").unwrap();
        assert_eq!(
            shape(&svc),
            "IPv4,IPv6 PreferDualStack 10.96.0.17,fd00:96::11"
        );
        // Back to one family: policy, families and addresses trimmed together.
        let err = apply(&r, "{ipFamilyPolicy: SingleStack, ports: [{port: 80}]}").unwrap_err();
        assert!(err.contains("spec.ipFamilyPolicy"), "{err}");
        let svc = apply(
            &r,
            "{ipFamilyPolicy: SingleStack, ipFamilies: [IPv4], clusterIPs: [10.96.0.17], ports: [{port: 80}]}",
        )
        .unwrap();
        assert_eq!(shape(&svc), "IPv4 SingleStack 10.96.0.17");
        let err = apply(&r, "{ipFamilies: [IPv6], ports: [{port: 80}]}").unwrap_err();
        assert!(
            err.contains("spec.ipFamilies[0]: the first family is immutable"),
            "{err}"
        );
        let err = apply(&r, "{clusterIP: 10.96.0.18, ports: [{port: 80}]}").unwrap_err();
        assert!(err.contains("spec.clusterIP: field is immutable"), "{err}");
    }
}
